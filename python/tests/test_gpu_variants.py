"""The scores' variants on the GPU: softcap, ALiBi slopes and attention sinks
against the fp64 reference (python/tests/reference.py, from their
definition), forward, gradients and the sinks' gradient, each variant made
to bind (a small cap on large scores, slopes of a quarter and less over
distances of up to a hundred keys, sink logits beside the rows' own), at
odd sizes, causal or not, grouped-query, with windows and block sparsity;
packed sequences and decoding steps with them; rows that see no key; the
operators under opcheck and torch.compile; and the argument errors. Each
figure must be within twice the error of the same computation done by
PyTorch in the input dtype (plus a small floor)."""
import pytest

from conftest import gpu_or_skip

pytestmark = pytest.mark.gpu
torch = gpu_or_skip()

import flashgen  # noqa: E402
import reference  # noqa: E402
from tensors import inputs, make_cache  # noqa: E402


def sink_logits(H, grad=True):
    """Sink logits from -1 to 6: beside rows whose scores are about N(0, 4),
    from a sink that barely counts to one that takes most of the weight."""
    return torch.linspace(-1.0, 6.0, H, device="cuda").requires_grad_(grad)


def make_variants(which, B, Hq, batch_slopes=False):
    """attention()'s keywords for the variants named in `which`."""
    out = {}
    if "softcap" in which:
        out["softcap"] = 3.0  # scores of about N(0, 4): tanh saturates
    if "alibi" in which:
        out["alibi_slopes"] = reference.alibi_slopes(Hq, B if batch_slopes else None)
    if "sinks" in which:
        out["sinks"] = sink_logits(Hq)
    return out


def error(a, ref):
    return reference.error(a, ref)


def check(name, got, ref64, lowp, floor):
    err, base = error(got, ref64), error(lowp, ref64)
    assert err <= 2 * base + floor, f"{name}: error {err:.3g}, PyTorch's in-dtype {base:.3g}"


def check_d_sinks(got, ref64, lowp, floor):
    """d_sinks sums over every row of a head: the floor grows with its size."""
    scale = max(1.0, ref64.abs().max().item())
    check("d_sinks", got, ref64, lowp, floor * scale)


CASES = [
    # B, Sq, Sk, Hq, Hk, D, causal, align, window, variants, slopes per batch
    (2, 77, 93, 4, 2, 64, True, "bottom-right", None, {"softcap"}, False),
    (2, 77, 93, 4, 4, 128, False, "bottom-right", None, {"alibi"}, True),
    (2, 93, 77, 6, 2, 96, True, "bottom-right", None, {"sinks"}, False),  # 16 rows see no key
    (1, 77, 93, 8, 1, 64, False, "top-left", None, {"softcap", "alibi", "sinks"}, False),
    (3, 93, 93, 4, 2, 128, True, "bottom-right", (17, 0), {"softcap", "alibi", "sinks"}, True),
    (2, 77, 93, 4, 2, 96, False, "bottom-right", (20, 9), {"alibi", "sinks"}, True),
    (1, 200, 333, 2, 2, 64, True, "top-left", None, {"softcap", "sinks"}, False),
    (1, 1, 1, 1, 1, 64, False, "bottom-right", None, {"softcap", "alibi", "sinks"}, False),
]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("B, Sq, Sk, Hq, Hk, D, causal, align, window, which, per_batch", CASES)
def test_forward_and_gradients(B, Sq, Sk, Hq, Hk, D, causal, align, window, which, per_batch,
                               dtype):
    q, k, v = inputs(B, Sq, Sk, Hq, Hk, D, dtype, scale=2.0 ** 0.5)
    d_out = torch.randn(B, Sq, Hq, D, device="cuda").to(dtype)
    var = make_variants(which, B, Hq, per_batch)
    opts = dict(causal=causal, align=align, window=window)
    out, lse = flashgen.attention(q, k, v, return_lse=True, **opts, **var)
    assert out.shape == (B, Sq, Hq, D) and out.dtype == dtype and not lse.requires_grad
    leaves = (q, k, v) + ((var["sinks"],) if "sinks" in var else ())
    got = torch.autograd.grad(out, leaves, d_out)
    ref, ref_lse = reference.attention(q, k, v, **opts, **var)
    lowp, _ = reference.attention(q, k, v, dtype=dtype, **opts, **var)
    floor = 1e-3 if dtype == torch.float16 else 8e-3
    check("out", out, ref, lowp, floor)
    rows = torch.isfinite(ref_lse)
    assert torch.equal(torch.isfinite(lse), rows)
    assert error(lse[rows], ref_lse[rows]) < 1e-3 * max(1.0, ref_lse[rows].abs().max().item())
    g_ref = torch.autograd.grad(ref, leaves, d_out.double())
    g_lowp = torch.autograd.grad(lowp, leaves, d_out)
    for name, a, r, lp in zip(("dq", "dk", "dv"), got, g_ref, g_lowp):
        assert torch.isfinite(a).all(), name
        check(name, a, r, lp, floor * 4)
    if "sinks" in var:
        assert got[3].shape == (Hq,) and got[3].dtype == torch.float32
        check_d_sinks(got[3], g_ref[3], g_lowp[3], floor * 4)


def test_each_variant_binds():
    """The cases' values change the output well beyond the errors allowed:
    a test that passed with a variant dropped would prove nothing."""
    B, S, H, D = 2, 93, 4, 64
    q, k, v = inputs(B, S, S, H, H, D, torch.float16, scale=2.0 ** 0.5, grad=False)
    plain, _ = reference.attention(q, k, v, causal=True)
    for which in ("softcap", "alibi", "sinks"):
        var = make_variants({which}, B, H)
        changed, _ = reference.attention(q, k, v, causal=True, **var)
        assert error(changed, plain) > 0.1, which
        got = flashgen.attention(q, k, v, causal=True, **{n: (t.detach() if n == "sinks" else t)
                                                          for n, t in var.items()})
        assert error(got, changed) < 1e-2 < error(got, plain), which


@pytest.mark.parametrize("kind", ["layout", "butterfly"])
def test_with_block_sparsity(kind):
    dtype, B, S, H, D, bq, bk = torch.bfloat16, 2, 333, 4, 64, 64, 64
    n = -(-S // bq)
    if kind == "layout":
        g = torch.Generator().manual_seed(5)
        blocks = (torch.rand(H, n, n, generator=g) < 0.5).to(torch.uint8)
        blocks[:, :, 0] = 1
        sparsity = flashgen.BlockLayout(blocks, block_size=(bq, bk))
    else:
        sparsity = flashgen.Butterfly(2, block_size=(bq, bk))
        x = torch.arange(n)[:, None] ^ torch.arange(n)[None, :]
        blocks = ((x == 0) | (x == 1) | (x == 2))[None]
    q, k, v = inputs(B, S, S, H, H, D, dtype, scale=2.0 ** 0.5)
    var = make_variants({"softcap", "alibi", "sinks"}, B, H)
    out = flashgen.attention(q, k, v, causal=True, sparsity=sparsity, **var)
    d_out = torch.randn_like(out)
    leaves = (q, k, v, var["sinks"])
    got = torch.autograd.grad(out, leaves, d_out)
    opts = dict(causal=True, blocks=blocks, block_size=(bq, bk), **var)
    ref, _ = reference.attention(q, k, v, **opts)
    lowp, _ = reference.attention(q, k, v, dtype=dtype, **opts)
    check("out", out, ref, lowp, 8e-3)
    g_ref = torch.autograd.grad(ref, leaves, d_out.double())
    g_lowp = torch.autograd.grad(lowp, leaves, d_out)
    for name, a, r, lp in zip(("dq", "dk", "dv"), got, g_ref, g_lowp):
        check(name, a, r, lp, 3e-2)
    check_d_sinks(got[3], g_ref[3], g_lowp[3], 3e-2)


def test_no_keys_give_the_sink_alone():
    q, k, v = inputs(2, 5, 0, 4, 2, 64, torch.float16)
    sinks = sink_logits(4)
    out, lse = flashgen.attention(q, k, v, sinks=sinks, softcap=5.0, return_lse=True)
    assert torch.all(out == 0)
    assert torch.equal(lse, sinks.detach().view(1, 4, 1).expand(2, 4, 5))
    dq, d_sinks = torch.autograd.grad(out.float().sum(), (q, sinks))
    assert torch.all(dq == 0) and torch.all(d_sinks == 0)


def test_sinks_gradient_alone_and_slopes_get_none():
    """sinks may be the only input that requires grad; alibi_slopes that
    require grad get none (as flash-attn's)."""
    q, k, v = inputs(2, 77, 93, 4, 2, 64, torch.bfloat16, grad=False)
    sinks = sink_logits(4)
    slopes = reference.alibi_slopes(4).requires_grad_()
    out = flashgen.attention(q, k, v, causal=True, sinks=sinks, alibi_slopes=slopes)
    assert out.requires_grad
    d_sinks, d_slopes = torch.autograd.grad(out.float().sum(), (sinks, slopes),
                                            allow_unused=True)
    assert d_sinks.shape == (4,) and torch.isfinite(d_sinks).all() and d_slopes is None
    opts = dict(causal=True, sinks=sinks, alibi_slopes=slopes.detach())
    ref, _ = reference.attention(q, k, v, **opts)
    lowp, _ = reference.attention(q, k, v, dtype=torch.bfloat16, **opts)
    (want,) = torch.autograd.grad(ref.sum(), (sinks,))
    (lowp_grad,) = torch.autograd.grad(lowp.float().sum(), (sinks,))
    check_d_sinks(d_sinks, want, lowp_grad, 3e-2)


def test_strided_and_expanded_variant_tensors():
    """Slopes of (B, Hq) with a zero batch stride (an expanded (Hq,)) and a
    strided view; sinks as a strided view: all as their contiguous copies."""
    q, k, v = inputs(2, 64, 80, 4, 4, 64, torch.float16, grad=False)
    slopes = reference.alibi_slopes(4)
    base = flashgen.attention(q, k, v, alibi_slopes=slopes)
    assert torch.equal(flashgen.attention(q, k, v, alibi_slopes=slopes.expand(2, 4)), base)
    wide = torch.zeros(2, 8, device="cuda")
    wide[:, ::2] = slopes
    assert torch.equal(flashgen.attention(q, k, v, alibi_slopes=wide[:, ::2]), base)
    sinks = torch.zeros(8, device="cuda")
    sinks[::2] = torch.tensor([0.0, 1.0, 2.0, 3.0], device="cuda")
    assert torch.equal(flashgen.attention(q, k, v, sinks=sinks[::2]),
                       flashgen.attention(q, k, v, sinks=sinks[::2].contiguous()))


def test_deterministic_sinks_gradient_is_bitwise_repeatable():
    q, k, v = inputs(2, 300, 500, 8, 2, 128, torch.bfloat16)
    d_out = torch.randn(2, 300, 8, 128, device="cuda").to(torch.bfloat16)
    sinks = sink_logits(8)
    runs = [torch.autograd.grad(flashgen.attention(q, k, v, causal=True, deterministic=True,
                                                   softcap=20.0, sinks=sinks), (q, k, v, sinks),
                                d_out) for _ in range(3)]
    for r in runs[1:]:
        assert all(torch.equal(a, b) for a, b in zip(runs[0], r))


def test_eager_path_and_operator_agree():
    q, k, v = inputs(2, 130, 130, 4, 2, 64, torch.float16)
    sinks = sink_logits(4)
    slopes = reference.alibi_slopes(4, 2)
    options = (1, 0, -1, -1, 0.0, 0.0, 0, 0, 0, 0, 0, True)  # causal, deterministic
    a, lse_a = flashgen._ops.attention(q, k, v, options, True, (4.0, slopes, sinks))
    b, lse_b, _ = torch.ops.flashgen.forward(q, k, v, *options, 4.0, slopes, sinks)
    assert torch.equal(a, b) and torch.equal(lse_a, lse_b)
    d_out = torch.randn_like(a)
    ga = torch.autograd.grad(a, (q, k, v, sinks), d_out)
    gb = torch.autograd.grad(b, (q, k, v, sinks), d_out)
    assert all(torch.equal(x, y) for x, y in zip(ga, gb))


def test_opcheck_with_variants():
    q, k, v = inputs(2, 70, 90, 4, 2, 64, torch.float16)
    sinks = sink_logits(4)
    slopes = reference.alibi_slopes(4, 2)
    args = (q, k, v, 1, 0, -1, -1, 0.0, 0.0, 0, 0, 0, 0, 0, False, 3.0, slopes, sinks)
    torch.library.opcheck(torch.ops.flashgen.forward.default, args)
    plain = tuple(t.detach() for t in (q, k, v))
    out, lse, rng = torch.ops.flashgen.forward(*plain, *args[3:15], 3.0, slopes, sinks.detach())
    d_out = torch.randn_like(out)
    back = (d_out, *plain, out, lse, rng) + args[3:15] + (3.0, slopes, sinks.detach())
    torch.library.opcheck(torch.ops.flashgen.backward.default, back)
    dq, dk, dv, d_sinks, d_aux = torch.ops.flashgen.backward(*back)
    assert d_sinks.shape == (4,) and d_aux == []  # no aux tensors: no gradients
    _, _, _, none, _ = torch.ops.flashgen.backward(*back[:19])  # without sinks: empty
    assert none.shape == (0,)


class Block(torch.nn.Module):
    """An attention layer with gpt-oss's sinks and Gemma 2's cap."""

    def __init__(self, dim=256, heads=4, kv_heads=2):
        super().__init__()
        self.heads, self.kv_heads, self.d = heads, kv_heads, dim // heads
        self.q = torch.nn.Linear(dim, dim)
        self.kv = torch.nn.Linear(dim, 2 * kv_heads * self.d)
        self.o = torch.nn.Linear(dim, dim)
        self.sinks = torch.nn.Parameter(torch.linspace(0.0, 4.0, heads))
        self.register_buffer("slopes", reference.alibi_slopes(heads))

    def forward(self, x):
        B, S, _ = x.shape
        q = self.q(x).view(B, S, self.heads, self.d) * 4
        k, v = self.kv(x).view(B, S, 2, self.kv_heads, self.d).unbind(2)
        a = flashgen.attention(q, k, v, causal=True, window=(31, 0), softcap=5.0,
                               alibi_slopes=self.slopes, sinks=self.sinks)
        return self.o(a.reshape(B, S, -1))


@pytest.mark.parametrize("dynamic", [False, True])
def test_torch_compile_fullgraph(dynamic):
    torch.manual_seed(0)
    model = Block().cuda()
    for layer in (model.q, model.kv, model.o):  # the sinks and slopes stay fp32
        layer.half()
    compiled = torch.compile(model, fullgraph=True, dynamic=dynamic)
    for S in (33, 80):
        x = torch.randn(2, S, 256, device="cuda", dtype=torch.float16, requires_grad=True)
        ref = model(x)
        g_ref = torch.autograd.grad(ref.float().pow(2).sum(), (x, model.sinks))
        out = compiled(x)
        g = torch.autograd.grad(out.float().pow(2).sum(), (x, model.sinks))
        assert torch.allclose(out, ref, atol=2e-3, rtol=0)
        assert torch.allclose(g[0], g_ref[0], atol=5e-2, rtol=1e-2)
        assert error(g[1], g_ref[1]) <= 1e-2 * max(1.0, g_ref[1].abs().max().item())


def test_errors_name_the_argument():
    q, k, v = inputs(2, 8, 8, 4, 2, 64, torch.float16, grad=False)
    with pytest.raises(ValueError, match="softcap: 0.0; must be finite and > 0"):
        flashgen.attention(q, k, v, softcap=0.0)
    with pytest.raises(TypeError, match="alibi_slopes: torch.float16"):
        flashgen.attention(q, k, v, alibi_slopes=torch.ones(4, device="cuda").half())
    with pytest.raises(ValueError, match="alibi_slopes: shape \\(2,\\)"):
        flashgen.attention(q, k, v, alibi_slopes=torch.ones(2, device="cuda"))
    with pytest.raises(ValueError, match="alibi_slopes: on cpu, but q is on cuda:0"):
        flashgen.attention(q, k, v, alibi_slopes=torch.ones(4))
    with pytest.raises(ValueError, match="sinks: shape \\(2, 4\\)"):
        flashgen.attention(q, k, v, sinks=torch.ones(2, 4, device="cuda"))
    with pytest.raises(TypeError, match="sinks: torch.bfloat16"):
        flashgen.attention(q, k, v, sinks=torch.ones(4, device="cuda", dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="alibi_slopes: shape \\(2, 4\\)"):  # batch 2 of 1
        flashgen.attention(q[:1], k[:1], v[:1], alibi_slopes=torch.ones(2, 4, device="cuda"))
    # bhsd: the heads are dimension 1
    with pytest.raises(ValueError, match="sinks: shape \\(8,\\); expected \\(4,\\)"):
        flashgen.attention(*(t.transpose(1, 2) for t in (q, k, v)), layout="bhsd",
                           sinks=torch.ones(8, device="cuda"))


# ---- packed sequences ------------------------------------------------------------

def cu(lengths):
    return torch.tensor([0] + lengths, device="cuda").cumsum(0).to(torch.int32)


def reference_packed(q, k, v, lens_q, lens_k, dtype, slopes=None, **opts):
    """Every sequence's own attention, packed (rows outside the sequences 0);
    slopes (batch, Hq) give sequence b row b."""
    outs, i, j = [], 0, 0
    for b, (nq, nk) in enumerate(zip(lens_q, lens_k)):
        extra = {}
        if slopes is not None:
            extra["alibi_slopes"] = slopes[b] if slopes.dim() == 2 else slopes
        out, _ = reference.attention(q[None, i:i + nq], k[None, j:j + nk], v[None, j:j + nk],
                                     dtype=dtype, **opts, **extra)
        outs.append(out[0])
        i, j = i + nq, j + nk
    rest = q.shape[0] - i
    outs.append(q.new_zeros((rest,) + q.shape[1:], dtype=outs[0].dtype))
    return torch.cat(outs)


VARLEN_CASES = [
    # lens_q, lens_k, Hq, Hk, D, dtype, causal, window, variants, slopes per sequence
    ([37, 0, 1, 77, 129], [37, 5, 1, 93, 200], 4, 2, 64, torch.float16, True, None,
     {"softcap", "sinks"}, False),
    ([1, 77, 93, 3], [150, 93, 77, 0], 4, 4, 128, torch.bfloat16, False, None,
     {"alibi", "sinks"}, True),
    ([93, 65, 17], [100, 65, 40], 6, 2, 96, torch.float16, True, (24, 0),
     {"softcap", "alibi", "sinks"}, True),
]


@pytest.mark.parametrize("lens_q, lens_k, Hq, Hk, D, dtype, causal, window, which, per_seq",
                         VARLEN_CASES)
def test_varlen_against_each_sequence(lens_q, lens_k, Hq, Hk, D, dtype, causal, window, which,
                                      per_seq):
    g = torch.Generator(device="cuda").manual_seed(2)
    tq, tk = sum(lens_q), sum(lens_k)
    make = lambda n, h: (torch.randn(n, h, D, device="cuda", generator=g) * 2 ** 0.5).to(dtype)
    q, k, v = (make(tq, Hq).requires_grad_(), make(tk, Hk).requires_grad_(),
               make(tk, Hk).requires_grad_())
    d_out = make(tq, Hq)
    var = make_variants(which, len(lens_q), Hq, per_seq)
    opts = dict(causal=causal, window=window)
    out, lse = flashgen.attention_varlen(q, k, v, cu(lens_q), cu(lens_k), max(lens_q),
                                         max(lens_k), return_lse=True, **opts, **var)
    assert out.shape == q.shape and lse.shape == (Hq, tq)
    leaves = (q, k, v) + ((var["sinks"],) if "sinks" in var else ())
    got = torch.autograd.grad(out, leaves, d_out)
    ref_opts = dict(opts, softcap=var.get("softcap"), sinks=var.get("sinks"))
    slopes = var.get("alibi_slopes")
    ref = reference_packed(q, k, v, lens_q, lens_k, torch.float64, slopes, **ref_opts)
    lowp = reference_packed(q, k, v, lens_q, lens_k, dtype, slopes, **ref_opts)
    floor = 1e-3 if dtype == torch.float16 else 8e-3
    check("out", out, ref, lowp, floor)
    g_ref = torch.autograd.grad(ref, leaves, d_out.double())
    g_lowp = torch.autograd.grad(lowp, leaves, d_out)
    for name, a, r, lp in zip(("dq", "dk", "dv"), got, g_ref, g_lowp):
        assert torch.isfinite(a).all(), name
        check(name, a, r, lp, 4 * floor)
    if "sinks" in var:
        check_d_sinks(got[3], g_ref[3], g_lowp[3], 4 * floor)


def test_varlen_opcheck_and_compile_with_sinks():
    q = torch.randn(30, 4, 64, device="cuda", dtype=torch.float16, requires_grad=True)
    k = torch.randn(45, 2, 64, device="cuda", dtype=torch.float16, requires_grad=True)
    v = torch.randn(45, 2, 64, device="cuda", dtype=torch.float16, requires_grad=True)
    sinks = sink_logits(4)
    slopes = reference.alibi_slopes(4, 2)
    cu_q = torch.tensor([0, 20, 30], dtype=torch.int32, device="cuda")
    cu_k = torch.tensor([0, 40, 45], dtype=torch.int32, device="cuda")
    args = (q, k, v, cu_q, cu_k, None, 20, 40, 1, 0, -1, -1, 0.0, 0.0, True, 3.0, slopes, sinks)
    torch.library.opcheck(torch.ops.flashgen.varlen_forward.default, args)

    def f(q, k, v, sinks):
        return flashgen.attention_varlen(q, k, v, cu_q, cu_k, 20, 40, causal=True,
                                         deterministic=True, softcap=3.0, alibi_slopes=slopes,
                                         sinks=sinks)
    eager = f(q, k, v, sinks)
    compiled = torch.compile(f, fullgraph=True)(q, k, v, sinks)
    assert torch.equal(eager, compiled)
    d = torch.randn_like(eager)
    ge = torch.autograd.grad(eager, (q, k, v, sinks), d)
    gc = torch.autograd.grad(compiled, (q, k, v, sinks), d)
    assert all(torch.equal(a, b) for a, b in zip(ge, gc))


def test_varlen_errors_name_the_argument():
    q = torch.randn(10, 4, 64, device="cuda", dtype=torch.float16)
    k = torch.randn(10, 2, 64, device="cuda", dtype=torch.float16)
    lens = cu([4, 6])
    with pytest.raises(ValueError, match="alibi_slopes: shape \\(3, 4\\); expected \\(4,\\) or "
                                         "\\(batch 2, 4\\)"):
        flashgen.attention_varlen(q, k, k, lens, lens, 6, 6,
                                  alibi_slopes=torch.ones(3, 4, device="cuda"))
    with pytest.raises(ValueError, match="sinks: shape \\(2,\\)"):
        flashgen.attention_varlen(q, k, k, lens, lens, 6, 6, sinks=torch.ones(2, device="cuda"))
    with pytest.raises(ValueError, match="softcap: -1.0"):
        flashgen.attention_varlen(q, k, k, lens, lens, 6, 6, softcap=-1.0)


# ---- decoding steps over a KV cache ----------------------------------------------

KV_CASES = [
    # page_size (0: contiguous), B, Sq, Hq, Hk, D, dtype, causal, window, lengths, new, variants
    (16, 3, 1, 8, 2, 128, torch.bfloat16, False, None, [300, 1, 700], 0,
     {"softcap", "alibi", "sinks"}),
    (3, 2, 4, 8, 2, 64, torch.float16, True, None, [77, 93], 2, {"sinks"}),
    (0, 2, 2, 4, 4, 128, torch.float16, True, (40, 0), [200, 0], 1, {"softcap", "alibi"}),
    (64, 2, 3, 16, 8, 64, torch.bfloat16, True, None, [500, 129], 0, {"alibi", "sinks"}),
]


@pytest.mark.parametrize("page_size, B, Sq, Hq, Hk, D, dtype, causal, window, lengths, new, "
                         "which", KV_CASES)
def test_kvcache_against_each_sequence(page_size, B, Sq, Hq, Hk, D, dtype, causal, window,
                                       lengths, new, which):
    g = torch.Generator(device="cpu").manual_seed(4)
    S = max(lengths) + new + 5
    q = (torch.randn(B, Sq, Hq, D, generator=g) * 2 ** 0.5).to(dtype).cuda()
    k_full = (torch.randn(B, S, Hk, D, generator=g) * 2 ** 0.5).to(dtype).cuda()
    v_full = torch.randn(B, S, Hk, D, generator=g).to(dtype).cuda()
    cached = torch.tensor(lengths, dtype=torch.int32, device="cuda")
    if page_size:
        k_cache, v_cache, table = make_cache(k_full, v_full, lengths, new, page_size, g)
    else:
        table = None
        held = torch.arange(S, device="cuda")[None, :, None, None] < cached.view(-1, 1, 1, 1)
        k_cache = torch.where(held, k_full, float("nan")).to(dtype)
        v_cache = torch.where(held, v_full, float("nan")).to(dtype)
    k_new = torch.stack([k_full[b, n:n + new] for b, n in enumerate(lengths)]) if new else None
    v_new = torch.stack([v_full[b, n:n + new] for b, n in enumerate(lengths)]) if new else None
    var = make_variants(which, B, Hq, batch_slopes=True)
    if "sinks" in var:
        var["sinks"] = var["sinks"].detach()
    outs = []
    for splits in (1, 3, 0):
        out, lse = flashgen.attention_with_kvcache(
            q, k_cache, v_cache, k_new, v_new, cache_seqlens=cached, block_table=table,
            causal=causal, window=window, num_splits=splits, return_lse=True, **var)
        outs.append(out)
        for b, n in enumerate(lengths):
            keys = n + new
            ref_var = dict(var)
            if "alibi_slopes" in var:
                ref_var["alibi_slopes"] = var["alibi_slopes"][b]
            kw = dict(causal=causal, window=window, **ref_var)
            ref, ref_lse = reference.attention(q[b:b + 1], k_full[b:b + 1, :keys],
                                               v_full[b:b + 1, :keys], **kw)
            lowp, _ = reference.attention(q[b:b + 1], k_full[b:b + 1, :keys],
                                          v_full[b:b + 1, :keys], dtype=dtype, **kw)
            floor = 1e-3 if dtype == torch.float16 else 8e-3
            err = error(out[b:b + 1], ref)
            assert err <= 2 * error(lowp, ref) + floor, f"splits {splits} seq {b}: {err}"
            finite = torch.isfinite(ref_lse)
            assert torch.equal(torch.isfinite(lse[b:b + 1]), finite)
            if finite.any():
                assert error(lse[b:b + 1][finite], ref_lse[finite]) <= \
                    1e-3 * max(1.0, ref_lse[finite].abs().max().item())
    assert error(outs[1], outs[0]) <= 1e-2 and error(outs[2], outs[0]) <= 1e-2


def test_kvcache_opcheck_and_compile_with_variants():
    q = torch.randn(2, 1, 8, 64, device="cuda", dtype=torch.float16)
    k_cache = torch.randn(2, 100, 2, 64, device="cuda", dtype=torch.float16)
    v_cache = torch.randn_like(k_cache)
    k_new = torch.randn(2, 1, 2, 64, device="cuda", dtype=torch.float16)
    v_new = torch.randn_like(k_new)
    lengths = torch.tensor([50, 90], dtype=torch.int32, device="cuda")
    sinks = sink_logits(8, grad=False)
    slopes = reference.alibi_slopes(8)
    args = (q, k_cache, v_cache, k_new, v_new, lengths, None, 1, 0, -1, -1, 0.0, 0, 4.0, slopes,
            sinks)
    torch.library.opcheck(torch.ops.flashgen.kvcache_forward.default, args)

    def step(q, k_cache, v_cache, k_new, v_new, lengths):
        return flashgen.attention_with_kvcache(q, k_cache, v_cache, k_new, v_new,
                                               cache_seqlens=lengths, causal=True, softcap=4.0,
                                               alibi_slopes=slopes, sinks=sinks)
    eager = step(q, k_cache, v_cache, k_new, v_new, lengths)
    compiled = torch.compile(step, fullgraph=True)(q, k_cache, v_cache, k_new, v_new, lengths)
    assert torch.equal(eager, compiled)


def test_kvcache_errors_name_the_argument():
    q = torch.randn(2, 1, 8, 64, device="cuda", dtype=torch.float16)
    cache = torch.randn(2, 16, 2, 64, device="cuda", dtype=torch.float16)
    with pytest.raises(ValueError, match="sinks: shape \\(2,\\); expected \\(8,\\)"):
        flashgen.attention_with_kvcache(q, cache, cache, sinks=torch.ones(2, device="cuda"))
    with pytest.raises(TypeError, match="alibi_slopes: torch.float16"):
        flashgen.attention_with_kvcache(q, cache, cache,
                                        alibi_slopes=torch.ones(8, device="cuda").half())
    with pytest.raises(ValueError, match="softcap: nan"):
        flashgen.attention_with_kvcache(q, cache, cache, softcap=float("nan"))

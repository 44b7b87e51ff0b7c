"""Score and mask modifiers on the GPU: expression strings with aux tensors
and traced Python functions against an fp64 reference computed with the
same modifiers on whole score matrices (forward, lse, gradients, the aux
tensors' gradients against autograd's), flashgen.flex_attention against
PyTorch's flex_attention on the same score_mod and block mask, packed
sequences and decoding steps with modifiers, torch.compile and opcheck,
and the errors. Each figure must be within twice the error of the same
computation done by PyTorch in the input dtype (plus a small floor)."""
import pytest

from conftest import gpu_or_skip

pytestmark = pytest.mark.gpu
torch = gpu_or_skip()

import flashgen  # noqa: E402
import reference  # noqa: E402
from reference import modified_attention as ref_attention  # noqa: E402
from tensors import inputs  # noqa: E402


def error(a, ref):
    return reference.error(a, ref)


def check(name, got, ref64, lowp, floor):
    err, base = error(got, ref64), error(lowp, ref64)
    assert err <= 2 * base + floor, f"{name}: error {err:.3g}, PyTorch's in-dtype {base:.3g}"


def check_lse(lse, ref_lse):
    rows = torch.isfinite(ref_lse)
    assert torch.equal(torch.isfinite(lse), rows)
    if rows.any():
        assert error(lse[rows], ref_lse[rows]) < 1e-3 * max(1.0, ref_lse[rows].abs().max().item())


def floor_of(dtype):
    return 1e-3 if dtype == torch.float16 else 8e-3


# ---- expression strings with aux tensors ---------------------------------------------

REL_CASES = [
    # B, Sq, Sk, Hq, Hk, D, causal
    (2, 77, 93, 4, 2, 64, False),
    (1, 130, 130, 8, 1, 128, True),
    (2, 93, 77, 6, 2, 96, True),
    (1, 1, 200, 2, 2, 64, False),
]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("B, Sq, Sk, Hq, Hk, D, causal", REL_CASES)
def test_relative_bias_forward_and_gradients(B, Sq, Sk, Hq, Hk, D, causal, dtype):
    """s + bias[h, q - k + seqlen_k - 1]: out, lse, dq, dk, dv and the bias's
    gradient against autograd's."""
    q, k, v = inputs(B, Sq, Sk, Hq, Hk, D, dtype, scale=2.0 ** 0.5)
    g = torch.Generator(device="cuda").manual_seed(1)
    bias = (torch.randn(Hq, Sq + Sk - 1, device="cuda", generator=g) * 2).requires_grad_()
    d_out = torch.randn(B, Sq, Hq, D, device="cuda", generator=g).to(dtype)
    out, lse = flashgen.attention(q, k, v, causal=causal, align="top-left", return_lse=True,
                                  score_mod="s + bias[h, q - k + seqlen_k - 1]",
                                  aux={"bias": bias})
    got = torch.autograd.grad(out, (q, k, v, bias), d_out)

    def score_fn(s, b, h, i, j):
        return s + bias[h, i - j + Sk - 1]

    ref, ref_lse = ref_attention(q, k, v, score_fn, causal=causal)
    lowp, _ = ref_attention(q, k, v, score_fn, causal=causal, dtype=dtype)
    floor = floor_of(dtype)
    check("out", out, ref, lowp, floor)
    check_lse(lse, ref_lse)
    want = torch.autograd.grad(ref, (q, k, v, bias), d_out.double())
    lowp_grads = torch.autograd.grad(lowp, (q, k, v, bias), d_out)
    for name, a, r, lp in zip(("dq", "dk", "dv"), got, want, lowp_grads):
        assert torch.isfinite(a).all(), name
        check(name, a, r, lp, 4 * floor)
    assert got[3].shape == bias.shape and got[3].dtype == torch.float32
    scale = max(1.0, want[3].abs().max().item())
    check("d_bias", got[3], want[3], lowp_grads[3], 4 * floor * scale)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_document_mask_with_a_batch_of_documents(dtype):
    """doc[b, q] == doc[b, k] (an int32 aux tensor) with causal: each
    document its own causal attention."""
    B, S, Hq, Hk, D = 2, 200, 4, 2, 64
    q, k, v = inputs(B, S, S, Hq, Hk, D, dtype, scale=2.0 ** 0.5)
    doc = torch.stack([torch.arange(S) // 37, torch.arange(S) // 90]).int().cuda()
    out, lse = flashgen.attention(q, k, v, causal=True, return_lse=True,
                                  mask_mod="doc[b, q] == doc[b, k]", aux={"doc": doc})
    d_out = torch.randn_like(out)
    got = torch.autograd.grad(out, (q, k, v), d_out)

    def mask_fn(b, h, i, j):
        return doc[b, i] == doc[b, j]

    ref, ref_lse = ref_attention(q, k, v, mask_fn=mask_fn, causal=True)
    lowp, _ = ref_attention(q, k, v, mask_fn=mask_fn, causal=True, dtype=dtype)
    check("out", out, ref, lowp, floor_of(dtype))
    check_lse(lse, ref_lse)
    want = torch.autograd.grad(ref, (q, k, v), d_out.double())
    lowp_grads = torch.autograd.grad(lowp, (q, k, v), d_out)
    for name, a, r, lp in zip(("dq", "dk", "dv"), got, want, lowp_grads):
        check(name, a, r, lp, 4 * floor_of(dtype))
    # each document alone is plain causal attention
    for b, lo, hi in ((0, 37, 74), (1, 90, 180)):
        alone = flashgen.attention(q[b:b + 1, lo:hi], k[b:b + 1, lo:hi], v[b:b + 1, lo:hi],
                                   causal=True)
        assert error(out[b:b + 1, lo:hi], alone) < (2e-3 if dtype == torch.float16 else 2e-2)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_block_mask_gives_the_predicates_attention(dtype):
    """create_block_mask's blocks (skipped where empty, untested where full)
    change nothing: the same out, lse and gradients as the predicate tested
    everywhere, against the fp64 reference; one block mask serves two
    "layers"; a traced function builds the same block mask as its string."""
    B, S, Hq, Hk, D = 2, 1000, 4, 2, 64
    g = torch.Generator().manual_seed(5)
    doc = torch.stack([torch.randint(0, 6, (S,), generator=g).sort().values,
                       torch.arange(S) // 300]).int().cuda()
    text = "doc[b, q] == doc[b, k]"
    bm = flashgen.create_block_mask(text, B, None, S, S, aux={"doc": doc})
    assert isinstance(bm, flashgen.BlockMask) and bm.mask_mod == text

    def mask_fn(b, h, i, j):
        return doc[b, i] == doc[b, j]

    for layer in range(2):
        q, k, v = inputs(B, S, S, Hq, Hk, D, dtype, scale=2.0 ** 0.5, seed=layer)
        out, lse = flashgen.attention(q, k, v, causal=True, sparsity=bm, return_lse=True)
        dense, dense_lse = flashgen.attention(q, k, v, causal=True, mask_mod=text,
                                              aux={"doc": doc}, return_lse=True)
        ref, ref_lse = ref_attention(q, k, v, mask_fn=mask_fn, causal=True)
        lowp, _ = ref_attention(q, k, v, mask_fn=mask_fn, causal=True, dtype=dtype)
        check("out", out, ref, lowp, floor_of(dtype))
        check_lse(lse, ref_lse)
        assert error(out, dense) <= error(lowp, ref) + floor_of(dtype)
        d_out = torch.randn_like(out)
        got = torch.autograd.grad(out, (q, k, v), d_out)
        want = torch.autograd.grad(ref, (q, k, v), d_out.double())
        lowp_grads = torch.autograd.grad(lowp, (q, k, v), d_out)
        for name, a, r, lp in zip(("dq", "dk", "dv"), got, want, lowp_grads):
            check(name, a, r, lp, 4 * floor_of(dtype))
    traced = flashgen.create_block_mask(mask_fn, B, None, S, S)
    out2 = flashgen.attention(q, k, v, causal=True, sparsity=traced)
    assert error(out2, flashgen.attention(q, k, v, causal=True, sparsity=bm)) < 1e-6


def test_block_mask_refuses_other_calls():
    """A block mask serves its predicate, lengths, batch (where it reads b)
    and device only."""
    B, S, H, D = 2, 300, 2, 64
    q, k, v = inputs(B, S, S, H, H, D, torch.float16)
    doc = (torch.arange(2 * S, device="cuda") // 100).int().view(2, S)
    bm = flashgen.create_block_mask("doc[b, q] == doc[b, k]", None, None, S, S,
                                    aux={"doc": doc})
    with pytest.raises(ValueError, match="reads b"):
        flashgen.attention(q, k, v, sparsity=bm)
    bm = flashgen.create_block_mask("doc[b, q] == doc[b, k]", B, H, S, S, aux={"doc": doc})
    with pytest.raises(ValueError, match="block mask built for"):
        flashgen.attention(q, k, v, sparsity=bm, mask_mod="doc[b, q] != doc[b, k]",
                           aux={"doc": doc})
    with pytest.raises(ValueError, match="shape"):
        flashgen.attention(q[:, :200], k[:, :200], v[:, :200], sparsity=bm)
    with pytest.raises(ValueError, match="another tensor"):
        flashgen.attention(q, k, v, sparsity=bm, aux={"doc": doc.clone()})
    with pytest.raises(ValueError, match="multiples of 16"):
        flashgen.create_block_mask("k <= q", 1, 1, S, S, BLOCK_SIZE=100)
    with pytest.raises(ValueError, match="unknown name"):
        flashgen.create_block_mask("nope[q] == 1", 1, 1, S, S)


def test_traced_functions_equal_their_strings():
    """A function and the string it translates into run the same kernel:
    bitwise equal outputs and gradients."""
    B, S, H, D = 2, 100, 4, 64
    q, k, v = inputs(B, S, S, H, H, D, torch.bfloat16)
    bias = torch.randn(H, 2 * S - 1, device="cuda", requires_grad=True)
    doc = (torch.arange(S, device="cuda") // 30).int()
    cap = 20.0

    def score_mod(score, b, h, q_idx, kv_idx):
        return cap * torch.tanh((score + bias[h, q_idx - kv_idx + S - 1]) / cap)

    def mask_mod(b, h, q_idx, kv_idx):
        return (doc[q_idx] == doc[kv_idx]) | (kv_idx < 4)

    a = flashgen.attention(q, k, v, score_mod=score_mod, mask_mod=mask_mod)
    tr = flashgen.translate(score_mod=score_mod, mask_mod=mask_mod)
    assert tr.score_mod == "20.0 * tanh((s + t0[h, q - k + 100 - 1]) / 20.0)"
    assert tr.mask_mod == "t1[q] == t1[k] || k < 4"
    b = flashgen.attention(q, k, v, score_mod=tr.score_mod, mask_mod=tr.mask_mod, aux=tr.aux)
    c = flashgen.attention(q, k, v, score_mod="20. * tanh((s+bias[h,q-k+100-1])/20.)",
                           mask_mod="doc[q]==doc[k]||k<4", aux={"bias": bias, "doc": doc})
    assert torch.equal(a, b) and torch.equal(a, c)
    d_out = torch.randn_like(a)
    ga = torch.autograd.grad(a, (q, k, v, bias), d_out)
    gb = torch.autograd.grad(b, (q, k, v, bias), d_out)
    assert all(torch.equal(x, y) for x, y in zip(ga[:3], gb[:3]))
    assert error(ga[3], gb[3]) < 1e-3  # atomics: the last bits may differ


def test_captured_scalar_parameter_gets_its_gradient():
    """A learnable temperature (a 0-D parameter) read by a traced score
    modifier, and ALiBi written in one, against the reference."""
    B, S, H, D = 2, 90, 4, 64
    q, k, v = inputs(B, S, S, H, H, D, torch.float16)
    temperature = torch.tensor(0.7, device="cuda", requires_grad=True)
    slopes = reference.alibi_slopes(H).requires_grad_()

    def score_mod(score, b, h, q_idx, kv_idx):
        return score / temperature - slopes[h] * (q_idx - kv_idx).abs()

    out = flashgen.attention(q, k, v, score_mod=score_mod)
    d_out = torch.randn_like(out)
    got = torch.autograd.grad(out, (q, temperature, slopes), d_out)
    ref, _ = ref_attention(q, k, v, score_mod)
    lowp, _ = ref_attention(q, k, v, score_mod, dtype=torch.float16)
    check("out", out, ref, lowp, 1e-3)
    want = torch.autograd.grad(ref, (q, temperature, slopes), d_out.double())
    lowp_grads = torch.autograd.grad(lowp, (q, temperature, slopes), d_out)
    for name, a, r, lp in zip(("dq", "d_temperature", "d_slopes"), got, want, lowp_grads):
        assert a.shape == r.shape, name
        check(name, a, r, lp, 4e-3 * max(1.0, r.abs().max().item()))


def test_strided_broadcast_and_empty_aux_tensors():
    """Aux tensors read through their strides: a transposed view, a stride-0
    broadcast, an empty one (every read outside: 0)."""
    B, S, H, D = 1, 64, 4, 64
    q, k, v = inputs(B, S, S, H, H, D, torch.float16, grad=False)
    bias = torch.randn(2 * S - 1, H, device="cuda")
    base = flashgen.attention(q, k, v, score_mod="s + bias[h, q - k + 63]",
                              aux={"bias": bias.t().contiguous()})
    assert torch.equal(flashgen.attention(q, k, v, score_mod="s + bias[h, q - k + 63]",
                                          aux={"bias": bias.t()}), base)
    row = torch.randn(S, device="cuda")
    wide = flashgen.attention(q, k, v, score_mod="s + row[h, k]",
                              aux={"row": row.expand(H, S)})
    assert torch.equal(wide, flashgen.attention(q, k, v, score_mod="s + row[h, k]",
                                                aux={"row": row.expand(H, S).contiguous()}))
    none = flashgen.attention(q, k, v, score_mod="s + e[q]",
                              aux={"e": torch.empty(0, device="cuda")})
    assert torch.equal(none, flashgen.attention(q, k, v))


def test_minus_infinity_hides_keys_like_a_mask():
    q, k, v = inputs(2, 80, 80, 4, 4, 64, torch.float16, grad=False)
    a, lse_a = flashgen.attention(q, k, v, score_mod="where(k > q, -inf, s)", return_lse=True)
    b, lse_b = flashgen.attention(q, k, v, causal=True, align="top-left", return_lse=True)
    assert error(a, b) < 1e-3 and error(lse_a, lse_b) < 1e-4


# ---- flex_attention ----------------------------------------------------------------------

def flex():
    return pytest.importorskip("torch.nn.attention.flex_attention")


FLEX_CASES = [
    # B, Hq, Hkv, S, D, dtype, score, mask
    (2, 4, 4, 256, 64, torch.float16, "relative", "causal_doc"),
    (1, 8, 2, 200, 128, torch.bfloat16, "softcap", "sliding"),
    (2, 4, 2, 128, 64, torch.float16, "alibi", None),
    (1, 2, 2, 96, 64, torch.float16, None, "strict"),  # row 0 sees no key
]


def flex_mods(kind_score, kind_mask, H, S):
    bias = (torch.randn(H, 2 * S - 1, device="cuda") * 0.5).requires_grad_()
    doc = (torch.arange(S, device="cuda") // 70).int()
    slopes = reference.alibi_slopes(H)
    scores = {
        "relative": lambda score, b, h, q_idx, kv_idx: score + bias[h, q_idx - kv_idx + S - 1],
        "softcap": lambda score, b, h, q_idx, kv_idx: 5.0 * torch.tanh(score / 5.0),
        "alibi": lambda score, b, h, q_idx, kv_idx: score - slopes[h] * (q_idx - kv_idx).abs(),
        None: None,
    }
    masks = {
        "causal_doc": lambda b, h, q_idx, kv_idx: (q_idx >= kv_idx) & (doc[q_idx] == doc[kv_idx]),
        "sliding": lambda b, h, q_idx, kv_idx: (q_idx >= kv_idx) & (q_idx - kv_idx < 48),
        "strict": lambda b, h, q_idx, kv_idx: q_idx > kv_idx,
        None: None,
    }
    return scores[kind_score], masks[kind_mask], bias


@pytest.mark.parametrize("B, Hq, Hkv, S, D, dtype, score, mask", FLEX_CASES)
def test_flex_attention_against_torchs(B, Hq, Hkv, S, D, dtype, score, mask):
    fa = flex()
    g = torch.Generator(device="cuda").manual_seed(3)
    make = lambda H: torch.randn(B, H, S, D, device="cuda", generator=g).to(dtype)
    q, k, v = make(Hq).requires_grad_(), make(Hkv).requires_grad_(), make(Hkv).requires_grad_()
    score_mod, mask_mod, bias = flex_mods(score, mask, Hq, S)
    block_mask = fa.create_block_mask(mask_mod, None, None, S, S, device="cuda") \
        if mask_mod is not None else None
    gqa = Hq != Hkv
    out, lse = flashgen.flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask,
                                       enable_gqa=gqa, return_aux=fa.AuxRequest(lse=True))
    lse = lse.lse
    theirs, their_aux = fa.flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask,
                                          enable_gqa=gqa, return_aux=fa.AuxRequest(lse=True))
    assert out.shape == theirs.shape == (B, Hq, S, D) and lse.shape == (B, Hq, S)
    bshd = lambda t: t.transpose(1, 2)
    ref, ref_lse = ref_attention(bshd(q), bshd(k), bshd(v), score_mod, mask_mod)
    floor = floor_of(dtype)
    # as close to the fp64 reference as PyTorch's flex_attention, and to it
    assert error(bshd(out), ref) <= 2 * error(bshd(theirs), ref) + floor
    assert error(out, theirs) <= 2 * error(bshd(theirs), ref) + floor
    check_lse(lse, ref_lse)
    rows = torch.isfinite(ref_lse)
    assert torch.equal(torch.isfinite(their_aux.lse), rows)
    assert error(lse[rows], their_aux.lse[rows]) < 1e-2
    leaves = (q, k, v) + ((bias,) if score == "relative" else ())
    d_out = torch.randn_like(out)
    got = torch.autograd.grad(out, leaves, d_out)
    their_grads = torch.autograd.grad(theirs, leaves, d_out)
    want = torch.autograd.grad(ref, leaves, bshd(d_out).double())
    for name, a, t, r in zip(("dq", "dk", "dv", "d_bias"), got, their_grads, want):
        scale = max(1.0, r.abs().max().item())
        assert error(a, r) <= 2 * error(t, r) + 4 * floor * scale, name


def test_flex_attention_return_lse_and_defaults():
    fa = flex()
    q, k, v = (torch.randn(1, 2, 64, 64, device="cuda", dtype=torch.float16) for _ in range(3))
    out = flashgen.flex_attention(q, k, v)
    assert torch.allclose(out, torch.nn.functional.scaled_dot_product_attention(q, k, v),
                          atol=2e-3, rtol=0)
    out2, lse = flashgen.flex_attention(q, k, v, scale=0.3, return_lse=True)
    ref, ref_lse = ref_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                 scale=0.3)
    assert error(out2.transpose(1, 2), ref) < 2e-3
    check_lse(lse, ref_lse)
    with pytest.raises(ValueError, match="max_scores"):
        flashgen.flex_attention(q, k, v, return_aux=fa.AuxRequest(max_scores=True))
    with pytest.raises(ValueError, match="both return_lse and return_aux"):
        flashgen.flex_attention(q, k, v, return_lse=True, return_aux=fa.AuxRequest(lse=True))
    with pytest.raises(ValueError, match="enable_gqa=True"):
        flashgen.flex_attention(q, k[:, :1], v[:, :1])
    block_mask = fa.create_block_mask(lambda b, h, q_idx, kv_idx: q_idx >= kv_idx, None, None,
                                      128, 128, device="cuda")
    with pytest.raises(ValueError, match="block_mask: made for seq_lengths \\(128, 128\\)"):
        flashgen.flex_attention(q, k, v, block_mask=block_mask)


# ---- packed sequences and decoding steps ----------------------------------------------------

def cu(lengths):
    return torch.tensor([0] + lengths, device="cuda").cumsum(0).to(torch.int32)


def test_varlen_with_modifiers_against_each_sequence():
    """b is the sequence and q, k count from its first row: a per-sequence
    shift and a sliding window (a mask), each sequence against its own
    reference."""
    lens_q, lens_k = [37, 0, 77, 129], [37, 5, 93, 200]
    Hq, Hk, D, dtype = 4, 2, 64, torch.float16
    g = torch.Generator(device="cuda").manual_seed(5)
    make = lambda n, h: torch.randn(n, h, D, device="cuda", generator=g).to(dtype)
    q, k, v = (make(sum(lens_q), Hq).requires_grad_(), make(sum(lens_k), Hk).requires_grad_(),
               make(sum(lens_k), Hk).requires_grad_())
    shift = torch.tensor([0.5, -1.0, 2.0, 0.0], device="cuda", requires_grad=True)
    window = 24

    def mask_mod(b, h, q_idx, kv_idx):
        return (q_idx - kv_idx < window) & (kv_idx - q_idx < window)

    out = flashgen.attention_varlen(q, k, v, cu(lens_q), cu(lens_k), max(lens_q), max(lens_k),
                                    score_mod="s * (1.0 + shift[b])", mask_mod=mask_mod,
                                    aux={"shift": shift})
    d_out = torch.randn_like(out)
    got = torch.autograd.grad(out, (q, k, v, shift), d_out)
    refs, lowps, i, j = [], [], 0, 0
    for b, (nq, nk) in enumerate(zip(lens_q, lens_k)):
        score_fn = lambda s, _b, h, qi, ki, b=b: s * (1.0 + shift[b])
        args = (q[None, i:i + nq], k[None, j:j + nk], v[None, j:j + nk], score_fn, mask_mod)
        refs.append(ref_attention(*args)[0][0])
        lowps.append(ref_attention(*args, dtype=dtype)[0][0])
        i, j = i + nq, j + nk
    ref, lowp = torch.cat(refs), torch.cat(lowps)
    check("out", out, ref, lowp, 1e-3)
    want = torch.autograd.grad(ref, (q, k, v, shift), d_out.double())
    lowp_grads = torch.autograd.grad(lowp, (q, k, v, shift), d_out)
    for name, a, r, lp in zip(("dq", "dk", "dv", "d_shift"), got, want, lowp_grads):
        check(name, a, r, lp, 4e-3 * max(1.0, r.abs().max().item()))


def test_kvcache_with_a_mask_against_each_sequence():
    """A decoding step whose mask uses the sequence's lengths: bottom-right
    causal within a window, and a per-head bias, against each sequence's
    reference."""
    B, Sq, Hq, Hk, D, dtype = 3, 2, 8, 2, 128, torch.bfloat16
    lengths, new = [300, 1, 90], 2
    g = torch.Generator(device="cpu").manual_seed(6)
    S = max(lengths) + new + 5
    q = torch.randn(B, Sq, Hq, D, generator=g).to(dtype).cuda()
    k_full = torch.randn(B, S, Hk, D, generator=g).to(dtype).cuda()
    v_full = torch.randn(B, S, Hk, D, generator=g).to(dtype).cuda()
    cached = torch.tensor(lengths, dtype=torch.int32, device="cuda")
    k_cache, v_cache = k_full.clone(), v_full.clone()
    k_new = torch.stack([k_full[b, n:n + new] for b, n in enumerate(lengths)])
    v_new = torch.stack([v_full[b, n:n + new] for b, n in enumerate(lengths)])
    head_bias = torch.linspace(-1.0, 1.0, Hq, device="cuda")
    mask = "k <= q + seqlen_k - seqlen_q && q + seqlen_k - seqlen_q - k < 40"
    out = flashgen.attention_with_kvcache(q, k_cache, v_cache, k_new, v_new,
                                          cache_seqlens=cached, score_mod="s + hb[h]",
                                          mask_mod=mask, aux={"hb": head_bias})
    for b, n in enumerate(lengths):
        keys = n + new

        def mask_fn(_b, h, i, j, keys=keys):
            return (j <= i + keys - Sq) & (i + keys - Sq - j < 40)

        args = (q[b:b + 1], k_full[b:b + 1, :keys], v_full[b:b + 1, :keys],
                lambda s, _b, h, i, j: s + head_bias[h], mask_fn)
        ref, _ = ref_attention(*args)
        lowp, _ = ref_attention(*args, dtype=dtype)
        check(f"sequence {b}", out[b:b + 1], ref, lowp, 8e-3)


# ---- torch.compile, opcheck, the eager path --------------------------------------------------

class RelativeBlock(torch.nn.Module):
    """An attention layer with a learned relative bias, passed as a string
    and an aux tensor."""

    def __init__(self, dim=256, heads=4, span=128):
        super().__init__()
        self.heads, self.d, self.span = heads, dim // heads, span
        self.qkv = torch.nn.Linear(dim, 3 * dim)
        self.o = torch.nn.Linear(dim, dim)
        self.bias = torch.nn.Parameter(torch.randn(heads, 2 * span - 1) * 0.5)

    def forward(self, x):
        B, S, _ = x.shape
        q, k, v = self.qkv(x).view(B, S, 3, self.heads, self.d).unbind(2)
        a = flashgen.attention(q, k, v, causal=True, aux={"bias": self.bias},
                               score_mod=f"s + bias[h, q - k + {self.span - 1}]")
        return self.o(a.reshape(B, S, -1))


@pytest.mark.parametrize("dynamic", [False, True])
def test_torch_compile_fullgraph_with_expressions(dynamic):
    torch.manual_seed(0)
    model = RelativeBlock().cuda()
    for layer in (model.qkv, model.o):
        layer.half()
    compiled = torch.compile(model, fullgraph=True, dynamic=dynamic)
    for S in (33, 80):
        x = torch.randn(2, S, 256, device="cuda", dtype=torch.float16, requires_grad=True)
        ref = model(x)
        g_ref = torch.autograd.grad(ref.float().pow(2).sum(), (x, model.bias))
        out = compiled(x)
        g = torch.autograd.grad(out.float().pow(2).sum(), (x, model.bias))
        assert torch.allclose(out, ref, atol=2e-3, rtol=0)
        assert torch.allclose(g[0], g_ref[0], atol=5e-2, rtol=1e-2)
        assert error(g[1], g_ref[1]) <= 1e-2 * max(1.0, g_ref[1].abs().max().item())


def test_torch_compile_fullgraph_with_a_block_mask():
    """A block mask made outside the compiled function, used inside it as
    sparsity: one graph, the eager result, gradients through it."""
    B, S, H, D = 2, 300, 2, 64
    doc = (torch.arange(B * S, device="cuda") // 70 % 5).int().view(B, S)
    bm = flashgen.create_block_mask("doc[b, q] == doc[b, k]", B, None, S, S, aux={"doc": doc})

    def layer(q, k, v):
        return flashgen.attention(q, k, v, causal=True, sparsity=bm)

    compiled = torch.compile(layer, fullgraph=True)
    q, k, v = inputs(B, S, S, H, H, D, torch.float16)
    out = compiled(q, k, v)
    ref = layer(q, k, v)
    assert torch.equal(out, ref)
    d_out = torch.randn_like(out)
    got = torch.autograd.grad(out, (q, k, v), d_out)
    want = torch.autograd.grad(ref, (q, k, v), d_out)
    for a, b in zip(got, want):
        assert torch.allclose(a, b, atol=1e-3, rtol=0)


def test_torch_compile_with_a_traced_function():
    """A Python modifier under torch.compile is translated outside the graph
    (one graph break), with the same result as eager."""
    q, k, v = inputs(2, 70, 70, 4, 4, 64, torch.float16)
    bias = torch.randn(4, 139, device="cuda", requires_grad=True)

    def step(q, k, v, bias):
        def rel(score, b, h, q_idx, kv_idx):
            return score + bias[h, q_idx - kv_idx + 69]
        return flashgen.attention(q, k, v, score_mod=rel)

    eager = step(q, k, v, bias)
    compiled = torch.compile(step)(q, k, v, bias)
    assert torch.equal(eager, compiled)
    d = torch.randn_like(eager)
    ge = torch.autograd.grad(eager, (q, k, v, bias), d)
    gc = torch.autograd.grad(compiled, (q, k, v, bias), d)
    assert all(error(a, b) < 1e-3 for a, b in zip(ge, gc))


def test_opcheck_with_expressions():
    q, k, v = inputs(2, 70, 90, 4, 2, 64, torch.float16)
    bias = torch.randn(4, 159, device="cuda", requires_grad=True)
    doc = (torch.arange(90, device="cuda") // 30).int()
    exprs = ("s + bias[h, q - k + 89]", "doc[q % 90] == doc[k]", "bias,doc", [bias, doc])
    args = (q, k, v, 0, 0, -1, -1, 0.0, 0.0, 0, 0, 0, 0, 0, False, 0.0, None, None) + exprs
    torch.library.opcheck(torch.ops.flashgen.forward.default, args)
    plain = tuple(t.detach() for t in (q, k, v))
    out, lse, rng = torch.ops.flashgen.forward(*plain, *args[3:18], *exprs[:3],
                                               [bias.detach(), doc])
    d_out = torch.randn_like(out)
    back = (d_out, *plain, out, lse, rng) + args[3:18] + exprs[:3] + ([bias.detach(), doc], 1)
    torch.library.opcheck(torch.ops.flashgen.backward.default, back)
    *_, d_aux = torch.ops.flashgen.backward(*back)
    assert d_aux[0].shape == bias.shape and d_aux[1].shape == (0,)
    # packed sequences and decoding steps
    qp, kp = q[0].detach(), k[0].detach()
    cu_q = torch.tensor([0, 30, 70], dtype=torch.int32, device="cuda")
    cu_k = torch.tensor([0, 40, 90], dtype=torch.int32, device="cuda")
    args = (qp.requires_grad_(), kp.requires_grad_(), kp.clone().requires_grad_(), cu_q, cu_k,
            None, 40, 50, 1, 0, -1, -1, 0.0, 0.0, True, 0.0, None, None) + exprs
    torch.library.opcheck(torch.ops.flashgen.varlen_forward.default, args)
    cache = torch.randn(2, 100, 2, 64, device="cuda", dtype=torch.float16)
    lengths = torch.tensor([50, 90], dtype=torch.int32, device="cuda")
    args = (q[:, :1].detach(), cache, cache.clone(), None, None, lengths, None, 1, 0, -1, -1, 0.0,
            0, 0.0, None, None, "s + bias[h, k]", "k != 3", "bias", [bias.detach()])
    torch.library.opcheck(torch.ops.flashgen.kvcache_forward.default, args)


def test_eager_path_and_operator_agree_with_expressions():
    q, k, v = inputs(2, 130, 130, 4, 2, 64, torch.float16)
    bias = torch.randn(4, 259, device="cuda", requires_grad=True)
    options = (1, 0, -1, -1, 0.0, 0.0, 0, 0, 0, 0, 0, True)
    exprs = ("s + bias[h, q - k + 129]", "", "bias", [bias])
    a, lse_a = flashgen._ops.attention(q, k, v, options, True, None, exprs)
    b, lse_b, _ = torch.ops.flashgen.forward(q, k, v, *options, 0.0, None, None, *exprs)
    assert torch.equal(a, b) and torch.equal(lse_a, lse_b)
    d_out = torch.randn_like(a)
    ga = torch.autograd.grad(a, (q, k, v, bias), d_out)
    gb = torch.autograd.grad(b, (q, k, v, bias), d_out)
    assert all(torch.equal(x, y) for x, y in zip(ga[:3], gb[:3]))
    assert error(ga[3], gb[3]) < 1e-3


# ---- errors ------------------------------------------------------------------------------------

def test_errors_name_the_argument():
    q, k, v = inputs(2, 8, 8, 4, 2, 64, torch.float16, grad=False)
    bias = torch.randn(4, 15, device="cuda")
    with pytest.raises(ValueError, match="score_mod: column 15: unexpected character ';'"):
        flashgen.attention(q, k, v, score_mod="s + bias[h, q]; x", aux={"bias": bias})
    with pytest.raises(ValueError, match="score_mod: column 5: unknown name 'bias'"):
        flashgen.attention(q, k, v, score_mod="s + bias[h, q]")
    with pytest.raises(ValueError, match="score_mod: a score modifier replaces softcap"):
        flashgen.attention(q, k, v, score_mod="s", softcap=30.0)
    with pytest.raises(ValueError, match="aux\\['bias'\\]: on cpu, but q is on cuda:0"):
        flashgen.attention(q, k, v, score_mod="s + bias[h, q]", aux={"bias": bias.cpu()})
    with pytest.raises(TypeError, match="aux\\['bias'\\]: torch.float16"):
        flashgen.attention(q, k, v, score_mod="s + bias[h, q]", aux={"bias": bias.half()})
    with pytest.raises(ValueError, match="aux: bias given, but no score_mod or mask_mod"):
        flashgen.attention(q, k, v, aux={"bias": bias})
    doc = torch.zeros(8, dtype=torch.int64, device="cuda")
    with pytest.raises(ValueError, match="dtype torch.int64"):
        flashgen.attention(q, k, v, mask_mod=lambda b, h, q_idx, kv_idx: doc[q_idx] == doc[kv_idx])
    with pytest.raises(ValueError, match="Python control flow"):
        flashgen.attention(q, k, v, score_mod=lambda s, b, h, qi, ki: s if qi > ki else 0.0)
    with pytest.raises(ValueError, match="mask_mod: column"):
        flashgen.attention_varlen(q[0], k[0], v[0], cu([8]), cu([8]), 8, 8, mask_mod="q +")
    with pytest.raises(ValueError, match="score_mod: a score modifier replaces alibi_slopes"):
        flashgen.attention_with_kvcache(q, k, v, score_mod="s",
                                        alibi_slopes=torch.ones(4, device="cuda"))

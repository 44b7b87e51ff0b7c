"""flashgen inside PyTorch: the custom operators' registration (opcheck),
torch.compile without graph breaks, CUDA graphs, and
scaled_dot_product_attention as a drop-in with its fallbacks; a value head
dim of its own through all of them."""
import re
import warnings

import pytest

from conftest import gpu_or_skip

pytestmark = pytest.mark.gpu
torch = gpu_or_skip()

import flashgen  # noqa: E402
from flashgen import _api  # noqa: E402
import reference  # noqa: E402


def qkv(B=2, S=70, H=4, Hk=2, D=64, dtype=torch.float16, grad=True, layout="bshd"):
    shape = lambda h: (B, S, h, D) if layout == "bshd" else (B, h, S, D)
    return [torch.randn(*shape(h), device="cuda", dtype=dtype).requires_grad_(grad)
            for h in (H, Hk, Hk)]


def forward_args(q, k, v, mask=1, dropout_p=0.0, deterministic=False):
    return (q, k, v, mask, 0, -1, -1, dropout_p, 0.0, 0, 0, 0, 0, 0, deterministic)


def test_opcheck_forward_and_backward():
    q, k, v = qkv()
    torch.library.opcheck(torch.ops.flashgen.forward.default, forward_args(q, k, v))
    q, k, v = (t.detach() for t in (q, k, v))  # the backward has no derivative of its own
    out, lse, rng = torch.ops.flashgen.forward(*forward_args(q, k, v))
    d_out = torch.randn_like(out)
    torch.library.opcheck(torch.ops.flashgen.backward.default,
                          (d_out, q, k, v, out, lse, rng) + forward_args(q, k, v)[3:])


def test_eager_path_and_operator_agree():
    q, k, v = qkv(S=300)
    options = (1, 0, -1, -1, 0.0, 0.0, 0, 0, 0, 0, 0, True)  # causal, deterministic
    a, lse_a = flashgen._ops.attention(q, k, v, options, True)  # plain tensors: no dispatcher
    b, lse_b, _ = torch.ops.flashgen.forward(q, k, v, *options)
    assert torch.equal(a, b) and torch.equal(lse_a, lse_b)
    with torch.no_grad():  # without autograd or return_lse the kernel skips lse
        c, lse_c = flashgen._ops.attention(q, k, v, options, False)
    assert lse_c is None and torch.equal(a, c)
    d_out = torch.randn_like(a)
    ga = torch.autograd.grad(a, (q, k, v), d_out)
    gb = torch.autograd.grad(b, (q, k, v), d_out)
    assert all(torch.equal(x, y) for x, y in zip(ga, gb))


class Block(torch.nn.Module):
    def __init__(self, dim=256, heads=4, kv_heads=2):
        super().__init__()
        self.heads, self.kv_heads, self.d = heads, kv_heads, dim // heads
        self.q = torch.nn.Linear(dim, dim)
        self.kv = torch.nn.Linear(dim, 2 * kv_heads * self.d)
        self.o = torch.nn.Linear(dim, dim)

    def forward(self, x):
        B, S, _ = x.shape
        q = self.q(x).view(B, S, self.heads, self.d)
        k, v = self.kv(x).view(B, S, 2, self.kv_heads, self.d).unbind(2)
        a = flashgen.attention(q, k, v, causal=True)
        b = flashgen.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                                  v.transpose(1, 2), is_causal=True,
                                                  enable_gqa=True)
        return self.o((a + b.transpose(1, 2)).reshape(B, S, -1))


@pytest.mark.parametrize("dynamic", [False, True])
def test_torch_compile_fullgraph(dynamic):
    torch.manual_seed(0)
    model = Block().cuda().half()
    compiled = torch.compile(model, fullgraph=True, dynamic=dynamic)
    for S in (33, 80):
        x = torch.randn(2, S, 256, device="cuda", dtype=torch.float16, requires_grad=True)
        ref = model(x)
        (gx_ref,) = torch.autograd.grad(ref.float().pow(2).sum(), x)
        out = compiled(x)
        (gx,) = torch.autograd.grad(out.float().pow(2).sum(), x)
        assert torch.allclose(out, ref, atol=2e-3, rtol=0)
        assert torch.allclose(gx, gx_ref, atol=5e-2, rtol=1e-2)


def test_cuda_graph_capture_and_replay():
    q, k, v = qkv(grad=False)
    d_out = torch.randn_like(q)
    args = forward_args(q, k, v)
    for _ in range(2):  # warm up: kernels compiled and loaded before capture
        out, lse, rng = torch.ops.flashgen.forward(*args)
        torch.ops.flashgen.backward(d_out, q, k, v, out, lse, rng, *args[3:])
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, lse, rng = torch.ops.flashgen.forward(*args)
        dq, dk, dv, *_ = torch.ops.flashgen.backward(d_out, q, k, v, out, lse, rng, *args[3:])
    for _ in range(2):
        with torch.no_grad():
            q.copy_(torch.randn_like(q))
        graph.replay()
        eager_out, eager_lse, eager_rng = torch.ops.flashgen.forward(*args)
        eager = torch.ops.flashgen.backward(d_out, q, k, v, eager_out, eager_lse, eager_rng,
                                            *args[3:])
        assert torch.equal(out, eager_out)
        assert torch.allclose(dq, eager[0], atol=1e-3) and torch.equal(dv, eager[2])


def test_causal_walk_under_cuda_graph_capture():
    """A causal forward whose thread blocks walk lists made on the host (d 128,
    2k keys, more query blocks than SMs on Hopper): a shape whose lists were
    made before the capture replays with them; one first seen under the
    capture walks without (no copy may run there). Either way the same
    output as eager, bit for bit: a block's result does not depend on which
    thread block computes it."""
    def args_of(B):
        q, k, v = qkv(B=B, S=2048, H=8, Hk=8, D=128, dtype=torch.bfloat16, grad=False)
        return forward_args(q, k, v)
    before, first = args_of(2), args_of(3)
    for args in (before, args_of(1)):  # kernels loaded; lists for `before` only
        torch.ops.flashgen.forward(*args)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = [torch.ops.flashgen.forward(*args)[0] for args in (before, first)]
    for _ in range(2):
        for args in (before, first):
            with torch.no_grad():
                args[0].copy_(torch.randn_like(args[0]))
        graph.replay()
        for out, args in zip(outs, (before, first)):
            eager = torch.ops.flashgen.forward(*args)[0]
            assert torch.equal(out, eager)
            q, k, v = (t.float().transpose(1, 2) for t in args[:3])
            ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            assert (eager.float().transpose(1, 2) - ref).abs().max() < 2e-2


def test_dropout_refuses_cuda_graph_capture():
    q, k, v = qkv(grad=False)
    flashgen.attention(q, k, v, dropout_p=0.1)
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(RuntimeError, match="CUDA graph"):
        with torch.cuda.graph(graph):
            flashgen.attention(q, k, v, dropout_p=0.1)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("gqa", [False, True])
def test_sdpa_drop_in(causal, gqa):
    B, H, Sq, Sk, D = 2, 8, 61, 130, 64
    Hk = 2 if gqa else H
    q = torch.randn(B, H, Sq, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k, v = (torch.randn(B, Hk, Sk, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
            for _ in range(2))
    out = flashgen.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=0.2,
                                                enable_gqa=gqa)
    ref = torch.nn.functional.scaled_dot_product_attention(
        q.double(), k.double(), v.double(), is_causal=causal, scale=0.2, enable_gqa=gqa)
    torch_out = torch.nn.functional.scaled_dot_product_attention(
        q, k, v, is_causal=causal, scale=0.2, enable_gqa=gqa)
    assert out.shape == ref.shape
    assert reference.error(out, ref) <= 2 * reference.error(torch_out, ref) + 8e-3
    d_out = torch.randn_like(out)
    g = torch.autograd.grad(out, (q, k, v), d_out)
    g_ref = torch.autograd.grad(ref, (q, k, v), d_out.double())
    g_torch = torch.autograd.grad(torch_out, (q, k, v), d_out)
    for a, r, t in zip(g, g_ref, g_torch):
        assert reference.error(a, r) <= 2 * reference.error(t, r) + 3e-2


class LatentBlock(torch.nn.Module):
    """DeepSeek-shaped attention: queries and keys of 64 + 32 columns (a
    rotary part beside the rest), values of 64, sliced from one
    projection."""

    def __init__(self, dim=256, heads=4):
        super().__init__()
        self.heads = heads
        self.q = torch.nn.Linear(dim, heads * 96)
        self.kv = torch.nn.Linear(dim, heads * (64 + 64))
        self.rope = torch.nn.Linear(dim, 32)
        self.o = torch.nn.Linear(heads * 64, dim)

    def forward(self, x):
        B, S, _ = x.shape
        q = self.q(x).view(B, S, self.heads, 96)
        kv = self.kv(x).view(B, S, self.heads, 128)
        k_rot = self.rope(x).view(B, S, 1, 32).expand(B, S, self.heads, 32)
        k = torch.cat([kv[..., :64], k_rot], -1)
        v = kv[..., 64:]  # (B, S, H, 64), a view
        a = flashgen.attention(q, k, v, causal=True)
        b = flashgen.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                                  v.transpose(1, 2), is_causal=True)
        return self.o((a + b.transpose(1, 2)).reshape(B, S, -1))


def test_value_head_dim_opcheck_and_compile():
    """A value head dim of its own through the operators' registration
    (opcheck, forward and backward, dense and packed) and through
    torch.compile(fullgraph=True): the fake implementations' shapes are
    the kernels'."""
    q = torch.randn(2, 70, 4, 192, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(2, 70, 2, 192, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(2, 70, 2, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    torch.library.opcheck(torch.ops.flashgen.forward.default, forward_args(q, k, v))
    q, k, v = (t.detach() for t in (q, k, v))
    out, lse, rng = torch.ops.flashgen.forward(*forward_args(q, k, v))
    assert out.shape == (2, 70, 4, 128)
    torch.library.opcheck(torch.ops.flashgen.backward.default,
                          (torch.randn_like(out), q, k, v, out, lse, rng) +
                          forward_args(q, k, v)[3:])
    cu = torch.tensor([0, 30, 70], dtype=torch.int32, device="cuda")
    packed = [t[0].clone().requires_grad_() for t in (q, k, v)]  # (70, H, D or Dv)
    torch.library.opcheck(torch.ops.flashgen.varlen_forward.default,
                          (*packed, cu, cu, None, 40, 40, 1, 0, -1, -1, 0.0, 0.0, True))

    def f(q, k, v):
        return flashgen.attention_varlen(q, k, v, cu, cu, 40, 40, causal=True,
                                         deterministic=True)
    eager = f(*packed)
    compiled = torch.compile(f, fullgraph=True)(*packed)
    assert compiled.shape == (70, 4, 128) and torch.equal(eager, compiled)
    d = torch.randn_like(eager)
    ge = torch.autograd.grad(eager, packed, d)
    gc = torch.autograd.grad(compiled, packed, d)
    assert all(torch.equal(a, b) for a, b in zip(ge, gc))
    torch.manual_seed(0)
    model = LatentBlock().cuda().half()
    compiled = torch.compile(model, fullgraph=True)
    for S in (33, 80):
        x = torch.randn(2, S, 256, device="cuda", dtype=torch.float16, requires_grad=True)
        ref = model(x)
        (gx_ref,) = torch.autograd.grad(ref.float().pow(2).sum(), x)
        out = compiled(x)
        (gx,) = torch.autograd.grad(out.float().pow(2).sum(), x)
        assert torch.allclose(out, ref, atol=2e-3, rtol=0)
        assert torch.allclose(gx, gx_ref, atol=5e-2, rtol=1e-2)


@pytest.mark.parametrize("D, Dv", [(192, 128), (64, 128)])
def test_sdpa_drop_in_with_a_value_head_dim_of_its_own(D, Dv):
    """flashgen's own call, not PyTorch's (no warning), as close to fp64 as
    PyTorch's function is."""
    B, H, Hk, Sq, Sk = 2, 8, 2, 61, 130
    q = torch.randn(B, H, Sq, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(B, Hk, Sk, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(B, Hk, Sk, Dv, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = flashgen.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    assert out.shape == (B, H, Sq, Dv)
    ref = torch.nn.functional.scaled_dot_product_attention(
        q.double(), k.double(), v.double(), is_causal=True, enable_gqa=True)
    torch_out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                                 enable_gqa=True)
    assert reference.error(out, ref) <= 2 * reference.error(torch_out, ref) + 8e-3
    d_out = torch.randn_like(out)
    g = torch.autograd.grad(out, (q, k, v), d_out)
    g_ref = torch.autograd.grad(ref, (q, k, v), d_out.double())
    g_torch = torch.autograd.grad(torch_out, (q, k, v), d_out)
    for a, r, t in zip(g, g_ref, g_torch):
        assert a.shape == r.shape
        assert reference.error(a, r) <= 2 * reference.error(t, r) + 3e-2


def test_sdpa_falls_back_with_one_warning_per_reason():
    _api._warned.clear()
    q = torch.randn(1, 2, 9, 32, device="cuda")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        a = flashgen.scaled_dot_product_attention(q, q, q)
        flashgen.scaled_dot_product_attention(q, q, q)
        mask = torch.ones(9, 9, dtype=torch.bool, device="cuda").tril()
        qh = q.half()
        b = flashgen.scaled_dot_product_attention(qh, qh, qh, attn_mask=mask)
        flashgen.scaled_dot_product_attention(q.cpu(), q.cpu(), q.cpu())
    texts = [str(w.message) for w in caught]
    assert len(texts) == 3, texts
    assert "float32" in texts[0] and "attn_mask" in texts[1] and "cpu" in texts[2]
    assert torch.allclose(a, torch.nn.functional.scaled_dot_product_attention(q, q, q))
    assert torch.allclose(b, torch.nn.functional.scaled_dot_product_attention(
        qh, qh, qh, attn_mask=mask))


def test_sdpa_refuses_unmatched_heads():
    q = torch.randn(1, 8, 9, 32, device="cuda", dtype=torch.float16)
    k = torch.randn(1, 2, 9, 32, device="cuda", dtype=torch.float16)
    with pytest.raises(ValueError, match="enable_gqa=True"):
        flashgen.scaled_dot_product_attention(q, k, k)


def test_compile_log_goes_to_logging(caplog):
    q, k, v = qkv(D=24, grad=False)  # a head dim no other test uses: compiled here
    with caplog.at_level("INFO", logger="flashgen"):
        flashgen.attention(q, k, v)
    assert any(re.search(r"compiled fg_fwd_sm\d+a?_fp16_d24", r.getMessage())
               for r in caplog.records), [r.getMessage() for r in caplog.records]


def test_tune_keeps_a_choice_that_calls_then_use():
    report = flashgen.tune(40, torch.float16, mask="causal", seqlen=1024)
    assert report["seqlen_bucket"] == 1024 and report["candidates"] >= 1
    assert report["derived_ms"] > 0 and report["chosen_ms"] > 0
    assert report["chosen_ms"] <= report["derived_ms"] * (1 + report["spread"]) or \
        report["chosen_is_derived"]
    ctx = flashgen._native.device_context(torch.cuda.current_device())
    kept = ctx.tuned(flashgen.make_spec(40, "fp16", "causal"), "forward", 1000)
    assert kept is not None and kept["chosen"]["kernel_name"] == report["chosen"]["kernel_name"]
    q, k, v = qkv(D=40, grad=False)
    ref, _ = reference.attention(q, k, v, causal=True)
    assert reference.error(flashgen.attention(q, k, v, causal=True), ref) < 2e-3

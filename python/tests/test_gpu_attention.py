"""flashgen.attention on the GPU against fp64, at odd sizes: forward,
gradients, masks, grouped-query attention, value head dims of their own,
dropout, block sparsity, strides and empty inputs. Each figure must be
within twice the error of the same computation done by PyTorch in the
input dtype (plus a small floor)."""
import pytest

from conftest import gpu_or_skip

pytestmark = pytest.mark.gpu
torch = gpu_or_skip()

import flashgen  # noqa: E402
import reference  # noqa: E402
from tensors import inputs  # noqa: E402


def grads(out, ts, d_out):
    return torch.autograd.grad(out, ts, d_out)


def check(name, got, ref64, lowp, floor):
    err, base = reference.error(got, ref64), reference.error(lowp, ref64)
    assert err <= 2 * base + floor, f"{name}: error {err:.3g}, PyTorch's in-dtype {base:.3g}"


def against_reference(q, k, v, d_out, out, lse, g, dtype, opts):
    """out, lse and the gradients g of q, k, v against the fp64 reference
    with the options opts, each within twice PyTorch's in-dtype error."""
    ref, ref_lse = reference.attention(q, k, v, **opts)
    lowp, _ = reference.attention(q, k, v, dtype=dtype, **opts)
    floor = 1e-3 if dtype == torch.float16 else 8e-3
    check("out", out, ref, lowp, floor)
    rows = torch.isfinite(ref_lse)
    assert torch.equal(torch.isfinite(lse), rows)
    assert reference.error(lse[rows], ref_lse[rows]) < 1e-3
    g_ref = grads(ref, (q, k, v), d_out.double())
    g_lowp = grads(lowp, (q, k, v), d_out)
    for name, a, r, lp in zip(("dq", "dk", "dv"), g, g_ref, g_lowp):
        check(name, a, r, lp, floor * 4)


CASES = [
    # B, Sq, Sk, Hq, Hk, D, causal, align, window
    (1, 1, 1, 1, 1, 64, False, "bottom-right", None),
    (2, 77, 131, 4, 4, 72, False, "bottom-right", None),
    (2, 131, 77, 6, 2, 40, True, "bottom-right", None),
    (1, 200, 333, 8, 1, 128, True, "top-left", None),
    (3, 97, 97, 4, 2, 96, False, "bottom-right", (17, 5)),
    (1, 150, 260, 2, 2, 256, True, "bottom-right", (33, -1)),
    (2, 64, 300, 4, 4, 3, True, "top-left", None),
]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("B, Sq, Sk, Hq, Hk, D, causal, align, window", CASES)
def test_forward_and_gradients(B, Sq, Sk, Hq, Hk, D, causal, align, window, dtype):
    q, k, v = inputs(B, Sq, Sk, Hq, Hk, D, dtype)
    d_out = torch.randn(B, Sq, Hq, D, device="cuda").to(dtype)
    out, lse = flashgen.attention(q, k, v, causal=causal, align=align, window=window,
                                  return_lse=True)
    assert out.shape == (B, Sq, Hq, D) and out.dtype == dtype and not lse.requires_grad
    g = grads(out, (q, k, v), d_out)
    against_reference(q, k, v, d_out, out, lse, g, dtype,
                      dict(causal=causal, align=align, window=window))


# value head dims of their own: DeepSeek's 192/128, and smaller and larger
# than the query's, at sizes off every tile
DV_CASES = [
    # B, Sq, Sk, Hq, Hk, D, Dv, causal, align, window
    (2, 77, 131, 4, 4, 192, 128, False, "bottom-right", None),
    (1, 200, 333, 8, 2, 192, 128, True, "bottom-right", None),
    (2, 131, 77, 6, 2, 128, 64, True, "top-left", None),
    (1, 97, 97, 4, 1, 64, 128, False, "bottom-right", (17, 5)),
    (2, 150, 260, 2, 2, 96, 64, True, "bottom-right", None),
    (1, 64, 300, 4, 2, 256, 128, False, "top-left", None),
    (2, 45, 70, 6, 3, 40, 72, True, "bottom-right", (33, -1)),
]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("B, Sq, Sk, Hq, Hk, D, Dv, causal, align, window", DV_CASES)
def test_value_head_dim_of_its_own(B, Sq, Sk, Hq, Hk, D, Dv, causal, align, window, dtype):
    """out (B, Sq, Hq, Dv), lse, and dq, dk, dv of q's, k's and v's shapes
    against fp64; the default scale is 1/sqrt(D), the query/key head dim
    (the reference's)."""
    q, k, v = inputs(B, Sq, Sk, Hq, Hk, D, dtype, Dv=Dv)
    d_out = torch.randn(B, Sq, Hq, Dv, device="cuda").to(dtype)
    out, lse = flashgen.attention(q, k, v, causal=causal, align=align, window=window,
                                  return_lse=True)
    assert out.shape == (B, Sq, Hq, Dv) and out.dtype == dtype and lse.shape == (B, Hq, Sq)
    g = grads(out, (q, k, v), d_out)
    assert [t.shape for t in g] == [q.shape, k.shape, v.shape]
    against_reference(q, k, v, d_out, out, lse, g, dtype,
                      dict(causal=causal, align=align, window=window))


def test_value_head_dim_layouts_slices_and_determinism():
    """DeepSeek's value is a slice of a wider projection (read in place);
    bhsd takes and returns the value's head dim; deterministic gradients
    are bitwise repeatable; a value head dim over 256 is refused by name."""
    dtype = torch.bfloat16
    g = torch.Generator(device="cuda").manual_seed(5)
    kv = torch.randn(2, 90, 4, 64 + 128, device="cuda", generator=g).to(dtype)
    k_nope, v = kv[..., :64], kv[..., 64:]  # (B, S, H, 64), (B, S, H, 128) views
    k = torch.cat([k_nope, torch.randn(2, 90, 4, 128, device="cuda", generator=g).to(dtype)], -1)
    q = torch.randn(2, 70, 4, 192, device="cuda", generator=g).to(dtype)
    out = flashgen.attention(q, k, v, causal=True, softmax_scale=0.07)
    ref, _ = reference.attention(q, k, v, causal=True, scale=0.07)
    lowp, _ = reference.attention(q, k, v, causal=True, scale=0.07, dtype=dtype)
    check("out", out, ref, lowp, 8e-3)
    out2 = flashgen.attention(*(t.transpose(1, 2) for t in (q, k, v)), causal=True,
                              softmax_scale=0.07, layout="bhsd")
    assert out2.shape == (2, 4, 70, 128) and torch.equal(out2.transpose(1, 2), out)
    q, k, v = inputs(2, 300, 700, 8, 2, 192, dtype, Dv=128)
    d_out = torch.randn(2, 300, 8, 128, device="cuda").to(dtype)
    runs = [grads(flashgen.attention(q, k, v, causal=True, deterministic=True), (q, k, v), d_out)
            for _ in range(3)]
    for r in runs[1:]:
        assert all(torch.equal(a, b) for a, b in zip(runs[0], r))
    with pytest.raises(ValueError, match="v: head dim 320; flashgen supports 1..256"):
        flashgen.attention(q, k, torch.zeros(2, 700, 2, 320, device="cuda", dtype=dtype))
    q, k, v = inputs(2, 5, 0, 2, 2, 64, torch.float16, Dv=32)  # no keys
    out, lse = flashgen.attention(q, k, v, return_lse=True)
    assert out.shape == (2, 5, 2, 32) and torch.all(out == 0)
    out.sum().backward()
    assert torch.all(q.grad == 0) and v.grad.shape == v.shape


def test_bhsd_layout_and_strided_inputs():
    dtype = torch.float16
    qkv = torch.randn(2, 45, 3, 4, 64, device="cuda", dtype=dtype)  # packed projection
    q, k, v = qkv.unbind(2)  # (B, S, H, D) views with stride 3*H*D
    out = flashgen.attention(q, k, v, causal=True)
    ref, _ = reference.attention(q, k, v, causal=True)
    assert reference.error(out, ref) < 2e-3
    bh = [t.transpose(1, 2) for t in (q, k, v)]  # (B, H, S, D) views
    out2 = flashgen.attention(*bh, causal=True, layout="bhsd")
    assert out2.shape == (2, 4, 45, 64) and torch.equal(out2.transpose(1, 2), out)
    odd = torch.randn(2 * 45 * 4 * 64 + 1, device="cuda", dtype=dtype)[1:].view(2, 45, 4, 64)
    assert odd.data_ptr() % 16  # misaligned: copied before the call
    out3 = flashgen.attention(odd, k, v)
    ref3, _ = reference.attention(odd, k, v)
    assert reference.error(out3, ref3) < 2e-3


def test_empty_inputs():
    q, k, v = inputs(2, 0, 5, 2, 2, 64, torch.float16)
    out = flashgen.attention(q, k, v)
    assert out.shape == (2, 0, 2, 64)
    q, k, v = inputs(2, 5, 0, 2, 2, 64, torch.float16)
    out, lse = flashgen.attention(q, k, v, return_lse=True)
    assert torch.all(out == 0) and torch.all(lse == float("-inf"))
    out.sum().backward()
    assert torch.all(q.grad == 0)


def dropout_keep(B, Sq, Sk, H, p, seed, dtype, causal):
    """The keep mask flashgen draws: with v = identity rows, out[i, j] is
    P[i, j] * keep[i, j] / (1 - p)."""
    D = 128
    q, k, _ = inputs(B, Sq, Sk, H, H, D, dtype, scale=0.3, grad=False)
    eye = torch.eye(Sk, D, device="cuda", dtype=dtype)[None, :, None, :].expand(B, Sk, H, D)
    torch.manual_seed(seed)
    out = flashgen.attention(q, k, eye, causal=causal, dropout_p=p)
    vis = reference.visible(Sq, Sk, causal, "bottom-right", None)
    keep = (out[..., :Sk].transpose(1, 2) != 0)
    assert not torch.any(keep & ~vis), "a masked key was kept"
    return keep | ~vis, vis


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_dropout_matches_its_mask_and_is_reproducible(dtype):
    B, Sq, Sk, H, p = 2, 77, 100, 3, 0.17
    keep, vis = dropout_keep(B, Sq, Sk, H, p, 1234, dtype, causal=True)
    rate = 1 - keep[vis.expand_as(keep)].float().mean().item()
    assert abs(rate - p) < 0.02, f"dropped {rate:.3f}, asked {p}"
    keep2, _ = dropout_keep(B, Sq, Sk, H, p, 1234, dtype, causal=True)
    assert torch.equal(keep, keep2), "torch.manual_seed did not reproduce the mask"
    keep3, _ = dropout_keep(B, Sq, Sk, H, p, 99, dtype, causal=True)
    assert not torch.equal(keep, keep3)
    # Another v: the same mask, the reference's values and gradients.
    q, k, _ = inputs(B, Sq, Sk, H, H, 128, dtype, scale=0.3)
    v = torch.randn(B, Sk, H, 128, device="cuda").to(dtype).requires_grad_()
    torch.manual_seed(1234)
    out = flashgen.attention(q, k, v, causal=True, dropout_p=p)
    d_out = torch.randn_like(out)
    g = grads(out, (q, k, v), d_out)
    opts = dict(causal=True, keep=keep, dropout_p=round(p * 256) / 256)  # p as it runs
    ref, _ = reference.attention(q, k, v, **opts)
    lowp, _ = reference.attention(q, k, v, dtype=dtype, **opts)
    floor = 1e-3 if dtype == torch.float16 else 8e-3
    check("out", out, ref, lowp, floor)
    for name, a, r, lp in zip(("dq", "dk", "dv"), g, grads(ref, (q, k, v), d_out.double()),
                              grads(lowp, (q, k, v), d_out)):
        check(name, a, r, lp, floor * 4)
    # Consecutive calls draw different masks.
    a = flashgen.attention(q, k, v, dropout_p=p)
    b = flashgen.attention(q, k, v, dropout_p=p)
    assert not torch.equal(a, b)


# 64 x 256 blocks: whole tiles of the sm_90a backward
@pytest.mark.parametrize("bq, bk", [(32, 64), (64, 256)])
@pytest.mark.parametrize("kind", ["layout", "butterfly"])
def test_block_sparsity(kind, bq, bk):
    dtype, B, S, H, D = torch.bfloat16, 2, 333, 4, 64
    nq, nk = -(-S // bq), -(-S // bk)
    if kind == "layout":
        g = torch.Generator().manual_seed(3)
        blocks = (torch.rand(H, nq, nk, generator=g) < 0.5).to(torch.uint8)
        blocks[:, :, 0] = 1
        sparsity = flashgen.BlockLayout(blocks, block_size=(bq, bk))
    else:
        sparsity = flashgen.Butterfly(2, block_size=(bq, bk))
        i = torch.arange(nq)[:, None]
        j = torch.arange(nk)[None, :]
        x = i ^ j
        blocks = ((x == 0) | (x == 1) | (x == 2))[None]
    q, k, v = inputs(B, S, S, H, H, D, dtype)
    out = flashgen.attention(q, k, v, causal=True, sparsity=sparsity)
    d_out = torch.randn_like(out)
    g = grads(out, (q, k, v), d_out)
    opts = dict(causal=True, blocks=blocks, block_size=(bq, bk))
    ref, _ = reference.attention(q, k, v, **opts)
    lowp, _ = reference.attention(q, k, v, dtype=dtype, **opts)
    check("out", out, ref, lowp, 8e-3)
    for name, a, r, lp in zip(("dq", "dk", "dv"), g, grads(ref, (q, k, v), d_out.double()),
                              grads(lowp, (q, k, v), d_out)):
        check(name, a, r, lp, 3e-2)


def test_deterministic_gradients_are_bitwise_repeatable():
    q, k, v = inputs(2, 300, 700, 8, 2, 128, torch.bfloat16)
    d_out = torch.randn(2, 300, 8, 128, device="cuda").to(torch.bfloat16)
    runs = [grads(flashgen.attention(q, k, v, causal=True, deterministic=True), (q, k, v), d_out)
            for _ in range(3)]
    for r in runs[1:]:
        assert all(torch.equal(a, b) for a, b in zip(runs[0], r))


def test_errors_name_the_argument():
    q, k, v = inputs(1, 8, 8, 2, 2, 64, torch.float16, grad=False)
    with pytest.raises(TypeError, match="q: torch.float32"):
        flashgen.attention(q.float(), k.float(), v.float())
    with pytest.raises(ValueError, match="k: on cpu, but q is on cuda:0"):
        flashgen.attention(q, k.cpu(), v)
    with pytest.raises(ValueError, match="layout"):
        flashgen.attention(q, k, v, layout="sbhd")
    with pytest.raises(ValueError, match="layout"):  # built for other lengths
        flashgen.attention(q, k, v, sparsity=flashgen.BlockLayout([[1, 1]], block_size=16))

"""flashgen.attention_varlen on the GPU: each packed sequence against its
own fp64 attention (forward and gradients; value head dims of their own
among them) within twice the error of the same computation in the input
dtype, zeros in the gradients of rows that no sequence sees, and the
argument errors."""
import pytest

from conftest import gpu_or_skip

pytestmark = pytest.mark.gpu
torch = gpu_or_skip()

import flashgen  # noqa: E402
import reference  # noqa: E402


def cu(lengths):
    return torch.tensor([0] + lengths, device="cuda").cumsum(0).to(torch.int32)


def reference_packed(q, k, v, lens_q, lens_k, used, dtype, **opts):
    """Packed out of every sequence's own attention (rows outside the
    sequences 0), through slices of q, k, v so autograd gives gradients."""
    outs, i, j = [], 0, 0
    for nq, nk, nu in zip(lens_q, lens_k, used):
        out, _ = reference.attention(q[None, i:i + nq], k[None, j:j + nu], v[None, j:j + nu],
                                     dtype=dtype, **opts)
        outs.append(out[0])
        i, j = i + nq, j + nk
    rest = q.shape[0] - i
    outs.append(q.new_zeros((rest, q.shape[1], v.shape[2]), dtype=outs[0].dtype))
    return torch.cat(outs)


CASES = [
    # lens_q, lens_k, seqused_k, Hq, Hk, D, dtype, causal, align, window
    ([37, 0, 1, 300, 129], [37, 5, 1, 300, 200], None, 4, 2, 64, torch.float16, False,
     "bottom-right", None),
    ([1, 77, 200, 3], [150, 77, 333, 0], None, 4, 4, 128, torch.bfloat16, True, "bottom-right",
     None),
    ([190, 65, 17], [100, 65, 40], [90, 65, 0], 3, 1, 40, torch.float16, True, "top-left", None),
    ([250, 1, 90], [260, 30, 90], None, 2, 2, 96, torch.bfloat16, False, "bottom-right", (37, 5)),
]
# value head dims of their own (D, Dv): DeepSeek's 192/128, and smaller and
# larger than the query's
DV_CASES = [
    ([37, 0, 1, 300, 129], [37, 5, 1, 300, 200], None, 4, 2, (192, 128), torch.bfloat16, True,
     "bottom-right", None),
    ([1, 77, 200, 3], [150, 77, 333, 0], None, 4, 4, (128, 64), torch.float16, False,
     "bottom-right", None),
    ([190, 65, 17], [100, 65, 40], [90, 65, 0], 3, 1, (64, 128), torch.bfloat16, True,
     "top-left", None),
    ([250, 1, 90], [260, 30, 90], None, 2, 2, (96, 40), torch.float16, False, "bottom-right",
     (37, 5)),
]


@pytest.mark.parametrize("lens_q, lens_k, used, Hq, Hk, D, dtype, causal, align, window",
                         CASES + DV_CASES)
def test_each_sequence_against_its_reference(lens_q, lens_k, used, Hq, Hk, D, dtype, causal,
                                             align, window):
    """D: the head dim, or (q's and k's, v's)."""
    D, Dv = D if isinstance(D, tuple) else (D, D)
    g = torch.Generator(device="cuda").manual_seed(1)
    tq, tk = sum(lens_q), sum(lens_k)
    make = lambda n, h, width: torch.randn(n, h, width, device="cuda", generator=g).to(dtype)
    q, k, v = (make(tq, Hq, D).requires_grad_(), make(tk, Hk, D).requires_grad_(),
               make(tk, Hk, Dv).requires_grad_())
    d_out = make(tq, Hq, Dv)
    seqused = torch.tensor(used, dtype=torch.int32, device="cuda") if used else None
    opts = dict(causal=causal, align=align, window=window)
    out, lse = flashgen.attention_varlen(q, k, v, cu(lens_q), cu(lens_k), max(lens_q),
                                         max(lens_k), seqused_k=seqused, return_lse=True, **opts)
    assert out.shape == (tq, Hq, Dv) and lse.shape == (Hq, tq) and not lse.requires_grad
    got = torch.autograd.grad(out, (q, k, v), d_out)
    assert [t.shape for t in got] == [q.shape, k.shape, v.shape]
    seen = used or lens_k
    ref = reference_packed(q, k, v, lens_q, lens_k, seen, torch.float64, **opts)
    lowp = reference_packed(q, k, v, lens_q, lens_k, seen, dtype, **opts)
    floor = 1e-3 if dtype == torch.float16 else 8e-3
    err = lambda a, b: reference.error(a, b)
    assert err(out, ref) <= 2 * err(lowp, ref) + floor
    g_ref = torch.autograd.grad(ref, (q, k, v), d_out.double())
    g_lowp = torch.autograd.grad(lowp, (q, k, v), d_out)
    for name, a, r, lp in zip(("dq", "dk", "dv"), got, g_ref, g_lowp):
        assert torch.isfinite(a).all(), name
        assert err(a, r) <= 2 * err(lp, r) + 4 * floor, f"{name}: {err(a, r):.3g}"
    # keys no query sees (past seqused_k, of sequences without queries): zero gradients
    j = 0
    for nq, nk, nu in zip(lens_q, lens_k, seen):
        start = j + (nu if nq else 0)
        assert not got[1][start:j + nk].any() and not got[2][start:j + nk].any()
        j += nk


def test_rows_after_the_last_sequence():
    q = torch.randn(50, 2, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(70, 2, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(70, 2, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    out = flashgen.attention_varlen(q, k, v, cu([20, 10]), cu([40, 5]), 20, 40, causal=True)
    dq, dk, dv = torch.autograd.grad(out[:30], (q, k, v), torch.ones_like(out[:30]))
    assert not dq[30:].any() and not dk[45:].any() and not dv[45:].any()
    assert dq[:30].abs().sum() > 0 and dv[:45].abs().sum() > 0


def test_bad_arguments():
    q = torch.randn(10, 2, 64, device="cuda", dtype=torch.float16)
    good = cu([4, 6])
    with pytest.raises(ValueError, match="cu_seqlens_q: on cpu"):
        flashgen.attention_varlen(q, q, q, good.cpu(), good, 6, 6)
    with pytest.raises(TypeError, match="cu_seqlens_k: torch.int64"):
        flashgen.attention_varlen(q, q, q, good, good.long(), 6, 6)
    with pytest.raises(ValueError, match="cu_seqlens_k: 2 entries; expected 3"):
        flashgen.attention_varlen(q, q, q, good, good[:2], 6, 6)
    with pytest.raises(ValueError, match="q: 4-D"):
        flashgen.attention_varlen(q[None], q, q, good, good, 6, 6)
    with pytest.raises(ValueError, match="max_seqlen_q"):
        flashgen.attention_varlen(q, q, q, good, good, -1, 6)

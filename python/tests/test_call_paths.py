"""Which road attention_varlen's calls take, with PyTorch and no GPU (the
checks and the library's side replaced by recorders): a call like an earlier
one skips the checks, any change of shape, strides, dtype, lengths or
options runs them again; a call that wants no gradient goes straight to the
library, one that does through the operator (its autograd formula)."""
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed")

import flashgen  # noqa: E402
from flashgen import _api, _ops  # noqa: E402

OPTIONS = (1, 0, -1, -1, 0.0, 0.125)  # mask, align, window left/right, dropout_p, scale


@pytest.fixture
def roads(monkeypatch):
    """Counts of the checks, of direct calls and of operator calls."""
    seen = {"checks": 0, "direct": 0, "operator": 0}

    def checks(*args):
        seen["checks"] += 1
        return OPTIONS, 0.0

    def direct(q, k, v, *args, **kwargs):
        seen["direct"] += 1
        return q.new_zeros(q.shape[:2] + v.shape[2:]), None, 0, 0

    def operator(q, k, v, *args):
        seen["operator"] += 1
        return q.new_zeros(q.shape[:2] + v.shape[2:]), None, None

    monkeypatch.setattr(_api, "_check_varlen", checks)
    monkeypatch.setattr(_api, "_checked", {})
    monkeypatch.setattr(_ops, "run_varlen_forward", direct)
    monkeypatch.setattr(_ops, "varlen_forward", operator)
    return seen


def packed(total_q=60, total_k=90, d=64, dv=64, grad=False):
    q = torch.randn(total_q, 8, d, dtype=torch.float16, requires_grad=grad)
    k = torch.randn(total_k, 2, d, dtype=torch.float16, requires_grad=grad)
    v = torch.randn(total_k, 2, dv, dtype=torch.float16, requires_grad=grad)
    cu_q = torch.tensor([0, 33, total_q], dtype=torch.int32)
    cu_k = torch.tensor([0, 47, total_k], dtype=torch.int32)
    return q, k, v, cu_q, cu_k


def test_checks_once_per_call_shape(roads):
    q, k, v, cu_q, cu_k = packed()
    for _ in range(3):
        out = flashgen.attention_varlen(q, k, v, cu_q, cu_k, 33, 47, causal=True)
    assert out.shape == (60, 8, 64)
    assert roads["checks"] == 1
    changed = [
        lambda: flashgen.attention_varlen(*packed(total_q=61), 33, 47, causal=True),
        lambda: flashgen.attention_varlen(*packed(dv=32), 33, 47, causal=True),
        lambda: flashgen.attention_varlen(q, k, v, cu_q, cu_k, 34, 47, causal=True),
        lambda: flashgen.attention_varlen(q, k, v, cu_q, cu_k, 33, 47, causal=False),
        lambda: flashgen.attention_varlen(q, k, v, cu_q, cu_k, 33, 47, causal=True,
                                          window=(8, 0)),
        lambda: flashgen.attention_varlen(q[:, :, :32], k[:, :, :32], v, cu_q, cu_k, 33, 47,
                                          causal=True),  # other strides
        lambda: flashgen.attention_varlen(q, k, v, cu_q, cu_k, True, 47, causal=True),
        lambda: flashgen.attention_varlen(q.bfloat16(), k.bfloat16(), v.bfloat16(), cu_q, cu_k,
                                          33, 47, causal=True),
    ]
    for n, call in enumerate(changed, start=2):
        call()
        assert roads["checks"] == n, n


def test_no_gradient_goes_straight_to_the_library(roads):
    q, k, v, cu_q, cu_k = packed()
    flashgen.attention_varlen(q, k, v, cu_q, cu_k, 33, 47)
    with torch.no_grad():
        flashgen.attention_varlen(*packed(grad=True), 33, 47)
    assert (roads["direct"], roads["operator"]) == (2, 0)


def test_a_gradient_goes_through_the_operator(roads):
    flashgen.attention_varlen(*packed(grad=True), 33, 47)
    assert (roads["direct"], roads["operator"]) == (0, 1)

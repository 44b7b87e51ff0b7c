"""Context parallelism on the CPU (PyTorch, no GPU): the sharding helpers
against slicing spelled out, and the ring's arithmetic (which pairs of chunks
each rank computes, at which positions, merged in fp32 through their
log-sum-exps) against plain attention over the whole sequence."""
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed")

from flashgen import distributed as cp  # noqa: E402
from flashgen._chunks import CAUSAL, NONE, chunk_ids, step_calls  # noqa: E402


@pytest.mark.parametrize("world", [1, 2, 3, 4])
@pytest.mark.parametrize("balanced", [True, False])
def test_shard_is_the_chunks_and_unshard_its_inverse(world, balanced):
    n = 2 * world if balanced else world
    x = torch.randn(2, 5 * n, 3, 4)
    shards = [cp.shard(x, r, world, balanced=balanced) for r in range(world)]
    for r, s in enumerate(shards):
        want = torch.cat([x[:, 5 * c:5 * (c + 1)] for c in chunk_ids(r, world, balanced)], 1)
        assert torch.equal(s, want)
    assert torch.equal(cp.unshard(shards, balanced=balanced), x)
    if n > 1:
        with pytest.raises(ValueError, match=f"does not divide into {n} equal chunks"):
            cp.shard(x[:, 1:], 0, world, balanced=balanced)


@pytest.mark.parametrize("world, balanced", [(1, True), (2, True), (3, False), (4, True)])
def test_shard_varlen_packs_each_sequences_chunks(world, balanced):
    n = 2 * world if balanced else world
    lengths = [3 * n, 0, n, 7 * n]
    cu = [0]
    for length in lengths:
        cu.append(cu[-1] + length)
    x = torch.randn(cu[-1], 2, 3)
    shards = [cp.shard_varlen(x, torch.tensor(cu), r, world, balanced=balanced)
              for r in range(world)]
    for r, s in enumerate(shards):
        want = torch.cat([x[start + c * (length // n):start + (c + 1) * (length // n)]
                          for c in chunk_ids(r, world, balanced)
                          for start, length in zip(cu, lengths)])
        assert torch.equal(s, want)
    assert torch.equal(cp.unshard_varlen(shards, cu, balanced=balanced), x)


def plain(q, k, v, ok, scale):
    """(out (B, Sq, H, D), lse (B, H, Sq)) of one head group, fp64, with the
    (Sq, Sk) visibility ok; rows that see nothing give 0 and -inf."""
    s = torch.einsum("bihd,bjhd->bhij", q, k) * scale
    s = s.masked_fill(~ok, float("-inf"))
    lse = torch.logsumexp(s, -1)
    p = torch.exp(s - lse[..., None]).nan_to_num(0.0)
    return torch.einsum("bhij,bjhd->bihd", p, v), lse


def call_visible(how, n, m, a, b, size):
    """The (n, m) visibility a call with pair_mask's answer computes, its
    first rows and keys at positions a·size and b·size (a joined call's
    slots need none: it sees every key)."""
    i = torch.arange(n)[:, None] + a * size
    j = torch.arange(m)[None, :] + b * size
    if how[0] == NONE:
        return torch.ones(n, m, dtype=torch.bool)
    if how[0] == CAUSAL:
        return j <= i
    left, right = how[1], how[2]
    ok = torch.ones(n, m, dtype=torch.bool)
    if left >= 0:
        ok &= j - i >= -left
    if right >= 0:
        ok &= j - i <= right
    return ok


@pytest.mark.parametrize("world", [1, 2, 3])
@pytest.mark.parametrize("join", [True, False])
@pytest.mark.parametrize("causal, window, balanced", [(True, None, True), (False, None, True),
                                                      (True, None, False), (False, (9, 4), True),
                                                      (True, (13, 0), False)])
def test_ring_arithmetic_is_the_whole_call(world, join, causal, window, balanced):
    n = 2 * world if balanced else world
    size, S, H, D = 6, 6 * n, 2, 4
    q, k, v = (torch.randn(1, S, H, D, dtype=torch.float64) for _ in range(3))
    i, j = torch.arange(S)[:, None], torch.arange(S)[None, :]
    ok = torch.ones(S, S, dtype=torch.bool)
    if causal:
        ok &= j <= i
    if window is not None:
        ok &= (j >= i - window[0]) & (j <= i + window[1])
    want, want_lse = plain(q, k, v, ok, 0.5)
    shape = cp._Dense(size, 2 if balanced else 1)
    outs, lses = [], []
    for rank in range(world):
        mine = chunk_ids(rank, world, balanced)
        qs = cp.shard(q, rank, world, balanced=balanced)
        out = torch.zeros(qs.shape, dtype=torch.float64)
        lse = torch.full((1, H, qs.shape[1]), float("-inf"), dtype=torch.float64)
        for step in range(world):  # K/V of rank - step, as the ring brings them
            src = (rank - step) % world
            ks, vs = (cp.shard(t, src, world, balanced=balanced) for t in (k, v))
            for qslots, kslots, how, a, b in step_calls(
                    mine, chunk_ids(src, world, balanced),
                    lambda a, b: cp.pair_mask(a, b, size, causal, window), join):
                qx, kx, vx = shape.span(qs, qslots), shape.span(ks, kslots), shape.span(vs, kslots)
                o, l = plain(qx, kx, vx, call_visible(how, qx.shape[1], kx.shape[1], a, b, size),
                             0.5)
                cp.merge(shape.span(out, qslots), shape.lse_span(lse, qslots), o, l,
                         cp._Dense.rows)
        outs.append(out)
        lses.append(lse)
    got = cp.unshard(outs, balanced=balanced)
    got_lse = cp.unshard(lses, dim=2, balanced=balanced)
    assert (got - want).abs().max().item() < 1e-12
    assert (got_lse - want_lse).abs().max().item() < 1e-12


def test_merge_keeps_rows_that_see_nothing_empty():
    acc = torch.zeros(1, 3, 1, 2, dtype=torch.float64)
    acc_lse = torch.full((1, 1, 3), float("-inf"), dtype=torch.float64)
    none = torch.full((1, 1, 3), float("-inf"), dtype=torch.float64)
    cp.merge(acc, acc_lse, torch.zeros_like(acc), none, cp._Dense.rows)
    assert torch.equal(acc, torch.zeros_like(acc)) and torch.isinf(acc_lse).all()
    some = torch.tensor([[[0.0, float("-inf"), 1.0]]], dtype=torch.float64)
    cp.merge(acc, acc_lse, torch.ones_like(acc), some, cp._Dense.rows)
    assert torch.equal(acc[0, :, 0, 0], torch.tensor([1.0, 0.0, 1.0], dtype=torch.float64))
    assert torch.equal(acc_lse, some)

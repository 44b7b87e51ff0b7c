"""Context parallelism on the CPU (PyTorch, no GPU): the sharding helpers
against slicing spelled out, the ring's arithmetic (which pairs of chunks
each rank computes, at which positions, merged in fp32 through their
log-sum-exps) against plain attention over the whole sequence, and score
and mask expressions: their refusals, and context_parallel_attention run by
ranks in threads over stand-in kernels (the expressions at the global
positions, pairs never joined, aux gradients summed over the calls) against
the whole sequence's attention and gradients, a value head dim unlike the
query's among them."""
import queue
import threading
import types

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


def call_visible(how, n, m, pos_q, pos_k):
    """The (n, m) visibility a call with pair_mask's answer computes, its
    first rows and keys at positions pos_q and pos_k (a joined call's slots
    need none: it sees every key)."""
    i = torch.arange(n)[:, None] + pos_q
    j = torch.arange(m)[None, :] + pos_k
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
                o, l = plain(qx, kx, vx, call_visible(how, qx.shape[1], kx.shape[1], a * size,
                                                      b * size), 0.5)
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


# ---- score and mask expressions ----------------------------------------------------

def fake_cuda(*shape, dtype=torch.float16):
    """A tensor the argument checks take for a CUDA one (no data, no GPU)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        return torch.empty(*shape, dtype=dtype, device="cuda")


def test_expressions_that_read_the_lengths_or_packed_shards_are_refused():
    q = fake_cuda(1, 16, 2, 64)
    bias = fake_cuda(2, 63, dtype=torch.float32)

    def rel(score, b, h, q_idx, kv_idx, seqlen_q, seqlen_k):
        return score + bias[h, q_idx - kv_idx + seqlen_k - 1]

    def rel_fixed(score, b, h, q_idx, kv_idx, seqlen_q, seqlen_k):  # takes them, reads none
        return score + bias[h, q_idx - kv_idx + 31]

    for mods in (dict(score_mod="s + bias[h, q - k + seqlen_k - 1]", aux={"bias": bias}),
                 dict(mask_mod="q < seqlen_q - 4"), dict(score_mod=rel)):
        with pytest.raises(ValueError, match="reads seqlen_q or seqlen_k.*not the whole "
                                             "sequence's; write the length"):
            cp.context_parallel_attention(q, q, q, **mods)
    with pytest.raises(ValueError, match="packed sequences takes no expressions"):
        cp.context_parallel_attention(q[0], q[0], q[0], cu_seqlens=[0, 32],
                                      mask_mod="q >= k")
    # flashgen.attention's checks
    with pytest.raises(ValueError, match="replaces softcap"):
        cp.context_parallel_attention(q, q, q, softcap=30.0, score_mod="s * 2.0")
    with pytest.raises(ValueError, match="aux: bias given, but no score_mod or mask_mod"):
        cp.context_parallel_attention(q, q, q, aux={"bias": bias})
    with pytest.raises(ValueError, match="score_mod: column"):
        cp.context_parallel_attention(q, q, q, score_mod="s + ;")
    # what passes reaches the group (none here): names that merely contain
    # seqlen_q or seqlen_k are not the lengths
    for mods in (dict(score_mod=rel_fixed),
                 dict(score_mod="s + seqlen_q2[h, q - k + 31]", aux={"seqlen_q2": bias}),
                 dict(mask_mod="q >= k", score_mod=None)):
        with pytest.raises(RuntimeError, match="torch.distributed is not initialized"):
            cp.context_parallel_attention(q, q, q, **mods)


def test_pairs_join_only_where_nothing_reads_the_positions():
    ring, shape = types.SimpleNamespace(rank=0, size=2), cp._Dense(8, 2)
    exprs = ("s + 1.0", "", "", None)
    # rank 0 (chunks 0, 3) with rank 1's K/V (chunks 1, 2), no mask: one call
    assert len(cp._step_calls(ring, shape, 1, False, None, 0.0, None, None)) == 1
    calls = cp._step_calls(ring, shape, 1, False, None, 0.0, None, exprs)
    assert [(a, b) for _, _, _, a, b in calls] == [(0, 1), (0, 2), (3, 1), (3, 2)]
    assert all(len(qs) == len(ks) == 1 for qs, ks, *_ in calls)


class ThreadRing:
    """The ranks of a group as threads of one process: a rank's n-th
    exchange sends to the next rank's n-th and receives the previous rank's
    (NCCL matches peer-to-peer operations in their order)."""

    def __init__(self, rank, size, boxes):
        self.rank, self.size, self.boxes, self.count = rank, size, boxes, 0

    def exchange(self, tensors):
        n, self.count = self.count, self.count + 1
        self.boxes[(self.rank + 1) % self.size, n].put([t.detach().clone() for t in tensors])
        received = [torch.empty_like(t) for t in tensors]
        return received, [(self.boxes[self.rank, n], received)]

    @staticmethod
    def wait(works):
        for box, received in works:
            for t, got in zip(received, box.get(timeout=60)):
                t.copy_(got)


def in_threads(world, rank):
    """rank(r, ring) run by `world` threads over a ThreadRing; their results
    in rank order (an exception in a rank is raised here)."""
    boxes = {(r, m): queue.Queue() for r in range(world) for m in range(4 * world)}
    results = [None] * world

    def run(r):
        try:
            results[r] = rank(r, ThreadRing(r, world, boxes))
        except Exception as e:  # raised below, in the test's thread
            results[r] = e

    threads = [threading.Thread(target=run, args=(r,), daemon=True) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    for r in results:
        if isinstance(r, Exception):
            raise r
    assert None not in results, "a rank did not finish"
    return results


class Kernels:
    """Stand-ins for the kernels' forward and backward (_ops.run_forward,
    run_backward) in fp64: a call's mask at its positions (top-left, as the
    ring's calls), then the expressions at the global positions, meanings[text]
    saying what each text computes; the backward's P from the lse it is given
    (-inf: a row that sees nothing, P = 0). Records each call's (positions,
    rows, keys)."""

    def __init__(self, meanings):
        self.meanings, self.calls = meanings, []

    def scores(self, q, k, mask, left, right, scale, positions, exprs):
        """t (B, H, L, M) of a call, -inf where hidden, and what it sees."""
        (B, L, H, _), M = q.shape, k.shape[1]
        t = torch.einsum("bihd,bjhd->bhij", q, k) * scale
        ok = call_visible((mask, left, right), L, M, *positions).expand(B, H, L, M)
        if exprs is not None:
            score_mod, mask_mod, names, aux = exprs
            named = dict(zip(names.split(","), aux)) if names else {}
            b, h = torch.arange(B)[:, None, None, None], torch.arange(H)[None, :, None, None]
            i = torch.arange(L)[:, None] + positions[0]
            j = torch.arange(M)[None, :] + positions[1]
            if score_mod:
                t = self.meanings[score_mod](t, b, h, i, j, named)
            if mask_mod:
                ok = ok & self.meanings[mask_mod](b, h, i, j, named)
        return t.masked_fill(~ok, float("-inf")), ok

    def forward(self, q, k, v, mask, align, left, right, dropout_p, scale, *_, rng=None,
                positions=(0, 0), variants=None, exprs=None):
        assert align == cp._TOP_LEFT and dropout_p == 0
        assert variants is None or variants[2] is None  # the sinks enter after the merge
        self.calls.append((positions, q.shape[1], k.shape[1]))
        t, _ = self.scores(q.double(), k.double(), mask, left, right, scale, positions, exprs)
        lse = torch.logsumexp(t, -1)
        p = torch.exp(t - lse[..., None]).nan_to_num(0.0)
        out = torch.einsum("bhij,bjhd->bihd", p, v.double())
        return out.to(q.dtype), lse.float(), 0, 0

    def backward(self, d_out, q, k, v, out, lse, seed, offset, mask, align, left, right,
                 dropout_p, scale, *_, positions=(0, 0), variants=None, exprs=None,
                 aux_grads=0):
        with torch.enable_grad():
            qd, kd = (t.detach().double().requires_grad_() for t in (q, k))
            aux = [a.detach().double().requires_grad_() if aux_grads >> n & 1 else a
                   for n, a in enumerate(exprs[3] or ())] if exprs is not None else []
            t, ok = self.scores(qd, kd, mask, left, right, scale, positions,
                                None if exprs is None else exprs[:3] + (aux,))
            lse = lse.double()
            p = torch.exp(t.detach() - torch.where(torch.isinf(lse), float("inf"), lse)[..., None])
            do = d_out.double()
            dv = torch.einsum("bhij,bihd->bjhd", p, do)
            dp = torch.einsum("bihd,bjhd->bhij", do, v.double())
            ds = p * (dp - (do * out.double()).sum(-1).transpose(1, 2)[..., None])
            asked = [n for n in range(len(aux)) if aux_grads >> n & 1]
            grads = torch.autograd.grad(t, [qd, kd] + [aux[n] for n in asked],
                                        grad_outputs=ds.where(ok, 0))
        d_aux = [None] * len(aux)
        for n, grad in zip(asked, grads[2:]):
            d_aux[n] = grad.float()
        more = (d_aux,) if exprs is not None else ()
        return (grads[0].to(q.dtype), grads[1].to(k.dtype), dv.to(v.dtype), None) + more


def expression_mods(kind, bias, doc, C):
    """score_mod, mask_mod and aux of a relative bias bias[h, q - k + C] and
    documents doc (-1: a row that sees no key): strings, or functions that
    translate into the same with the tensors named t0, t1; and what the
    stand-in kernels compute for the texts."""
    if kind == "strings":
        mods = dict(score_mod=f"s + bias[h, q - k + {C}]",
                    mask_mod="doc[q] == doc[k] && doc[q] >= 0", aux={"bias": bias, "doc": doc})
        b_name, d_name = "bias", "doc"
    else:
        def rel_bias(score, b, h, q_idx, kv_idx):
            return score + bias[h, q_idx - kv_idx + C]

        def documents(b, h, q_idx, kv_idx):
            return (doc[q_idx] == doc[kv_idx]) & (doc[q_idx] >= 0)

        mods = dict(score_mod=rel_bias, mask_mod=documents)
        b_name, d_name = "t0", "t1"

    def score(s, b, h, i, j, aux):
        return s + aux[b_name][h, i - j + C]

    def mask(b, h, i, j, aux):
        return (aux[d_name][i] == aux[d_name][j]) & (aux[d_name][i] >= 0)

    return mods, {f"s + {b_name}[h, q - k + {C}]": score,
                  f"{d_name}[q] == {d_name}[k] && {d_name}[q] >= 0": mask}


def whole_attention(q, k, v, d_out, bias, doc, sinks, causal, scale):
    """fp64 attention over the whole sequence with the relative bias, the
    documents' mask and the sinks (or None), and the gradients of q, k, v,
    the bias and the sinks: (out, lse, dq, dk, dv, d_bias[, d_sinks])."""
    B, S, H, _ = q.shape
    leaves = [t.detach().double().requires_grad_() for t in (q, k, v, bias, sinks)
              if t is not None]
    i, j = torch.arange(S)[:, None], torch.arange(S)[None, :]
    ok = (doc[i] == doc[j]) & (doc[i] >= 0)
    if causal:
        ok &= j <= i
    t = torch.einsum("bihd,bjhd->bhij", leaves[0], leaves[1]) * scale + \
        leaves[3][torch.arange(H)[:, None, None], i - j + S - 1]
    sink = leaves[4].view(1, H, 1, 1) if sinks is not None else torch.tensor(float("-inf"))
    t = torch.cat([t.masked_fill(~ok, float("-inf")), sink.expand(B, H, S, 1)], -1)
    lse = torch.logsumexp(t.detach(), -1)
    # a row that sees nothing, not even a sink, gives 0 (a softmax over
    # zeros that no key weighs)
    p = torch.softmax(t.masked_fill(torch.isinf(lse)[..., None], 0.0), -1)[..., :S] * ok
    out = torch.einsum("bhij,bjhd->bihd", p, leaves[2])
    grads = torch.autograd.grad((out * d_out.double()).sum(), leaves)
    return (out.detach(), lse) + grads


@pytest.mark.parametrize("world, balanced, causal, with_sinks", [
    (1, True, True, True), (2, True, False, False), (2, False, True, True),
    (3, True, True, False), (3, False, False, True), (4, True, False, True)])
@pytest.mark.parametrize("kind", ["strings", "functions"])
def test_expressions_on_the_ring_are_the_whole_call(monkeypatch, world, balanced, causal,
                                                    with_sinks, kind):
    n = 2 * world if balanced else world
    size, H, D, scale = 6, 2, 4, 0.5
    S = size * n
    g = torch.Generator().manual_seed(world * 10 + balanced)
    q, k, v, d_out = (torch.randn(1, S, H, D, generator=g) for _ in range(4))
    bias, sinks = torch.randn(H, 2 * S - 1, generator=g), torch.randn(H, generator=g)
    # a document of exactly the first chunk (whole pairs hidden), one ending
    # inside a chunk, rows that see no key
    doc = torch.full((S,), 2, dtype=torch.int32)
    doc[:size], doc[size:2 * size + 2], doc[-2:] = 0, 1, -1
    kernels = Kernels(expression_mods(kind, None, None, S - 1)[1])
    monkeypatch.setattr(cp._ops, "run_forward", kernels.forward)
    monkeypatch.setattr(cp._ops, "run_backward", kernels.backward)
    # CPU tensors in place of CUDA ones, a group of threads in place of NCCL
    monkeypatch.setattr(cp._checks, "tensors", lambda *args, **kwargs: None)
    monkeypatch.setattr(cp, "_check_group", lambda group, q: None)
    monkeypatch.setattr(cp, "_Ring", lambda group: group)
    monkeypatch.setattr(cp, "_agreed", lambda ring, q, local, dropout_p: (0, 0))

    def rank(r, ring):
        local = [cp.shard(t, r, world, balanced=balanced) for t in (q, k, v, d_out)]
        ql, kl, vl = (t.requires_grad_() for t in local[:3])
        mine = [t.clone().requires_grad_() for t in (bias, sinks)]
        mods, _ = expression_mods(kind, mine[0], doc, S - 1)
        out, lse = cp.context_parallel_attention(
            ql, kl, vl, ring, causal=causal, balanced=balanced, softmax_scale=scale,
            return_lse=True, sinks=mine[1] if with_sinks else None, **mods)
        out.backward(local[3])
        return (out.detach(), lse, ql.grad, kl.grad, vl.grad, mine[0].grad, mine[1].grad)

    per_rank = list(zip(*in_threads(world, rank)))
    got = [cp.unshard(list(per_rank[0]), balanced=balanced),
           cp.unshard(list(per_rank[1]), dim=2, balanced=balanced)]
    got += [cp.unshard(list(x), balanced=balanced) for x in per_rank[2:5]]
    got += [sum(per_rank[5])]  # the group's sums, as an all-reduce gives them
    if with_sinks:
        got += [sum(per_rank[6])]
    want = whole_attention(q, k, v, d_out, bias, doc, sinks if with_sinks else None, causal,
                           scale)
    for name, x, y in zip(("out", "lse", "dq", "dk", "dv", "d_bias", "d_sinks"), got, want):
        torch.testing.assert_close(x.double(), y, rtol=1e-5, atol=1e-5, msg=name)
    # every pair a call of its own, at its chunks' positions
    assert all(rows == keys == size and pq % size == pk % size == 0
               for (pq, pk), rows, keys in kernels.calls)


@pytest.mark.parametrize("world, balanced, causal, with_sinks", [
    (1, True, False, True), (2, True, True, True), (3, False, False, False),
    (2, False, True, False)])
def test_a_value_head_dim_of_its_own_on_the_ring(monkeypatch, world, balanced, causal,
                                                 with_sinks):
    """v's head dim (6) beside q's and k's (4): the ranks' outputs and their
    merge take v's, the gradients each tensor's shape, the ring carries K
    and V of their own widths, and the whole is the whole sequence's."""
    n = 2 * world if balanced else world
    size, H, D, Dv, scale = 6, 2, 4, 6, 0.5
    S = size * n
    g = torch.Generator().manual_seed(40 + world)
    q, k = (torch.randn(1, S, H, D, generator=g) for _ in range(2))
    v, d_out = (torch.randn(1, S, H, Dv, generator=g) for _ in range(2))
    sinks = torch.randn(H, generator=g)
    kernels = Kernels({})
    monkeypatch.setattr(cp._ops, "run_forward", kernels.forward)
    monkeypatch.setattr(cp._ops, "run_backward", kernels.backward)
    monkeypatch.setattr(cp._checks, "tensors", lambda *args, **kwargs: None)
    monkeypatch.setattr(cp, "_check_group", lambda group, q: None)
    monkeypatch.setattr(cp, "_Ring", lambda group: group)
    monkeypatch.setattr(cp, "_agreed", lambda ring, q, local, dropout_p: (0, 0))

    def rank(r, ring):
        local = [cp.shard(t, r, world, balanced=balanced) for t in (q, k, v, d_out)]
        ql, kl, vl = (t.requires_grad_() for t in local[:3])
        mine = sinks.clone().requires_grad_()
        out, lse = cp.context_parallel_attention(
            ql, kl, vl, ring, causal=causal, balanced=balanced, softmax_scale=scale,
            return_lse=True, sinks=mine if with_sinks else None)
        assert out.shape == (1, S // world, H, Dv)  # (B, L, Hq, Dv)
        out.backward(local[3])
        return out.detach(), lse, ql.grad, kl.grad, vl.grad, mine.grad

    per_rank = list(zip(*in_threads(world, rank)))
    got = [cp.unshard(list(per_rank[0]), balanced=balanced),
           cp.unshard(list(per_rank[1]), dim=2, balanced=balanced)]
    got += [cp.unshard(list(x), balanced=balanced) for x in per_rank[2:5]]
    # one document, no bias: plain attention, with the sinks or without
    want = whole_attention(q, k, v, d_out, torch.zeros(H, 2 * S - 1),
                           torch.zeros(S, dtype=torch.int32), sinks if with_sinks else None,
                           causal, scale)
    want = list(want[:5]) + list(want[6:])  # the bias's gradient left out
    if with_sinks:
        got.append(sum(per_rank[5]))  # the group's sum, as an all-reduce gives it
    assert got[4].shape == v.shape
    for name, x, y in zip(("out", "lse", "dq", "dk", "dv", "d_sinks"), got, want):
        torch.testing.assert_close(x.double(), y, rtol=1e-5, atol=1e-5, msg=name)

"""Context parallelism: exact attention over sequences sharded across the ranks
of a torch.distributed NCCL group.

Each rank holds a shard of q, k and v along the sequence. K and V travel
around the ring of ranks (each rank sends its current K/V to the next and
receives the previous rank's, peer-to-peer, while it computes on the
current ones); a (query chunk, key chunk) pair runs as one flashgen call at
its positions in the whole sequence (the pairs that see every key, without
dropout or anything that reads the positions, as one call together), and
the partial outputs merge in fp32 through their log-sum-exps. The backward
sends K/V around the ring again, with the dK/dV accumulated so far one step
behind.

Sharding (shard, unshard, shard_varlen, unshard_varlen): the sequence is cut
into 2W equal chunks for W ranks and rank r holds chunks r and 2W-1-r
(balanced=True, the default), so that under a causal mask every rank has the
same work; with balanced=False rank r holds chunk r of W, and causal work
grows with the rank (rank r computes about 2r + 1 times rank 0's pairs, and
every step waits for the last rank: about half the ranks' time is idle).

    from flashgen import distributed as cp
    q_local = cp.shard(q, rank, world)                   # (B, S/W, H, D)
    out_local = cp.context_parallel_attention(q_local, k_local, v_local, group, causal=True)
    out = cp.unshard([...every rank's out_local...])     # (B, S, H, D)
"""
import re

from ._requires import require

torch = require("torch", "flashgen.distributed")
import torch.distributed as dist  # noqa: E402

from . import _api, _checks, _ops  # noqa: E402
from ._chunks import (WINDOW, boundaries, chunk_ids, chunks_of, pair_mask,  # noqa: E402
                      sequence_chunks, step_calls)
from ._native import ALIGNS  # noqa: E402

_HALF = (torch.float16, torch.bfloat16)
_TOP_LEFT = ALIGNS["top-left"]
# seqlen_q or seqlen_k in an expression's text (the language has no strings,
# and no aux tensor takes these names)
_SEQLEN = re.compile(r"(?<![A-Za-z0-9_])seqlen_[qk](?![A-Za-z0-9_])")


# ---- sharding --------------------------------------------------------------------

def shard(x, rank, world_size, *, dim=1, balanced=True):
    """rank's shard of x along dim (the sequence of (B, S, H, D)): its chunks
    concatenated in chunk_ids' order. The length must divide into the
    chunks."""
    n = chunks_of(world_size, balanced)
    ids = chunk_ids(rank, world_size, balanced)
    if x.shape[dim] % n:
        raise ValueError(f"x: length {x.shape[dim]} along dim {dim} does not divide into {n} "
                         f"equal chunks ({world_size} ranks{', balanced' if balanced else ''})")
    parts = x.chunk(n, dim)
    return torch.cat([parts[c] for c in ids], dim)


def unshard(shards, *, dim=1, balanced=True):
    """The whole tensor from every rank's shard, listed in rank order (the
    inverse of shard)."""
    world_size = len(shards)
    pieces = [None] * chunks_of(world_size, balanced)
    for rank, s in enumerate(shards):
        ids = chunk_ids(rank, world_size, balanced)
        for c, part in zip(ids, s.chunk(len(ids), dim)):
            pieces[c] = part
    return torch.cat(pieces, dim)


def _shard_rows(cu_seqlens, rank, world_size, balanced):
    """The rows of packed sequences at cu_seqlens that rank's shard holds, in
    its order."""
    cu = boundaries(cu_seqlens)
    sizes = sequence_chunks(cu, world_size, balanced)
    rows = [torch.arange(start + c * size, start + (c + 1) * size)
            for c in chunk_ids(rank, world_size, balanced) for start, size in zip(cu, sizes)]
    return torch.cat(rows) if rows else torch.zeros(0, dtype=torch.long), cu[-1]


def shard_varlen(x, cu_seqlens, rank, world_size, *, balanced=True):
    """rank's shard of packed x (total, ...) with sequences at cu_seqlens
    (host list or tensor; every length divisible into the chunks): for each of
    its chunks in chunk_ids' order, that chunk of every sequence, packed.
    Shard position ids the same way for rotary embeddings."""
    rows, total = _shard_rows(cu_seqlens, rank, world_size, balanced)
    if total > x.shape[0]:  # checked here: an index past x is an assert on the GPU
        raise ValueError(f"x: {x.shape[0]} rows, but cu_seqlens ends at {total}")
    return x.index_select(0, rows.to(x.device))


def unshard_varlen(shards, cu_seqlens, *, balanced=True):
    """The packed tensor from every rank's shard_varlen shard, in rank order."""
    out = None
    for rank, s in enumerate(shards):
        rows, total = _shard_rows(cu_seqlens, rank, len(shards), balanced)
        if s.shape[0] != rows.shape[0]:
            raise ValueError(f"shards[{rank}]: {s.shape[0]} rows, but cu_seqlens gives rank "
                             f"{rank} {rows.shape[0]}")
        if out is None:
            out = s.new_empty((total,) + tuple(s.shape[1:]))
        out.index_copy_(0, rows.to(out.device), s)
    return out


# ---- the pairs of chunks ---------------------------------------------------------

def merge(acc_out, acc_lse, out, lse, rows):
    """Adds a call's (out, lse) into accumulators of at least fp32 (views,
    updated in place; they start at 0 and -inf) through the log-sum-exps;
    rows maps lse's shape onto out's rows. Rows no key has reached stay 0
    with lse -inf."""
    total = torch.logaddexp(acc_lse, lse)
    base = torch.where(torch.isinf(total), torch.zeros_like(total), total)
    acc_out.mul_(rows(torch.exp(acc_lse - base))).add_(out * rows(torch.exp(lse - base)))
    acc_lse.copy_(total)


class _Dense:
    """Shards (B, L, H, D) of chunks of `size` tokens; lse (B, H, L). Slots
    side by side are one sequence to a call: pairs that need no positions
    join."""

    def __init__(self, size, chunks):
        self.size, self.chunks = size, chunks

    def how(self, a, b, causal, window):
        return pair_mask(a, b, self.size, causal, window)

    def span(self, x, slots):
        return x[:, slots[0] * self.size:(slots[-1] + 1) * self.size]

    def lse_span(self, lse, slots):
        return lse[:, :, slots[0] * self.size:(slots[-1] + 1) * self.size]

    @staticmethod
    def empty_lse(q):
        return torch.full((q.shape[0], q.shape[2], q.shape[1]), float("-inf"), device=q.device)

    @staticmethod
    def rows(w):
        return w.transpose(1, 2).unsqueeze(-1)

    def forward(self, q, k, v, how, a, b, dropout_p, scale, rng, variants, exprs):
        mask, left, right = (how + (-1, -1))[:3]
        out, lse, _, _ = _ops.run_forward(q, k, v, mask, _TOP_LEFT, left, right, dropout_p, scale,
                                          0, 0, 0, 0, 0, rng=rng,
                                          positions=(a * self.size, b * self.size),
                                          variants=variants, exprs=exprs)
        return out, lse

    def backward(self, d_out, q, k, v, out, lse, how, a, b, dropout_p, scale, rng, deterministic,
                 variants, exprs, aux_grads):
        mask, left, right = (how + (-1, -1))[:3]
        return _ops.run_backward(d_out, q, k, v, out, lse, *rng, mask, _TOP_LEFT, left, right,
                                 dropout_p, scale, 0, 0, 0, 0, 0, deterministic,
                                 positions=(a * self.size, b * self.size), variants=variants,
                                 exprs=exprs, aux_grads=aux_grads)


class _Packed:
    """Shards (T, H, D) of shard_varlen's layout: `chunks` runs of `rows`
    rows, each every sequence's chunk at cu (int32 on the device); lse
    (H, T). Pairs need no positions: causal pairs are a chunk against itself
    (equal lengths), every other pair sees all or nothing. A call takes one
    slot of each (two slots are not one sequence's rows)."""

    def __init__(self, rows, chunks, cu, longest):
        self.rows_per, self.chunks, self.cu, self.longest = rows, chunks, cu, longest

    @staticmethod
    def how(a, b, causal, window):
        return pair_mask(a, b, 2, causal, None)  # any size: all or nothing, or the diagonal

    def span(self, x, slots):
        return x[slots[0] * self.rows_per:(slots[-1] + 1) * self.rows_per]

    def lse_span(self, lse, slots):
        return lse[:, slots[0] * self.rows_per:(slots[-1] + 1) * self.rows_per]

    @staticmethod
    def empty_lse(q):
        return torch.full((q.shape[1], q.shape[0]), float("-inf"), device=q.device)

    @staticmethod
    def rows(w):
        return w.t().unsqueeze(-1)

    def forward(self, q, k, v, how, a, b, dropout_p, scale, rng, variants, exprs):
        out, lse, _, _ = _ops.run_varlen_forward(q, k, v, self.cu, self.cu, None, self.longest,
                                                 self.longest, how[0], _TOP_LEFT, -1, -1, 0.0,
                                                 scale, rng=rng, variants=variants, exprs=exprs)
        return out, lse

    def backward(self, d_out, q, k, v, out, lse, how, a, b, dropout_p, scale, rng, deterministic,
                 variants, exprs, aux_grads):
        return _ops.run_varlen_backward(d_out, q, k, v, out, lse, self.cu, self.cu, None,
                                        self.longest, self.longest, *rng, how[0], _TOP_LEFT, -1,
                                        -1, 0.0, scale, deterministic, variants=variants,
                                        exprs=exprs, aux_grads=aux_grads)


# ---- the ring --------------------------------------------------------------------

class _Ring:
    """The ranks of a group in a ring: exchange() starts sending tensors to
    the next rank and receiving as many from the previous, as one batch of
    NCCL peer-to-peer operations (NCCL runs them on its own stream, after
    the work queued so far on the current one); wait() makes the current
    stream wait for them."""

    def __init__(self, group):
        self.group = group
        self.rank, self.size = dist.get_rank(group), dist.get_world_size(group)
        self.next = dist.get_global_rank(group, (self.rank + 1) % self.size)
        self.prev = dist.get_global_rank(group, (self.rank - 1) % self.size)

    def exchange(self, tensors):
        received = [torch.empty_like(t) for t in tensors]
        ops = [dist.P2POp(dist.isend, t, self.next, self.group) for t in tensors]
        ops += [dist.P2POp(dist.irecv, t, self.prev, self.group) for t in received]
        return received, dist.batch_isend_irecv(ops)

    @staticmethod
    def wait(works):
        for w in works:
            w.wait()


def _step_calls(ring, shape, step, causal, window, dropout_p, variants, exprs):
    """The calls of a ring step (step_calls) over this rank's chunks and
    those of rank - step, whose K and V it holds then. Chunks side by side
    join only where nothing depends on the positions (ALiBi's distances and
    the expressions' q and k do)."""
    balanced = shape.chunks == 2
    src = (ring.rank - step) % ring.size
    positional = (variants is not None and variants[1] is not None) or exprs is not None
    return step_calls(chunk_ids(ring.rank, ring.size, balanced),
                      chunk_ids(src, ring.size, balanced),
                      lambda a, b: shape.how(a, b, causal, window),
                      isinstance(shape, _Dense) and dropout_p == 0 and not positional)


def _fold_sinks(out, lse, sinks, rows):
    """The sinks folded into a merged (out fp32, lse): each row's
    denominator gains e^sink[h] once, lse' = logaddexp(lse, sink),
    out' = out·e^(lse − lse'). A row that saw no key keeps out 0, lse sink."""
    sink = sinks.view(1, -1, 1) if lse.dim() == 3 else sinks.view(-1, 1)
    total = torch.logaddexp(lse, sink.expand_as(lse))
    out.mul_(rows(torch.exp(lse - total)))
    lse.copy_(total)


def _ring_forward(ring, shape, q, k, v, causal, window, dropout_p, scale, rng, variants, exprs):
    """This rank's (out, lse): every step's calls merged into fp32. out has
    q's rows and v's head dim: (B, L, Hq, Dv) or (T, Hq, Dv)."""
    out = torch.zeros(q.shape[:-1] + v.shape[-1:], dtype=torch.float32, device=q.device)
    lse = shape.empty_lse(q)
    kv = (k, v)
    for step in range(ring.size):
        if step + 1 < ring.size:
            incoming, works = ring.exchange(kv)
        for qs, ks, how, a, b in _step_calls(ring, shape, step, causal, window, dropout_p,
                                             variants, exprs):
            o, l = shape.forward(shape.span(q, qs), shape.span(kv[0], ks), shape.span(kv[1], ks),
                                 how, a, b, dropout_p, scale, rng, _without_sinks(variants),
                                 exprs)
            merge(shape.span(out, qs), shape.lse_span(lse, qs), o, l, shape.rows)
        if step + 1 < ring.size:
            ring.wait(works)
            kv = incoming
    # every chunk sees its own keys (the diagonal is in every mask), so every
    # row had calls: one left at 0 and -inf sees no key of the whole sequence
    # (a mask_mod hid them all), as in the single call
    if variants is not None and variants[2] is not None:
        _fold_sinks(out, lse, variants[2], shape.rows)
    return out.to(q.dtype), lse


def _without_sinks(variants):
    """The calls' variants: the cap and the slopes; the sinks enter once,
    after the merge (_fold_sinks)."""
    if variants is None or (not variants[0] and variants[1] is None):
        return None
    return variants[0], variants[1], None


def _sinks_grad(d_out, out, lse, sinks, shape):
    """dσ_h = −Σ e^(σ_h − lse)·rowsum(dO∘O) over this rank's rows (the
    other ranks' rows add theirs, as for any parameter the ranks share)."""
    d = (d_out.float() * out.float()).sum(-1)  # (B, L, H) or (T, H), lse's rows transposed
    d = d.transpose(1, 2) if lse.dim() == 3 else d.t()
    sink = sinks.view(1, -1, 1) if lse.dim() == 3 else sinks.view(-1, 1)
    terms = -torch.exp(sink - lse) * d
    return terms.sum(dim=(0, 2)) if lse.dim() == 3 else terms.sum(dim=1)


def _add_aux(total, grads):
    """A call's aux gradients (None where not asked for) added into the
    rank's sum so far (None before the first call)."""
    if total is None:
        return list(grads)
    return [t.add_(g) if t is not None else None for t, g in zip(total, grads)]


def _ring_backward(ring, shape, d_out, q, k, v, out, lse, causal, window, dropout_p, scale, rng,
                   deterministic, variants, exprs, aux_grads):
    """dq, dk, dv of this rank's shard and the aux gradients its calls give
    (a list, None where not asked for; None without aux_grads)."""
    dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    kv, dkv_works, d_aux = (k, v), None, None
    for step in range(ring.size):
        if step + 1 < ring.size:
            incoming, works = ring.exchange(kv)
        dk = torch.zeros(k.shape, dtype=torch.float32, device=k.device)
        dv = torch.zeros(v.shape, dtype=torch.float32, device=v.device)
        for qs, ks, how, a, b in _step_calls(ring, shape, step, causal, window, dropout_p,
                                             variants, exprs):
            g = shape.backward(shape.span(d_out, qs), shape.span(q, qs), shape.span(kv[0], ks),
                               shape.span(kv[1], ks), shape.span(out, qs),
                               shape.lse_span(lse, qs), how, a, b, dropout_p, scale, rng,
                               deterministic, _without_sinks(variants), exprs, aux_grads)
            shape.span(dq, qs).add_(g[0])
            shape.span(dk, ks).add_(g[1])
            shape.span(dv, ks).add_(g[2])
            if aux_grads:
                d_aux = _add_aux(d_aux, g[4])
        if dkv_works is not None:  # the block's gradients from the ranks before
            ring.wait(dkv_works)
            dk.add_(dkv[0])
            dv.add_(dkv[1])
        if ring.size > 1:  # on to the next rank; after the last step, to the owner
            dkv, dkv_works = ring.exchange((dk, dv))
        if step + 1 < ring.size:
            ring.wait(works)
            kv = incoming
    if dkv_works is not None:
        ring.wait(dkv_works)
        dk, dv = dkv
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), d_aux


class _RingAttention(torch.autograd.Function):
    """out and lse of this rank's shard; the sinks' lse is the one their
    backward reads (each call's P = e^(t − lse) then counts the sink once),
    and their gradient is this rank's rows'. exprs: (score_mod, mask_mod,
    aux_names) or None, the aux tensors after it; their gradients are the
    sums over this rank's calls."""

    @staticmethod
    def forward(ctx, q, k, v, sinks, ring, shape, causal, window, dropout_p, scale, rng,
                deterministic, cap, slopes, exprs, *aux):
        variants = None if not cap and slopes is None and sinks is None else (cap, slopes, sinks)
        call_exprs = None if exprs is None else exprs + (list(aux),)
        out, lse = _ring_forward(ring, shape, q, k, v, causal, window, dropout_p, scale, rng,
                                 variants, call_exprs)
        ctx.save_for_backward(q, k, v, out, lse, sinks, *aux)
        ctx.args = (ring, shape, causal, window, dropout_p, scale, rng, deterministic, variants)
        ctx.exprs, ctx.aux_grads = exprs, _ops._aux_grads(call_exprs)
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, d_out, _d_lse):
        q, k, v, out, lse, sinks, *aux = ctx.saved_tensors
        ring, shape, causal, window, dropout_p, scale, rng, deterministic, variants = ctx.args
        call_exprs = None if ctx.exprs is None else ctx.exprs + (aux,)
        d_out = d_out.contiguous()
        dq, dk, dv, d_aux = _ring_backward(ring, shape, d_out, q, k, v, out, lse, causal, window,
                                           dropout_p, scale, rng, deterministic, variants,
                                           call_exprs, ctx.aux_grads)
        d_sinks = None
        if sinks is not None and ctx.needs_input_grad[3]:
            d_sinks = _sinks_grad(d_out, out, lse, sinks, shape)
        return (dq, dk, dv, d_sinks) + (None,) * 11 + tuple(d_aux or (None,) * len(aux))


# ---- the call --------------------------------------------------------------------

def _agreed(ring, q, local, dropout_p):
    """Every rank's shard description `local` (ints) must be rank 0's; with
    dropout, rank 0's (seed, offset) for all. One all-gather (and a host
    sync) a call."""
    seed, offset = _ops._philox(q.device, dropout_p) if dropout_p > 0 else (0, 0)
    mine = list(local) + [seed - (1 << 64) if seed >= 1 << 63 else seed, offset]
    t = torch.tensor(mine, dtype=torch.int64, device=q.device)
    gathered = [torch.empty_like(t) for _ in range(ring.size)]
    dist.all_gather(gathered, t, group=ring.group)
    rows = [g.tolist() for g in gathered]
    for r, row in enumerate(rows):
        if row[:len(local)] != rows[0][:len(local)]:
            raise ValueError(f"q, k, v: rank {r}'s shards {tuple(row[:len(local)])} differ from "
                             f"rank 0's {tuple(rows[0][:len(local)])}; context parallelism "
                             "needs equal shards (and the same cu_seqlens) on every rank")
    s, o = rows[0][-2:]
    return s & ((1 << 64) - 1), o


def _modifiers(score_mod, mask_mod, aux, q, cap, alibi_slopes, packed):
    """The modifiers translated (a function traced once, here) and checked
    as flashgen.attention's, as the operators take them (score_mod,
    mask_mod, aux_names, aux), or None. The calls give them the whole
    sequence's q and k (the chunks' positions), but a chunk's lengths."""
    exprs = _api._translated(score_mod, mask_mod, aux, q)
    if exprs is None:
        return None
    _api._check_exprs(exprs, q, cap, alibi_slopes)
    if packed:
        raise ValueError("score_mod/mask_mod: context parallelism over packed sequences takes "
                         "no expressions (its chunk pairs carry no positions: q and k would "
                         "count from each chunk); use dense shards")
    for what, text in zip(("score_mod", "mask_mod"), exprs[:2]):
        if text and _SEQLEN.search(text):
            raise ValueError(f"{what}: {text!r} reads seqlen_q or seqlen_k, which under context "
                             "parallelism would be a chunk's length, not the whole sequence's; "
                             "write the length as a number")
    return _api._op_exprs(exprs)


def _check_group(group, q):
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("group: torch.distributed is not initialized "
                           "(dist.init_process_group(backend='nccl'))")
    backend = dist.get_backend(group)
    if backend != "nccl":
        raise ValueError(f"group: backend {backend!r}; context_parallel_attention needs NCCL")
    if q.device.type != "cuda" or q.device.index != torch.cuda.current_device():
        raise ValueError(f"q: on {q.device}, but this rank's CUDA device is "
                         f"cuda:{torch.cuda.current_device()} (torch.cuda.set_device)")


def context_parallel_attention(q, k, v, group=None, *, causal=False, align="bottom-right",
                               window=None, dropout_p=0.0, softmax_scale=None, balanced=True,
                               deterministic=False, cu_seqlens=None, return_lse=False,
                               softcap=None, alibi_slopes=None, sinks=None, score_mod=None,
                               mask_mod=None, aux=None):
    """Attention over a sequence sharded across the ranks of `group` (NCCL;
    None: the default group): q (B, L, Hq, D), k (B, L, Hkv, D) and v
    (B, L, Hkv, Dv) (Dv may differ from D: the output takes it), each
    rank's shard (shard() of the whole tensors, L = S / W on every rank), on
    this rank's CUDA device, fp16 or bf16. Returns this rank's shard of the
    output, and with return_lse the fp32 log-sum-exp (B, Hq, L) (not
    differentiable); differentiable in q, k and v.

    causal, window, dropout_p, softmax_scale and deterministic are
    flashgen.attention's, applied to the whole sequence: results, dropout's
    keep decisions included, do not depend on the number of ranks (with
    dropout the chunk length S / 2W, or S / W unbalanced, must be a multiple
    of 32). Queries and keys span the same sequence, so both alignments
    agree. balanced: the shards are shard(..., balanced=True)'s (rank r
    holds chunks r and 2W-1-r), else contiguous chunks.

    Packed sequences: q (T, Hq, D), k (T, Hkv, D) and v (T, Hkv, Dv), this
    rank's shard_varlen shard, with cu_seqlens the whole batch's boundaries
    (a host list or tensor, the same on every rank; every length divisible
    into the chunks); lse is then (Hq, T). Causal or not; windows and
    dropout need dense shards.

    softcap, alibi_slopes and sinks are flashgen.attention's, on the whole
    sequence: ALiBi's distances are the global positions' (dense shards
    only; slopes (Hq,) or (B, Hq)), and each row's sink enters its softmax
    once, after the ring's merge (the lse returned includes it). The sinks'
    gradient is this rank's rows' share, as for any parameter the ranks hold
    alike (sum it over the group with the other parameters' gradients).

    score_mod, mask_mod and aux are flashgen.attention's (strings or
    functions, translated once per call), on the whole sequence: q and k are
    the global positions, and the aux tensors are the whole sequence's, the
    same on every rank (dense shards only; an expression that reads
    seqlen_q or seqlen_k is refused: write the length). Every visible pair
    is then a call of its own. The float aux tensors' gradients are this
    rank's share, summed over its calls, to be summed over the group as the
    sinks' is."""
    packed = cu_seqlens is not None
    names = ("q", "k", "v")
    if packed:
        _checks.tensors(names, (q, k, v), "(total, H, D)", _HALF, rank=3)
        _checks.packed_shapes(q.shape, k.shape, v.shape)
        if q.shape[0] != k.shape[0]:
            raise ValueError(f"k: {k.shape[0]} tokens, but q has {q.shape[0]}; the shards of a "
                             "sequence hold as many queries as keys")
    else:
        _checks.tensors(names, (q, k, v), "bshd", _HALF)
        _checks.bshd_shapes(names, q.shape, k.shape, v.shape)
        if q.shape[1] != k.shape[1]:
            raise ValueError(f"k: {k.shape[1]} tokens a shard, but q has {q.shape[1]}; the "
                             "shards of a sequence hold as many queries as keys")
    mask, _, left, right, dropout_p, scale = _checks.options(causal, align, window, dropout_p,
                                                             softmax_scale)
    heads_q = q.shape[1] if packed else q.shape[2]
    cap = _checks.variants(softcap, alibi_slopes, sinks, q, 1 if packed else q.shape[0], heads_q,
                           torch.float32)
    if packed and alibi_slopes is not None:
        raise ValueError("alibi_slopes: context parallelism over packed sequences takes no "
                         "ALiBi (its chunk pairs carry no positions); use dense shards")
    exprs = _modifiers(score_mod, mask_mod, aux, q, cap, alibi_slopes, packed)
    window = (left, right) if mask == WINDOW else None
    causal = bool(causal)
    group = group if group is not None else dist.group.WORLD
    _check_group(group, q)
    ring = _Ring(group)
    chunks = 2 if balanced else 1
    if packed:
        if window is not None or dropout_p > 0:
            raise ValueError("window/dropout_p: context parallelism over packed sequences takes "
                             "causal or no mask, without dropout")
        cu = boundaries(cu_seqlens)
        sizes = sequence_chunks(cu, ring.size, balanced)
        if sum(sizes) * chunks != q.shape[0]:
            raise ValueError(f"q: {q.shape[0]} tokens, but cu_seqlens gives each of "
                             f"{ring.size} ranks {sum(sizes) * chunks}")
        cu_chunk = torch.tensor([0] + sizes, dtype=torch.int32).cumsum(0, dtype=torch.int32)
        shape = _Packed(sum(sizes), chunks, cu_chunk.to(q.device), max(sizes, default=0))
        local = [q.shape[0], q.shape[1], k.shape[1], q.shape[2], v.shape[2], len(cu), cu[-1]]
    else:
        if q.shape[1] % chunks:
            raise ValueError(f"q: {q.shape[1]} tokens a shard; balanced shards hold two equal "
                             "chunks (shard() makes them)")
        size = q.shape[1] // chunks
        if dropout_p > 0 and size % 32:
            raise ValueError(f"dropout_p: {dropout_p} with chunks of {size} tokens; dropout "
                             "needs chunks of a multiple of 32 tokens")
        shape = _Dense(size, chunks)
        local = list(q.shape) + list(k.shape) + [v.shape[3]]
    rng = _agreed(ring, q, local + [mask, left, right, chunks], dropout_p)
    k, v = k.contiguous(), v.contiguous()  # sent whole
    texts, tensors = (exprs[:3], exprs[3] or ()) if exprs is not None else (None, ())
    out, lse = _RingAttention.apply(q, k, v, sinks, ring, shape, causal, window, dropout_p, scale,
                                    rng, bool(deterministic), cap, alibi_slopes, texts, *tensors)
    return (out, lse) if return_lse else out

"""The chunks of a sequence sharded for context parallelism, and what a
query chunk sees of a key chunk: plain integer arithmetic, with no torch
import, so it is tested where PyTorch is not installed."""

NONE, CAUSAL, WINDOW = 0, 1, 2  # the operator's mask kinds


# ---- sharding --------------------------------------------------------------------

def chunk_ids(rank, world_size, balanced=True):
    """The chunks of the sequence that rank holds, in its shard's order: r and
    2W-1-r of 2W (balanced), or r of W."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank: {rank}; must be in 0..{world_size - 1}")
    return (rank, 2 * world_size - 1 - rank) if balanced else (rank,)


def chunks_of(world_size, balanced):
    """Chunks the sequence is cut into for world_size ranks."""
    return 2 * world_size if balanced else world_size


def boundaries(cu_seqlens):
    """cu_seqlens (a host list or tensor) as ints, checked."""
    cu = [int(x) for x in (cu_seqlens.tolist() if hasattr(cu_seqlens, "tolist") else cu_seqlens)]
    if not cu or cu[0] != 0 or any(b < a for a, b in zip(cu, cu[1:])):
        raise ValueError(f"cu_seqlens: {cu[:8]}{'...' if len(cu) > 8 else ''}; must start at 0 "
                         "and never decrease")
    return cu


def sequence_chunks(cu, world_size, balanced):
    """Every sequence's chunk length, checked to divide."""
    n = chunks_of(world_size, balanced)
    lengths = [b - a for a, b in zip(cu, cu[1:])]
    for i, length in enumerate(lengths):
        if length % n:
            raise ValueError(f"cu_seqlens: sequence {i} has {length} tokens, which do not "
                             f"divide into {n} equal chunks ({world_size} ranks"
                             f"{', balanced' if balanced else ''})")
    return [length // n for length in lengths]


def pair_mask(a, b, size, causal, window):
    """How query chunk a sees key chunk b (chunks of `size` tokens, equal
    global lengths): None (no key visible), (NONE,) (every key visible), or
    the mask of a call at the chunks' positions: (CAUSAL,) (a chunk against
    itself) or (WINDOW, window_left, window_right)."""
    lo_d = b * size - (a * size + size - 1)  # smallest j - i over the pair
    hi_d = b * size + size - 1 - a * size    # largest
    left, right = window if window is not None else (-1, -1)
    if causal:
        right = 0 if right < 0 else min(right, 0)
    if (left >= 0 and hi_d < -left) or (right >= 0 and lo_d > right):
        return None
    if (left < 0 or lo_d >= -left) and (right < 0 or hi_d <= right):
        return (NONE,)
    if window is None:
        return (CAUSAL,)
    return (WINDOW, left, right)


def step_calls(mine, theirs, how, join):
    """The calls of one ring step: this rank's query chunks `mine` against
    the key chunks it holds, `theirs` (both in shard order), how(a, b) saying
    what chunk a sees of chunk b (pair_mask). Each call is (q_slots, k_slots,
    how, a, b): ranges of slots in the shards, and the chunks of their first
    slots (the call's positions). With join (no dropout, and slots that make
    one sequence: positions then matter only where a mask does), the pairs
    that see every key run as one call when they fill a rectangle of slots;
    every other visible pair runs alone."""
    pairs = [(m, t, how(a, b)) for m, a in enumerate(mine) for t, b in enumerate(theirs)]
    full = {(m, t) for m, t, h in pairs if h == (NONE,)}
    calls, joined = [], set()
    if join and len(full) > 1:
        rows = sorted({m for m, _ in full})
        cols = sorted({t for _, t in full})
        if (len(full) == len(rows) * len(cols) and rows[-1] - rows[0] == len(rows) - 1
                and cols[-1] - cols[0] == len(cols) - 1):
            calls.append((range(rows[0], rows[-1] + 1), range(cols[0], cols[-1] + 1), (NONE,),
                          mine[rows[0]], theirs[cols[0]]))
            joined = full
    for m, t, h in pairs:
        if h is not None and (m, t) not in joined:
            calls.append((range(m, m + 1), range(t, t + 1), h, mine[m], theirs[t]))
    return calls

"""Context parallelism's chunk arithmetic (flashgen._chunks), which needs no
PyTorch: what a query chunk sees of a key chunk against every (query, key)
pair spelled out, the balanced sharding's equal causal work, and the
errors."""
import itertools

import pytest

from flashgen._chunks import (CAUSAL, NONE, WINDOW, boundaries, chunk_ids, chunks_of,
                              pair_mask, sequence_chunks, step_calls)


def visible(i, j, causal, window):
    """Whether query position i sees key position j in the whole sequence
    (equal query and key lengths, so both alignments put j == i on the
    diagonal)."""
    left, right = window if window is not None else (-1, -1)
    if causal and j > i:
        return False
    return (left < 0 or j >= i - left) and (right < 0 or j <= i + right)


def seen(how, i, j, a, b, size):
    """What the call pair_mask describes computes for (i, j) of chunks a, b:
    the mask at the chunks' positions."""
    if how is None:
        return False
    if how[0] == NONE:
        return True
    if how[0] == CAUSAL:
        return b * size + j <= a * size + i
    left, right = how[1], how[2]
    d = (b * size + j) - (a * size + i)
    return (left < 0 or d >= -left) and (right < 0 or d <= right)


MASKS = [(False, None), (True, None), (False, (5, 3)), (True, (9, 0)), (False, (0, 0)),
         (False, (-1, 7)), (False, (12, -1)), (True, (-1, 0))]


@pytest.mark.parametrize("causal, window", MASKS)
@pytest.mark.parametrize("size", [1, 4, 7])
def test_pair_mask_computes_every_pair_the_whole_call_sees(causal, window, size):
    for a, b in itertools.product(range(5), repeat=2):
        how = pair_mask(a, b, size, causal, window)
        want = [[visible(a * size + i, b * size + j, causal, window) for j in range(size)]
                for i in range(size)]
        got = [[seen(how, i, j, a, b, size) for j in range(size)] for i in range(size)]
        assert got == want, (a, b, how)
        # a call is made only where something is seen, unmasked where all is
        flat = [x for row in want for x in row]
        assert (how is None) == (not any(flat))
        assert (how == (NONE,)) == all(flat)
        if how is not None and how[0] == CAUSAL:
            assert a == b and causal and window is None
        if how is not None and how[0] == WINDOW:
            assert window is not None


def test_every_chunk_sees_its_own_keys():
    for causal, window in MASKS:
        for a in range(6):
            assert pair_mask(a, a, 8, causal, window) is not None


def causal_work(rank, world, balanced, size=16):
    """(query, key) pairs rank computes under a causal mask over a whole
    sequence of chunks_of(world) chunks."""
    work = 0
    for a in chunk_ids(rank, world, balanced):
        for src in range(world):
            for b in chunk_ids(src, world, balanced):
                how = pair_mask(a, b, size, True, None)
                work += 0 if how is None else size * size if how == (NONE,) else \
                    size * (size + 1) // 2
    return work


@pytest.mark.parametrize("world", [1, 2, 3, 4, 8])
def test_balanced_shards_share_causal_work_equally(world):
    balanced = [causal_work(r, world, True) for r in range(world)]
    assert len(set(balanced)) == 1
    whole = (2 * world * 16) * (2 * world * 16 + 1) // 2
    assert sum(balanced) == whole
    contiguous = [causal_work(r, world, False) for r in range(world)]
    assert sum(contiguous) == (world * 16) * (world * 16 + 1) // 2
    # rank r: r chunks before its own and its diagonal, about 2r + 1 times
    # rank 0's work
    assert contiguous == [r * 16 * 16 + 16 * 17 // 2 for r in range(world)]


@pytest.mark.parametrize("world", [1, 2, 4, 8])
@pytest.mark.parametrize("balanced", [True, False])
def test_every_chunk_held_once(world, balanced):
    held = sorted(c for r in range(world) for c in chunk_ids(r, world, balanced))
    assert held == list(range(chunks_of(world, balanced)))


def test_chunk_errors():
    with pytest.raises(ValueError, match="rank: 2; must be in 0..1"):
        chunk_ids(2, 2)
    with pytest.raises(ValueError, match="sequence 1 has 6 tokens.*8 equal chunks"):
        sequence_chunks([0, 16, 22], 4, True)
    assert sequence_chunks([0, 16, 16, 24], 4, False) == [4, 0, 2]
    with pytest.raises(ValueError, match="cu_seqlens.*start at 0"):
        boundaries([1, 4])
    with pytest.raises(ValueError, match="never decrease"):
        boundaries([0, 8, 4])
    assert boundaries((0, 4, 12)) == [0, 4, 12]


@pytest.mark.parametrize("causal, window", MASKS)
@pytest.mark.parametrize("world", [1, 2, 3, 4])
@pytest.mark.parametrize("balanced", [True, False])
def test_step_calls_cover_every_visible_pair_once(causal, window, world, balanced):
    size = 8
    for rank in range(world):
        mine = chunk_ids(rank, world, balanced)
        for src in range(world):
            theirs = chunk_ids(src, world, balanced)
            how = lambda a, b: pair_mask(a, b, size, causal, window)  # noqa: E731
            for join in (False, True):
                covered = []
                for qs, ks, h, a, b in step_calls(mine, theirs, how, join):
                    assert (a, b) == (mine[qs[0]], theirs[ks[0]])
                    if len(qs) * len(ks) > 1:  # joined: only pairs that see every key
                        assert join and h == (NONE,)
                        assert all(how(mine[m], theirs[t]) == (NONE,) for m in qs for t in ks)
                    else:
                        assert h == how(a, b)
                    covered += [(m, t) for m in qs for t in ks]
                visible = [(m, t) for m in range(len(mine)) for t in range(len(theirs))
                           if how(mine[m], theirs[t]) is not None]
                assert sorted(covered) == visible


def test_step_calls_join_what_sees_everything():
    # two ranks, balanced, rank 1 holding chunks 1 and 2 of 4
    causal = lambda a, b: pair_mask(a, b, 8, True, None)  # noqa: E731
    full = lambda a, b: pair_mask(a, b, 8, False, None)  # noqa: E731
    assert step_calls((1, 2), (0, 3), full, True) == [(range(0, 2), range(0, 2), (NONE,), 1, 0)]
    assert len(step_calls((1, 2), (0, 3), full, False)) == 4
    # K/V of rank 0 (chunks 0, 3): both query chunks see all of chunk 0, none of 3
    assert step_calls((1, 2), (0, 3), causal, True) == [(range(0, 2), range(0, 1), (NONE,), 1, 0)]
    # its own: the diagonals alone, chunk 2 sees all of chunk 1
    assert step_calls((1, 2), (1, 2), causal, True) == [
        (range(0, 1), range(0, 1), (CAUSAL,), 1, 1), (range(1, 2), range(0, 1), (NONE,), 2, 1),
        (range(1, 2), range(1, 2), (CAUSAL,), 2, 2)]

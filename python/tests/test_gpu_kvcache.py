"""flashgen.attention_with_kvcache on the GPU: a paged cache (page sizes 1,
3, 16, 64, 256, pages handed out shuffled) and a contiguous one against each
sequence's own fp64 attention, the new rows appended into the cache, split
counts agreeing within rounding, chunks of many queries (chunked prefill),
values of a head dim of their own (DeepSeek's 192/128 and others), the
operator under opcheck and torch.compile, split steps on two streams at once
and beside a replayed graph, and the argument errors."""
import pytest

from conftest import gpu_or_skip

pytestmark = pytest.mark.gpu
torch = gpu_or_skip()

import flashgen  # noqa: E402
import reference  # noqa: E402
from tensors import make_cache  # noqa: E402


CASES = [
    # page_size (0: contiguous), B, Sq, Hq, Hk, D, Dv, dtype, causal, window, lengths, new
    (16, 3, 1, 32, 8, 128, 128, torch.bfloat16, False, None, [1000, 1, 4000], 0),
    (1, 2, 2, 8, 2, 64, 64, torch.float16, True, None, [77, 300], 0),
    (3, 2, 4, 16, 2, 128, 128, torch.bfloat16, True, None, [200, 0], 2),
    (64, 2, 1, 8, 8, 128, 128, torch.float16, False, (64, 0), [500, 129], 1),
    (256, 2, 3, 64, 8, 128, 128, torch.bfloat16, True, None, [3000, 257], 0),
    (0, 3, 16, 4, 1, 256, 256, torch.float16, True, None, [700, 3, 0], 0),
    # values of a head dim of their own
    (64, 3, 1, 16, 1, 192, 128, torch.bfloat16, False, None, [1000, 0, 129], 0),
    (16, 2, 2, 8, 2, 64, 128, torch.float16, True, None, [300, 5], 2),
    (0, 2, 3, 8, 8, 128, 64, torch.bfloat16, True, (50, 0), [500, 17], 1),
    (7, 2, 1, 6, 3, 72, 40, torch.float16, False, None, [90, 2], 0),
    # chunked prefill: many queries a step (on an H100 the Hopper forward
    # takes those of no splits asked for), the chunk's rows appended
    (16, 2, 200, 16, 4, 128, 128, torch.bfloat16, True, None, [1000, 37], 200),
    (0, 2, 300, 8, 8, 64, 64, torch.float16, True, (128, 0), [500, 0], 300),
    (256, 1, 512, 32, 8, 128, 128, torch.bfloat16, True, None, [3000], 0),
]


@pytest.mark.parametrize("page_size, B, Sq, Hq, Hk, D, Dv, dtype, causal, window, lengths, new",
                         CASES)
def test_each_sequence_against_its_reference(page_size, B, Sq, Hq, Hk, D, Dv, dtype, causal,
                                             window, lengths, new):
    g = torch.Generator(device="cpu").manual_seed(3)
    S = max(lengths) + new + 5
    q = torch.randn(B, Sq, Hq, D, generator=g).to(dtype).cuda()
    k_full = torch.randn(B, S, Hk, D, generator=g).to(dtype).cuda()
    v_full = torch.randn(B, S, Hk, Dv, generator=g).to(dtype).cuda()
    cached = torch.tensor(lengths, dtype=torch.int32, device="cuda")
    if page_size:
        k_cache, v_cache, table = make_cache(k_full, v_full, lengths, new, page_size, g)
    else:
        table = None
        held = torch.arange(S, device="cuda")[None, :, None, None] < cached.view(-1, 1, 1, 1)
        k_cache = torch.where(held, k_full, float("nan")).to(dtype)
        v_cache = torch.where(held, v_full, float("nan")).to(dtype)
    k_new = torch.stack([k_full[b, n:n + new] for b, n in enumerate(lengths)]) if new else None
    v_new = torch.stack([v_full[b, n:n + new] for b, n in enumerate(lengths)]) if new else None
    outs = []
    for splits in (1, 3, 0):
        out, lse = flashgen.attention_with_kvcache(
            q, k_cache, v_cache, k_new, v_new, cache_seqlens=cached, block_table=table,
            causal=causal, window=window, num_splits=splits, return_lse=True)
        assert out.shape == (B, Sq, Hq, Dv) and lse.shape == (B, Hq, Sq)
        outs.append(out)
        for b, n in enumerate(lengths):
            keys = n + new
            ref, ref_lse = reference.attention(q[b:b + 1], k_full[b:b + 1, :keys],
                                               v_full[b:b + 1, :keys], causal=causal,
                                               window=window)
            lowp, _ = reference.attention(q[b:b + 1], k_full[b:b + 1, :keys],
                                          v_full[b:b + 1, :keys], causal=causal, window=window,
                                          dtype=dtype)
            floor = 1e-3 if dtype == torch.float16 else 8e-3
            err = reference.error(out[b:b + 1], ref)
            assert err <= 2 * reference.error(lowp, ref) + floor, f"splits {splits} seq {b}: {err}"
            finite = torch.isfinite(ref_lse)
            assert torch.equal(torch.isfinite(lse[b:b + 1]), finite)
            if finite.any():
                assert reference.error(lse[b:b + 1][finite], ref_lse[finite]) <= 1e-3
    assert reference.error(outs[1], outs[0]) <= 1e-2 and reference.error(outs[2], outs[0]) <= 1e-2
    if new:  # the new rows are in the cache
        for b, n in enumerate(lengths):
            for j in range(n, n + new):
                if page_size:
                    got_k = k_cache[table[b, j // page_size], j % page_size]
                    got_v = v_cache[table[b, j // page_size], j % page_size]
                else:
                    got_k, got_v = k_cache[b, j], v_cache[b, j]
                assert torch.equal(got_k, k_full[b, j]) and torch.equal(got_v, v_full[b, j])


def test_opcheck_and_compile():
    q = torch.randn(2, 1, 8, 64, device="cuda", dtype=torch.float16)
    k_cache = torch.randn(2, 100, 2, 64, device="cuda", dtype=torch.float16)
    v_cache = torch.randn_like(k_cache)
    k_new = torch.randn(2, 1, 2, 64, device="cuda", dtype=torch.float16)
    v_new = torch.randn_like(k_new)
    lengths = torch.tensor([50, 90], dtype=torch.int32, device="cuda")
    args = (q, k_cache, v_cache, k_new, v_new, lengths, None, 1, 0, -1, -1, 0.0, 0)
    torch.library.opcheck(torch.ops.flashgen.kvcache_forward.default, args)

    def step(q, k_cache, v_cache, k_new, v_new, lengths):
        return flashgen.attention_with_kvcache(q, k_cache, v_cache, k_new, v_new,
                                               cache_seqlens=lengths, causal=True)
    eager = step(q, k_cache, v_cache, k_new, v_new, lengths)
    compiled = torch.compile(step, fullgraph=True)(q, k_cache, v_cache, k_new, v_new, lengths)
    assert torch.equal(eager, compiled)


def test_varlen_opcheck_and_compile():
    q = torch.randn(30, 2, 64, device="cuda", dtype=torch.float16, requires_grad=True)
    k = torch.randn(45, 2, 64, device="cuda", dtype=torch.float16, requires_grad=True)
    v = torch.randn(45, 2, 64, device="cuda", dtype=torch.float16, requires_grad=True)
    cu_q = torch.tensor([0, 20, 30], dtype=torch.int32, device="cuda")
    cu_k = torch.tensor([0, 40, 45], dtype=torch.int32, device="cuda")
    args = (q, k, v, cu_q, cu_k, None, 20, 40, 1, 0, -1, -1, 0.0, 0.0, True)
    torch.library.opcheck(torch.ops.flashgen.varlen_forward.default, args)

    def f(q, k, v):
        return flashgen.attention_varlen(q, k, v, cu_q, cu_k, 20, 40, causal=True,
                                         deterministic=True)
    eager = f(q, k, v)
    compiled = torch.compile(f, fullgraph=True)(q, k, v)
    assert torch.equal(eager, compiled)
    d = torch.randn_like(eager)
    ge = torch.autograd.grad(eager, (q, k, v), d)
    gc = torch.autograd.grad(compiled, (q, k, v), d)
    assert all(torch.equal(a, b) for a, b in zip(ge, gc))


def test_bad_arguments():
    q = torch.randn(2, 1, 8, 64, device="cuda", dtype=torch.float16)
    pool = torch.randn(10, 16, 2, 64, device="cuda", dtype=torch.float16)
    table = torch.zeros(2, 4, dtype=torch.int32, device="cuda")
    with pytest.raises(ValueError, match="block_table: on cpu"):
        flashgen.attention_with_kvcache(q, pool, pool, block_table=table.cpu())
    with pytest.raises(TypeError, match="block_table: torch.int64"):
        flashgen.attention_with_kvcache(q, pool, pool, block_table=table.long())
    with pytest.raises(ValueError, match="k_cache: batch 10, but q has 2"):
        flashgen.attention_with_kvcache(q, pool, pool)
    with pytest.raises(ValueError, match="cache_seqlens: None"):
        flashgen.attention_with_kvcache(q, pool, pool, pool[:2, :1], pool[:2, :1],
                                        block_table=table)
    with pytest.raises(ValueError, match="num_splits"):
        flashgen.attention_with_kvcache(q, pool, pool, block_table=table, num_splits=500)
    with pytest.raises(ValueError, match="head dim 60"):
        flashgen.attention_with_kvcache(q[..., :60], pool[..., :60], pool[..., :60],
                                        block_table=table)
    spaced = torch.randn(10, 16, 2, 128, device="cuda", dtype=torch.float16)[..., ::2]
    with pytest.raises(ValueError, match="k_cache: strides"):
        flashgen.attention_with_kvcache(q, spaced, spaced, block_table=table)


@pytest.mark.parametrize("paged", [False, True])
def test_heads_first_layout_gives_the_same_step(paged):
    """layout="bhsd" (transformers' cache, (B, H, S, D); pages (P, H, page,
    D)): the same bits as the (B, S, H, D) call on the same memory, the new
    rows appended into the same places, out (B, Hq, Sq, Dv); repeated (its
    kept struct) and refused with a clear message for a bad layout."""
    g = torch.Generator(device="cuda").manual_seed(5)

    def randn(*shape):
        return torch.randn(*shape, device="cuda", dtype=torch.bfloat16, generator=g)
    q = randn(2, 8, 2, 128)                      # (B, Hq, Sq, D)
    shape = (12, 2, 16, 128) if paged else (2, 2, 96, 128)
    kc, vc = randn(*shape), randn(*shape)
    kn, vn = randn(2, 2, 2, 128), randn(2, 2, 2, 128)
    table = torch.randperm(12, device="cuda", dtype=torch.int32)[:12].view(2, 6) if paged \
        else None
    lens = torch.tensor([40, 77], device="cuda", dtype=torch.int32)
    kc2, vc2 = kc.clone(), vc.clone()
    outs = [flashgen.attention_with_kvcache(q, kc, vc, kn, vn, cache_seqlens=lens,
                                            block_table=table, causal=True, layout="bhsd")
            for _ in range(2)]
    ref = flashgen.attention_with_kvcache(*(t.transpose(1, 2) for t in (q, kc2, vc2, kn, vn)),
                                          cache_seqlens=lens, block_table=table, causal=True)
    for out in outs:
        assert out.shape == (2, 8, 2, 128)
        assert torch.equal(out.transpose(1, 2), ref)
    assert torch.equal(kc, kc2) and torch.equal(vc, vc2)
    with pytest.raises(ValueError, match="layout: 'sbhd'"):
        flashgen.attention_with_kvcache(q, kc, vc, cache_seqlens=lens, block_table=table,
                                        layout="sbhd")


def test_repeated_steps_skip_only_checks_that_hold():
    """A step shaped like an earlier one skips the checks; one whose tensors
    differ in strides, dtype or device, or whose options differ, is checked."""
    q = torch.randn(2, 1, 8, 64, device="cuda", dtype=torch.float16)
    pool = torch.randn(10, 16, 2, 64, device="cuda", dtype=torch.float16)
    table = torch.arange(8, dtype=torch.int32, device="cuda").reshape(2, 4)
    lens = torch.tensor([30, 64], dtype=torch.int32, device="cuda")
    first = flashgen.attention_with_kvcache(q, pool, pool, cache_seqlens=lens, block_table=table)
    again = flashgen.attention_with_kvcache(q, pool, pool, cache_seqlens=lens, block_table=table)
    assert torch.equal(first, again)
    spaced = torch.randn(10, 16, 2, 128, device="cuda", dtype=torch.float16)[..., ::2]
    with pytest.raises(ValueError, match="k_cache: strides"):
        flashgen.attention_with_kvcache(q, spaced, spaced, cache_seqlens=lens, block_table=table)
    with pytest.raises(TypeError, match="block_table: torch.int64"):
        flashgen.attention_with_kvcache(q, pool, pool, cache_seqlens=lens,
                                        block_table=table.long())
    with pytest.raises(ValueError, match="num_splits"):
        flashgen.attention_with_kvcache(q, pool, pool, cache_seqlens=lens, block_table=table,
                                        num_splits=500)


def test_steps_replayed_from_a_cuda_graph():
    """Split steps, with and without new rows (on sm_90 the step's kernel
    starts beside the append kernel that zeroes its counters and writes the
    rows), and a latent step: replayed from a CUDA graph several times, each
    replay equal to the eager step byte for byte, and the eager steps equal
    from call to call."""
    torch.manual_seed(0)
    q = torch.randn(2, 2, 32, 128, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(2, 4096, 8, 128, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    k_new = torch.randn(2, 2, 8, 128, device="cuda", dtype=torch.bfloat16)
    v_new = torch.randn_like(k_new)
    lens = torch.tensor([4000, 1234], dtype=torch.int32, device="cuda")
    latent = torch.randn(2, 3000, 1, 576, device="cuda", dtype=torch.bfloat16)
    q_latent = torch.randn(2, 1, 16, 576, device="cuda", dtype=torch.bfloat16)
    steps = [
        lambda: flashgen.attention_with_kvcache(q, k, v, k_new, v_new, cache_seqlens=lens,
                                                num_splits=8, causal=True),
        lambda: flashgen.attention_with_kvcache(q, k, v, cache_seqlens=lens, num_splits=5),
        lambda: flashgen.mla_with_kvcache(q_latent, latent, None, lens, 512, num_splits=7),
    ]
    for step in steps:
        eager = step()
        assert torch.equal(step(), eager)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            step()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            replayed = step()
        for _ in range(5):
            replayed.zero_()
            graph.replay()
            torch.cuda.synchronize()
            assert torch.equal(replayed, eager)


def test_split_steps_on_streams_at_once_and_beside_a_graph():
    """Split steps keep a workspace and turn counters per stream: short
    steps queued on two streams at once (8 splits of two key tiles, 64 query
    rows: counted, one launch each) each equal their step alone, bit for
    bit, and leave the counters 0; a step captured into a graph keeps none
    (the graph owns its workspace, and the combine kernel adds the parts),
    and its replays on one stream beside eager steps on another equal the
    eager step, bit for bit."""
    from flashgen import _ops
    torch.manual_seed(1)
    q1, q2 = (torch.randn(2, 1, 32, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    k = torch.randn(2, 1024, 8, 128, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    step = lambda q: flashgen.attention_with_kvcache(q, k, v, num_splits=8)  # noqa: E731
    alone = step(q1), step(q2)
    streams = torch.cuda.Stream(), torch.cuda.Stream()
    for s in streams:
        s.wait_stream(torch.cuda.current_stream())
    outs = [], []
    for _ in range(20):
        for i, s in enumerate(streams):
            with torch.cuda.stream(s):
                outs[i].append(step((q1, q2)[i]))
    torch.cuda.synchronize()
    for i in range(2):
        assert all(torch.equal(o, alone[i]) for o in outs[i]), f"stream {i}"
    kept = set(_ops._step_workspaces)
    for s in streams:
        _, counters = _ops._step_workspaces[(0, s.cuda_stream)]
        assert counters.numel() >= 2 * 32 and not counters.any()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        replayed = step(q1)
    assert set(_ops._step_workspaces) == kept
    beside = []
    streams[0].wait_stream(torch.cuda.current_stream())
    streams[1].wait_stream(torch.cuda.current_stream())
    for _ in range(10):
        with torch.cuda.stream(streams[0]):
            graph.replay()
        with torch.cuda.stream(streams[1]):
            beside.append(step(q2))
    torch.cuda.synchronize()
    assert torch.equal(replayed, alone[0])
    assert all(torch.equal(o, alone[1]) for o in beside)


def test_steps_that_do_not_fit(monkeypatch):
    """Rows past the cache: refused where the host knows them (the new rows,
    an int cache_seqlens) before anything is written; lengths in a tensor
    are clamped (nothing written past the cache's rows) and refused with
    FLASHGEN_DEBUG=1."""
    g = torch.Generator(device="cpu").manual_seed(5)
    make = lambda *shape: torch.randn(*shape, generator=g).half().cuda()
    q = make(2, 1, 8, 64)
    k_room, v_room = make(2, 110, 2, 64), make(2, 110, 2, 64)  # rows 100.. lie past the cache
    k_cache, v_cache = k_room[:, :100], v_room[:, :100]
    k_new, v_new = make(2, 5, 2, 64), make(2, 5, 2, 64)
    before = k_room.clone(), v_room.clone()
    with pytest.raises(ValueError, match="cache_seqlens: 98 and 5 new rows make 103 keys; the "
                                         "cache holds 100 rows per sequence"):
        flashgen.attention_with_kvcache(q, k_cache, v_cache, k_new, v_new, cache_seqlens=98)
    with pytest.raises(ValueError, match="cache_seqlens: 101; the cache holds 100 rows"):
        flashgen.attention_with_kvcache(q, k_cache, v_cache, cache_seqlens=101)
    lens = torch.tensor([98, 10], dtype=torch.int32, device="cuda")
    with pytest.raises(ValueError, match="k: 101 new rows; the cache holds 100 rows"):
        flashgen.attention_with_kvcache(q, k_cache, v_cache, make(2, 101, 2, 64),
                                        make(2, 101, 2, 64), cache_seqlens=lens)
    pool = make(10, 16, 2, 64)
    table = torch.arange(8, dtype=torch.int32, device="cuda").reshape(2, 4)
    with pytest.raises(ValueError, match=r"cache_seqlens: 62 and 5 new rows make 67 keys; a "
                                         r"sequence's 4 pages \(block_table\) of 16 rows hold 64"):
        flashgen.attention_with_kvcache(q, pool, pool, k_new, v_new, cache_seqlens=62,
                                        block_table=table)
    torch.cuda.synchronize()
    assert torch.equal(k_room, before[0]) and torch.equal(v_room, before[1])
    # lengths on the GPU: the rows that fit are written, none past the cache
    flashgen.attention_with_kvcache(q, k_cache, v_cache, k_new, v_new, cache_seqlens=lens)
    torch.cuda.synchronize()
    for room, new, old in ((k_room, k_new, before[0]), (v_room, v_new, before[1])):
        assert torch.equal(room[0, 98:100], new[0, :2]) and torch.equal(room[1, 10:15], new[1])
        assert torch.equal(room[:, 100:], old[:, 100:])
    # FLASHGEN_DEBUG=1 (a fresh context reads it) reads the lengths back
    monkeypatch.setenv("FLASHGEN_DEBUG", "1")
    monkeypatch.setattr(flashgen._native, "_devices", {})
    with pytest.raises(ValueError, match=r"cache_seqlens\[0\]: 98; with seqlen_new 5"):
        flashgen.attention_with_kvcache(q, k_cache, v_cache, k_new, v_new, cache_seqlens=lens)


def test_new_values_unlike_the_cache_are_refused_before_the_kernel():
    """New values whose head dim differs from the value cache's are a
    ValueError naming both, and nothing is written."""
    q = torch.randn(2, 1, 8, 192, device="cuda", dtype=torch.bfloat16)
    k_cache = torch.zeros(2, 64, 2, 192, device="cuda", dtype=torch.bfloat16)
    v_cache = torch.zeros(2, 64, 2, 128, device="cuda", dtype=torch.bfloat16)
    k_new = torch.randn(2, 1, 2, 192, device="cuda", dtype=torch.bfloat16)
    v_new = torch.randn(2, 1, 2, 192, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=r"v: value head dim 192, but v_cache has 128"):
        flashgen.attention_with_kvcache(q, k_cache, v_cache, k_new, v_new, cache_seqlens=3)
    torch.cuda.synchronize()
    assert not k_cache.any() and not v_cache.any()


@pytest.mark.parametrize("page_size, B, Sq, Hq, Hk, D, Dv, dtype, causal, lengths", [
    (64, 3, 1, 16, 1, 576, 512, torch.bfloat16, False, [1000, 1, 129]),
    (0, 2, 2, 128, 1, 576, 512, torch.bfloat16, True, [700, 33]),
    (16, 2, 2, 20, 1, 576, 512, torch.float16, True, [300, 77]),
    (3, 2, 1, 8, 2, 192, 128, torch.bfloat16, False, [90, 500]),
])
def test_latent_cache_against_its_reference(page_size, B, Sq, Hq, Hk, D, Dv, dtype, causal,
                                            lengths):
    """flashgen.mla_with_kvcache: V is the cache's first Dv columns; each
    sequence against fp64 attention with those keys and values."""
    g = torch.Generator(device="cpu").manual_seed(5)
    S = max(lengths) + 5
    q = torch.randn(B, Sq, Hq, D, generator=g).to(dtype).cuda()
    kv_full = torch.randn(B, S, Hk, D, generator=g).to(dtype).cuda()
    cached = torch.tensor(lengths, dtype=torch.int32, device="cuda")
    if page_size:
        kv, _, table = make_cache(kv_full, kv_full[..., :0], lengths, 0, page_size, g)
    else:
        table = None
        held = torch.arange(S, device="cuda")[None, :, None, None] < cached.view(-1, 1, 1, 1)
        kv = torch.where(held, kv_full, float("nan")).to(dtype)
    for splits in (1, 3, 0):
        out, lse = flashgen.mla_with_kvcache(q, kv, table, cached, Dv, causal=causal,
                                             num_splits=splits, return_lse=True)
        assert out.shape == (B, Sq, Hq, Dv) and lse.shape == (B, Hq, Sq)
        for b, n in enumerate(lengths):
            k, v = kv_full[b:b + 1, :n], kv_full[b:b + 1, :n, :, :Dv]
            ref, ref_lse = reference.attention(q[b:b + 1], k, v, causal=causal)
            lowp, _ = reference.attention(q[b:b + 1], k, v, causal=causal, dtype=dtype)
            floor = 1e-3 if dtype == torch.float16 else 8e-3
            err = reference.error(out[b:b + 1], ref)
            assert err <= 2 * reference.error(lowp, ref) + floor, f"splits {splits} seq {b}: {err}"
            assert reference.error(lse[b:b + 1], ref_lse) <= 1e-3


def test_latent_cache_opcheck_and_compile():
    """The latent step as an operator: opcheck, and torch.compile (fullgraph)
    against the eager call, byte for byte."""
    g = torch.Generator(device="cpu").manual_seed(7)
    q = torch.randn(2, 1, 16, 576, generator=g).to(torch.bfloat16).cuda()
    kv = torch.randn(8, 64, 1, 576, generator=g).to(torch.bfloat16).cuda()
    table = torch.randperm(8, generator=g).to(torch.int32).view(2, 4).cuda()
    lengths = torch.tensor([100, 256], dtype=torch.int32, device="cuda")
    args = (q, kv, lengths, table, 1, 0, -1, -1, 0.0, 0, 512)
    torch.library.opcheck(torch.ops.flashgen.mla_forward.default, args)

    def step(q, kv, table, lengths):
        return flashgen.mla_with_kvcache(q, kv, table, lengths, 512, causal=True,
                                         return_lse=True)
    eager = step(q, kv, table, lengths)
    compiled = torch.compile(step, fullgraph=True)(q, kv, table, lengths)
    assert all(torch.equal(a, b) for a, b in zip(eager, compiled))


def test_latent_cache_refusals():
    q = torch.randn(2, 1, 16, 576, device="cuda", dtype=torch.bfloat16)
    kv = torch.randn(2, 64, 1, 576, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=r"head_dim_v: 500; expected a multiple of 32 up to 512"):
        flashgen.mla_with_kvcache(q, kv, None, 3, 500)
    with pytest.raises(ValueError, match=r"kv_cache: head dim 512, but q has 576"):
        flashgen.mla_with_kvcache(q, kv[..., :512], None, 3, 512)
    with pytest.raises(ValueError, match=r"cache_seqlens: 65; the cache holds 64 rows"):
        flashgen.mla_with_kvcache(q, kv, None, 65, 512)

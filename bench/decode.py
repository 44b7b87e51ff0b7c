"""Decoding steps (flashgen.attention_with_kvcache) against the GPU's
device-to-device copy bandwidth measured in the same run: bf16, d 128, 32
query heads on 8 KV heads, one query per sequence, batch 1..64, context
1k..128k, a paged cache (page sizes 16, 64, 256 and 1, pages handed out in a
shuffled order) and a contiguous one. KV bytes read per second count K and V
of every sequence once (batch · context · 8 heads · 128 · 2 bytes · 2).
Calls are timed inside a CUDA graph (the kernels' time, without Python's)
and, for the paged cache of 16, also as plain calls; PyTorch's
scaled_dot_product_attention on the contiguous cache is the peer where it
fits in memory: as plain calls, and its cuDNN and flash backends inside a
CUDA graph like flashgen's steps (kernel time; the ratio is flashgen's speed
against the faster backend's, the issue's bar 1.0). A graph replays the same
call, so a cache that fits in the L2 may be read from it (the L2 is written
over after each cache is made, so what is there is what the calls left);
the contiguous rows also time calls that take copies of the cache in turn,
more than the L2 holds, as a model's layers read theirs ("a cache a call").

--grid: the other head layouts (64/8, 8/1, 128/128 beside 32/8) at four
shapes, and 1, 4 and 16 queries a step (no mask on either side), on the
contiguous cache beside SDPA's faster backend, both from CUDA graphs, and
the worst ratio over them.

usage: python3 bench/decode.py [--quick | --grid]  (the flashgen package importable, a GPU)
"""
import sys

from requires import torch_and_gpus  # bench/, the script's folder

torch = torch_and_gpus()
import torch.nn.functional as F  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402

import flashgen  # noqa: E402
from sdpa import time_ms  # noqa: E402

HQ, HKV, D = 32, 8, 128
MAX_TOKENS = 1 << 22  # batch · context: 16 GiB of K and V


def copy_bandwidth(gib=4):
    """Bytes moved per second (read + write) by a device-to-device copy."""
    n = gib << 30
    src = torch.empty(n, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = time_ms(lambda: dst.copy_(src), repeats=5)
    del src, dst
    return 2 * n / (ms * 1e-3)


def graph_ms(fn, calls=10):
    """Milliseconds per call of fn, replayed from a CUDA graph of `calls` calls."""
    return graph_ms_turns([fn], calls)


def graph_ms_turns(fns, calls=10):
    """Milliseconds per call, replayed from a CUDA graph of `calls` calls
    that take the functions fns in turn."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for fn in fns:
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(calls):
            fns[i % len(fns)]()
    return time_ms(graph.replay, repeats=2) / calls


def flush_l2():
    """Writes past the L2 cache, so that what a timing finds there is what
    the calls it times left, not what was written before them."""
    n = 4 * torch.cuda.get_device_properties(0).L2_cache_size
    torch.empty(n, dtype=torch.uint8, device="cuda").fill_(1)


def other_caches(*tensors):
    """Copies of a cache's tensors, so that calls taking them in turn (as a
    model's layers do) read more than the L2 holds, at least four caches in
    all; [] where that would take more than 8 GiB."""
    size = sum(t.nbytes for t in tensors)
    n = max(4, -(-4 * torch.cuda.get_device_properties(0).L2_cache_size // size))
    if n * size > 8 << 30:
        return []
    return [tuple(t.clone() for t in tensors) for _ in range(min(n, 10) - 1)]


def cache_of(batch, context, page, hkv=HKV):
    """K and V caches: pages (batch · context / page, page, hkv, D) and the
    shuffled block table, or (batch, context, hkv, D) when page is 0."""
    shape = (batch * context // page, page, hkv, D) if page else (batch, context, hkv, D)
    k = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
    table = None
    if page:
        table = torch.randperm(batch * context // page, device="cuda", dtype=torch.int32)
        table = table.view(batch, context // page)
    flush_l2()
    return k, v, table


def sdpa_graphs(q, k, v, others=()):
    """Milliseconds per call of SDPA over (B, S, H, D) q and the contiguous
    cache k, v (with others, (k, v) caches of the same shape: over each in
    turn), by backend ("cuDNN", "flash"), replayed from CUDA graphs; a
    backend that does not take the call is left out."""
    qt = q.transpose(1, 2)
    peers = [lambda kt=kt.transpose(1, 2), vt=vt.transpose(1, 2):
             F.scaled_dot_product_attention(qt, kt, vt, enable_gqa=True)
             for kt, vt in [(k, v), *others]]
    graphs = {}
    for name, backend in (("cuDNN", SDPBackend.CUDNN_ATTENTION),
                          ("flash", SDPBackend.FLASH_ATTENTION)):
        try:
            with sdpa_kernel(backend):
                graphs[name] = graph_ms_turns(peers)
        except RuntimeError:  # the backend does not take the call
            pass
    return graphs


def turns_line(q, k, v, lens, table=None):
    """Flashgen's and SDPA's graph times over the cache and copies of it in
    turn (other_caches), as text, and flashgen / the faster peer; ("", None)
    where there are no copies."""
    others = other_caches(k, v)
    if not others:
        return "", None
    steps = [lambda kc=kc, vc=vc: flashgen.attention_with_kvcache(q, kc, vc, cache_seqlens=lens,
                                                                 block_table=table)
             for kc, vc in [(k, v), *others]]
    ms = graph_ms_turns(steps)
    graphs = sdpa_graphs(q, k, v, others) if table is None else {}
    line = f" | a cache a call ({len(steps)}): {ms * 1e3:7.1f} us"
    for name, peer_ms in graphs.items():
        line += f" {name} {peer_ms * 1e3:7.1f} us"
    ratio = min(graphs.values()) / ms if graphs else None
    if ratio is not None:
        line += f" flashgen/best {ratio:5.2f}"
    del others, steps
    torch.cuda.empty_cache()
    return line, ratio


def grid():
    """Head layouts and queries a step beside SDPA's faster backend."""
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, flashgen "
          f"{flashgen.__version__}")
    print(f"bf16, d {D}, contiguous cache, no mask; kernel time from CUDA graphs (us); "
          "best / flashgen: SDPA's faster backend's time over flashgen's (bar: >= 1.0)")
    steps = [(hq, hkv, batch, context, 1) for hq, hkv in ((32, 8), (64, 8), (8, 1), (128, 128))
             for batch, context in ((1, 4096), (1, 32768), (16, 8192), (64, 4096))]
    steps += [(32, 8, batch, 8192, queries) for batch in (1, 16) for queries in (4, 16)]
    ratios, turn_ratios = [], []
    for hq, hkv, batch, context, queries in steps:
        k, v, _ = cache_of(batch, context, 0, hkv)
        q = torch.randn(batch, queries, hq, D, device="cuda", dtype=torch.bfloat16)
        lens = torch.full((batch,), context, device="cuda", dtype=torch.int32)
        ms = graph_ms(lambda: flashgen.attention_with_kvcache(q, k, v, cache_seqlens=lens))
        graphs = sdpa_graphs(q, k, v)
        line = (f"heads {hq:3d}/{hkv:<3d} batch {batch:3d} context {context:6d} queries "
                f"{queries:2d}: {ms * 1e3:8.1f} us")
        for name, peer_ms in graphs.items():
            line += f" | {name} {peer_ms * 1e3:8.1f} us"
        if graphs:
            ratios.append(min(graphs.values()) / ms)
            line += f" | best / flashgen {ratios[-1]:5.2f}"
        turns, ratio = turns_line(q, k, v, lens)
        if ratio is not None:
            turn_ratios.append(ratio)
        print(line + turns, flush=True)
        del k, v
        torch.cuda.empty_cache()
    if ratios:
        print(f"grid: best / flashgen from {min(ratios):.2f} to {max(ratios):.2f} over "
              f"{len(ratios)} steps")
    if turn_ratios:
        print(f"grid, a cache a call: best / flashgen from {min(turn_ratios):.2f} to "
              f"{max(turn_ratios):.2f} over {len(turn_ratios)} steps")


def main(quick=False):
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, flashgen "
          f"{flashgen.__version__}")
    copy = copy_bandwidth()
    print(f"device-to-device copy: {copy / 1e9:.0f} GB/s (read + write)")
    print(f"bf16, d {D}, {HQ}/{HKV} heads, 1 query per sequence; KV GB/s and its share of the "
          "copy's (bar: >= 0.85 from batch x context >= 64k, page 1 >= 0.60)")
    batches = (1, 8, 64) if quick else (1, 4, 16, 64)
    contexts = (4096, 131072) if quick else (1024, 4096, 16384, 32768, 131072)
    rows = []
    for page in (16, 64, 256, 1, 0):
        for batch in batches:
            for context in contexts:
                tokens = batch * context
                if tokens > MAX_TOKENS or (page and context % page):
                    continue
                k, v, table = cache_of(batch, context, page)
                q = torch.randn(batch, 1, HQ, D, device="cuda", dtype=torch.bfloat16)
                lens = torch.full((batch,), context, device="cuda", dtype=torch.int32)
                step = lambda: flashgen.attention_with_kvcache(q, k, v, cache_seqlens=lens,
                                                               block_table=table)
                ms = graph_ms(step)
                plain = time_ms(step, repeats=5) if page == 16 else None
                sdpa, graphs = None, {}
                if page == 0 and tokens <= MAX_TOKENS // 2:
                    kt, vt, qt = k.transpose(1, 2), v.transpose(1, 2), q.transpose(1, 2)
                    peer = lambda: F.scaled_dot_product_attention(qt, kt, vt, enable_gqa=True)
                    sdpa = time_ms(peer, repeats=5)
                    graphs = sdpa_graphs(q, k, v)
                kv_bytes = tokens * HKV * D * 2 * 2
                bw = kv_bytes / (ms * 1e-3)
                bar = tokens >= 65536
                line = (f"page {page if page else 'contiguous':>10} batch {batch:3d} context "
                        f"{context:6d}: {ms * 1e3:8.1f} us {bw / 1e9:6.0f} GB/s "
                        f"{bw / copy:5.2f} of copy{' (bar)' if bar else '      '}")
                if plain is not None:
                    line += f" | plain calls {plain * 1e3:8.1f} us {kv_bytes / (plain * 1e-3) / copy:5.2f}"
                if sdpa is not None:
                    line += f" | SDPA {sdpa * 1e3:8.1f} us {kv_bytes / (sdpa * 1e-3) / copy:5.2f}"
                for name, peer_ms in graphs.items():
                    line += f" | graph {name} {peer_ms * 1e3:7.1f} us"
                if graphs:
                    line += f" | flashgen/best {min(graphs.values()) / ms:5.2f}"
                    line += turns_line(q, k, v, lens)[0]
                print(line, flush=True)
                rows.append((page, tokens, bw / copy))
                del k, v, table
                torch.cuda.empty_cache()
    for page in (16, 64, 256, 1, 0):
        shares = [s for p, t, s in rows if p == page and t >= 65536]
        if shares:
            print(f"page {page if page else 'contiguous'}: from 64k tokens, worst {min(shares):.2f} "
                  f"and best {max(shares):.2f} of the copy bandwidth")


if __name__ == "__main__":
    if "--grid" in sys.argv[1:]:
        grid()
    else:
        main("--quick" in sys.argv[1:])

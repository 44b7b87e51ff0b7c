"""Chunked prefill over a KV cache (flashgen.attention_with_kvcache with many
queries a step, as serving engines run prefix caching and chunked prefill):
bf16, d 128, 32 query heads on 8 KV heads, a chunk of 1k queries per
sequence over 32k keys (causal, bottom-right), batch 1 and 4. The cache is
paged (pages of 16, 64 and 256 rows handed out in a shuffled order) or
contiguous; the call either finds the chunk's keys in the cache or appends
them (k, v) first. Beside it, in the same run: flashgen's dense call on the
same keys as plain tensors (attention, causal, bottom-right) and the
decoding family on the paged cache (num_splits 2 keeps the step there).
Calls are timed inside a CUDA graph, the best of three; TFLOP/s count the
keys each query sees.
The issue's bar: paged at least 0.9 of contiguous.

usage: python3 bench/prefill.py [--quick]  (the flashgen package importable, a GPU)
"""
import sys

from requires import torch_and_gpus  # bench/, the script's folder

torch = torch_and_gpus()
import flashgen  # noqa: E402
from decode import cache_of, graph_ms  # noqa: E402

HQ, HKV, D = 32, 8, 128
CHUNK, KEYS = 1024, 32768


def flops(batch):
    """4 · Hq · D per (query, key) pair a causal bottom-right query sees."""
    pairs = CHUNK * (KEYS - CHUNK) + CHUNK * (CHUNK + 1) // 2
    return 4 * batch * HQ * D * pairs


def best_ms(fn):
    """The fastest of three graph timings (the clocks move between them)."""
    return min(graph_ms(fn) for _ in range(3))


def main(quick=False):
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, flashgen "
          f"{flashgen.__version__}")
    print(f"bf16, d {D}, {HQ}/{HKV} heads, {CHUNK} queries over {KEYS} keys, causal; "
          "TFLOP/s (CUDA graph replay)")
    for batch in (1,) if quick else (1, 4):
        q = torch.randn(batch, CHUNK, HQ, D, device="cuda", dtype=torch.bfloat16)
        new_k = torch.randn(batch, CHUNK, HKV, D, device="cuda", dtype=torch.bfloat16)
        new_v = torch.randn_like(new_k)
        rate = {}
        for page in (0, 16, 64, 256):
            k, v, table = cache_of(batch, KEYS, page)
            for append in (False, True):
                lens = torch.full((batch,), KEYS - CHUNK if append else KEYS, device="cuda",
                                  dtype=torch.int32)
                extra = {"k": new_k, "v": new_v} if append else {}
                step = lambda: flashgen.attention_with_kvcache(  # noqa: E731
                    q, k, v, cache_seqlens=lens, block_table=table, causal=True, **extra)
                rate[page, append] = flops(batch) / (best_ms(step) * 1e-3) / 1e12
            if page == 16:
                lens = torch.full((batch,), KEYS, device="cuda", dtype=torch.int32)
                step = lambda: flashgen.attention_with_kvcache(  # noqa: E731
                    q, k, v, cache_seqlens=lens, block_table=table, causal=True, num_splits=2)
                rate["decode"] = flops(batch) / (best_ms(step) * 1e-3) / 1e12
            del k, v, table
            torch.cuda.empty_cache()
        k = torch.randn(batch, KEYS, HKV, D, device="cuda", dtype=torch.bfloat16)
        v = torch.randn_like(k)
        dense = lambda: flashgen.attention(q, k, v, causal=True)  # noqa: E731
        rate["dense"] = flops(batch) / (best_ms(dense) * 1e-3) / 1e12
        del k, v
        torch.cuda.empty_cache()
        for append in (False, True):
            c = rate[0, append]
            print(f"batch {batch} {'appending the chunk' if append else 'chunk in the cache':>19}: "
                  f"contiguous {c:6.1f} | page 16 {rate[16, append]:6.1f} "
                  f"({rate[16, append] / c:4.2f}) | page 64 {rate[64, append]:6.1f} "
                  f"({rate[64, append] / c:4.2f}) | page 256 {rate[256, append]:6.1f} "
                  f"({rate[256, append] / c:4.2f})", flush=True)
        print(f"batch {batch} dense call {rate['dense']:6.1f} | decoding family, page 16 "
              f"{rate['decode']:6.1f}", flush=True)


if __name__ == "__main__":
    main("--quick" in sys.argv[1:])

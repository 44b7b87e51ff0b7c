"""Decoding steps over a latent cache (flashgen.mla_with_kvcache, DeepSeek's
multi-head latent attention: one cache of 576-wide rows whose first 512
columns are V), bf16, pages of 64 rows handed out shuffled, one query per
sequence, steps replayed from a CUDA graph. Memory-bound: 16 query heads,
batch 64 and 128, context 4k..64k, latent cache bytes read per second
(batch · context · 576 · 2 once; bar 2.8 TB/s). Compute-bound: 128 query
heads, batch 64 and 128, context 4k and 8k, TFLOP/s counting 2 · heads ·
context · (576 + 512) per query (bar 550). Each shape is first checked on
its first sequence against an fp32 computation, then timed twice (the better
kept: the first shape's first timing read 7 µs slow in a fresh process).
The memory-bound shapes are also timed over copies of the cache in turn,
more than the L2 holds, as a model's layers read theirs ("a cache a call"):
a graph of the same call may find part of its cache in the L2, so the read
rate is judged on these.

usage: python3 bench/mla.py [--quick]  (the flashgen package importable, a GPU;
       --quick: one shape of each kind)
"""
import sys

from requires import torch_and_gpus  # bench/, the script's folder

torch = torch_and_gpus()
import flashgen  # noqa: E402
from decode import copy_bandwidth, graph_ms, graph_ms_turns, other_caches  # noqa: E402

D, DV, PAGE = 576, 512, 64
BAR_TBS, BAR_TFLOPS = 2.8, 550.0


def step(batch, heads, context):
    """The paged cache of `context` keys per sequence and the step's call
    over a cache of its shape (call(kv) -> fn), after a check of its first
    sequence against fp32."""
    pages = batch * context // PAGE
    kv = torch.randn(pages, PAGE, 1, D, device="cuda", dtype=torch.bfloat16)
    table = torch.randperm(pages, device="cuda", dtype=torch.int32).view(batch, context // PAGE)
    q = torch.randn(batch, 1, heads, D, device="cuda", dtype=torch.bfloat16)
    lens = torch.full((batch,), context, device="cuda", dtype=torch.int32)
    out = flashgen.mla_with_kvcache(q, kv, table, lens, DV)
    k = kv[table[0].long()].reshape(context, D).float()
    p = torch.softmax(q[0, 0].float() @ k.T / D ** 0.5, dim=-1)
    err = ((out[0, 0].float() - p @ k[:, :DV]).abs().max() / (p @ k[:, :DV]).abs().max()).item()
    if err > 2e-2:
        print(f"warning: batch {batch} heads {heads} context {context}: relative error {err:.2e}")
    return kv, lambda cache: (lambda: flashgen.mla_with_kvcache(q, cache, table, lens, DV))


def main(quick=False):
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, flashgen "
          f"{flashgen.__version__}")
    print(f"device-to-device copy: {copy_bandwidth() / 1e9:.0f} GB/s (read + write)")
    memory = [(64, 16384)] if quick else [(64, 4096), (64, 16384), (64, 65536), (128, 4096),
                                          (128, 16384), (128, 32768)]
    compute = [(64, 8192)] if quick else [(64, 4096), (64, 8192), (128, 4096), (128, 8192)]
    for kind, heads, shapes in (("memory", 16, memory), ("compute", 128, compute)):
        for batch, context in shapes:
            kv, call = step(batch, heads, context)
            ms = min(graph_ms(call(kv)) for _ in range(2))  # (a process's first timing reads slow)
            tbs = batch * context * D * 2 / (ms * 1e-3) / 1e12
            tflops = 2 * batch * heads * context * (D + DV) / (ms * 1e-3) / 1e12
            line = (f"{kind:7s} heads {heads:3d} batch {batch:3d} context {context:6d}: "
                    f"{ms * 1e3:9.1f} us  {tbs:5.2f} TB/s {tflops:6.1f} TFLOP/s")
            copies = other_caches(kv) if kind == "memory" else []
            if copies:
                turns = graph_ms_turns([call(c) for c, in [(kv,), *copies]])
                tbs = batch * context * D * 2 / (turns * 1e-3) / 1e12
                line += f" | a cache a call ({len(copies) + 1}): {turns * 1e3:9.1f} us"
            bar = f"{tbs:5.2f} TB/s (bar {BAR_TBS})" if kind == "memory" else \
                f"{tflops:6.1f} TFLOP/s (bar {BAR_TFLOPS:.0f})"
            print(f"{line}  {bar}", flush=True)
            del kv, call, copies
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main("--quick" in sys.argv[1:])

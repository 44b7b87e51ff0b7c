"""Context-parallel attention (flashgen.distributed) over the GPUs of one host:
per-GPU throughput of forward+backward against the single-GPU call at the
same per-GPU length, in the same run, and the longest sequence that runs.

bf16, d 128, 32 query heads / 8 KV heads, one sequence; TFLOP/s count
forward+backward as 3.5x the forward's 4·S²·H·D (halved when causal), per
GPU for the sharded call (the whole sequence's work over the GPUs). Each
figure is the median of 5 timings, the slowest rank's. The single GPU also
runs PyTorch's scaled_dot_product_attention (cuDNN) for scale.
Bars: causal at least 0.85 of the single GPU's per-GPU throughput,
non-causal at least 0.90. Causal with contiguous shards (balanced=False) is
timed too, for what the balance is worth.

usage: python3 bench/context_parallel.py [--gpus N] [--tokens-per-gpu L]
                                         [--longest S,S,...]
"""
import argparse
import os
import socket

from requires import torch_and_gpus  # bench/, the script's folder

torch = torch_and_gpus()
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402

import flashgen  # noqa: E402
from flashgen import distributed as cp  # noqa: E402

HQ, HKV, D = 32, 8, 128


def flops(seqlen, causal):
    return 3.5 * 4 * HQ * seqlen * seqlen * D / (2 if causal else 1)


def timed(fn, repeats=5):
    """Median milliseconds of fn on this rank, then the slowest rank's."""
    fn()
    samples = []
    for _ in range(repeats):
        if dist.is_initialized():
            dist.barrier()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end))
    ms = torch.tensor(sorted(samples)[repeats // 2], device="cuda")
    if dist.is_initialized():
        dist.all_reduce(ms, op=dist.ReduceOp.MAX)
    return ms.item()


def tensors(seqlen):
    q, do = (torch.randn(1, seqlen, HQ, D, device="cuda", dtype=torch.bfloat16)
             for _ in range(2))
    k, v = (torch.randn(1, seqlen, HKV, D, device="cuda", dtype=torch.bfloat16)
            for _ in range(2))
    return [t.requires_grad_() for t in (q, k, v)] + [do]


def fwd_bwd(call, q, k, v, do):
    def step():
        for t in (q, k, v):
            t.grad = None
        call(q, k, v).backward(do)
    return step


def single(length):
    """Per-GPU TFLOP/s of one GPU at `length` tokens: flashgen and cuDNN."""
    q, k, v, do = tensors(length)
    rows = {}
    for causal in (True, False):
        fg = timed(fwd_bwd(lambda a, b, c: flashgen.attention(a, b, c, causal=causal),
                           q, k, v, do))
        qt, kt, vt = (t.detach().transpose(1, 2).requires_grad_() for t in (q, k, v))

        def sdpa(a, b, c):
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return F.scaled_dot_product_attention(a, b, c, is_causal=causal, enable_gqa=True)
        try:
            cudnn = timed(fwd_bwd(sdpa, qt, kt, vt, do.transpose(1, 2)))
        except RuntimeError:
            cudnn = float("nan")
        rows[causal] = (flops(length, causal) / fg / 1e9, flops(length, causal) / cudnn / 1e9)
    return rows


def sharded(rank, world, seqlen, causal, balanced=True):
    q, k, v, do = (cp.shard(t.detach(), rank, world, balanced=balanced) for t in tensors(seqlen))
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    ms = timed(fwd_bwd(lambda a, b, c: cp.context_parallel_attention(
        a, b, c, causal=causal, balanced=balanced), q, k, v, do))
    return ms, flops(seqlen, causal) / ms / 1e9 / world


def worker(rank, world, port, length, longest):
    torch.cuda.set_device(rank)
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    dist.init_process_group("nccl", rank=rank, world_size=world,
                            device_id=torch.device("cuda", rank))
    say = print if rank == 0 else (lambda *a, **k: None)
    say(f"{torch.cuda.get_device_name()} x {world}, torch {torch.__version__}, flashgen "
        f"{flashgen.__version__}")
    say(f"bf16, d {D}, {HQ}/{HKV} heads, forward+backward, {length} tokens per GPU")
    one = single(length)
    torch.cuda.empty_cache()
    for causal in (True, False):
        ms, per_gpu = sharded(rank, world, length * world, causal)
        fg, cudnn = one[causal]
        bar = 0.85 if causal else 0.90
        say(f"  {'causal' if causal else 'full  '} single GPU: flashgen {fg:6.1f} TFLOP/s "
            f"(cuDNN {cudnn:6.1f}); {world} GPUs x {length}: {ms:8.1f} ms, {per_gpu:6.1f} "
            f"TFLOP/s per GPU, {per_gpu / fg:.2f} of one GPU (bar {bar:.2f})")
        torch.cuda.empty_cache()
    ms, per_gpu = sharded(rank, world, length * world, True, balanced=False)
    say(f"  causal, contiguous shards (balanced=False): {ms:8.1f} ms, {per_gpu:6.1f} TFLOP/s per "
        f"GPU, {per_gpu / one[True][0]:.2f} of one GPU")
    torch.cuda.empty_cache()
    for seqlen in longest:
        try:
            q, k, v, do = (cp.shard(t.detach(), rank, world) for t in tensors(seqlen))
            q, k, v = (t.requires_grad_() for t in (q, k, v))
            torch.cuda.reset_peak_memory_stats()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            cp.context_parallel_attention(q, k, v, causal=True).backward(do)
            end.record()
            end.synchronize()
            peak = torch.cuda.max_memory_allocated() / 2 ** 30
            say(f"  longest: {seqlen} tokens causal on {world} GPUs: forward+backward "
                f"{start.elapsed_time(end) / 1e3:.1f} s, peak {peak:.1f} GiB a GPU")
            del q, k, v, do
            torch.cuda.empty_cache()
        except torch.OutOfMemoryError:
            say(f"  longest: {seqlen} tokens: out of memory")
            break
    dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--gpus", type=int, default=torch.cuda.device_count())
    parser.add_argument("--tokens-per-gpu", type=int, default=32768)
    parser.add_argument("--longest", default="", help="sequence lengths to try, comma-separated")
    a = parser.parse_args()
    torch_and_gpus(max(a.gpus, 1))
    longest = [int(x) for x in a.longest.split(",") if x]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(worker, args=(a.gpus, port, a.tokens_per_gpu, longest), nprocs=a.gpus, join=True)


if __name__ == "__main__":
    main()

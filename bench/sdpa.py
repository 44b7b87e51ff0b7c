"""PyTorch's scaled_dot_product_attention on the shapes of `flashgen bench`,
flash and cuDNN backends, in the same run; prints both side by side.

usage: flashgen bench --csv > fg.csv && python3 bench/sdpa.py fg.csv
"""
import csv
import sys

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.functional import scaled_dot_product_attention as sdpa


def time_ms(fn, repeats=20):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    fn()
    samples = []
    for _ in range(5):
        start.record()
        for _ in range(repeats):
            fn()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) / repeats)
    return sorted(samples)[2]


def sdpa_tflops(backend, d, seqlen, batch, heads, causal, dropout):
    # (B, S, H, D) storage viewed as (B, H, S, D), as flashgen is called
    q, k, v = (torch.randn(batch, seqlen, heads, d, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
               for _ in range(3))
    flops = 4 * batch * heads * seqlen * seqlen * d / (2 if causal else 1)
    try:
        with sdpa_kernel(backend):
            ms = time_ms(lambda: sdpa(q, k, v, is_causal=causal, dropout_p=dropout))
    except RuntimeError:
        return None
    return flops / (ms * 1e-3) / 1e12


def main():
    rows = [r for r in csv.DictReader(open(sys.argv[1])) if r["kind"] == "flashgen"]
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}")
    print("bf16 forward TFLOP/s, 16k tokens, hidden 2048")
    print(f"{'d':>4} {'seq':>6} {'causal':>6} {'drop':>5} {'flashgen':>9} {'flash':>7} {'cudnn':>7} {'vs flash':>8}")
    for r in rows:
        d, s, b, h = (int(r[x]) for x in ("head_dim", "seqlen", "batch", "heads"))
        causal, drop = r["causal"] == "1", float(r["dropout"])
        fl = sdpa_tflops(SDPBackend.FLASH_ATTENTION, d, s, b, h, causal, drop)
        cu = sdpa_tflops(SDPBackend.CUDNN_ATTENTION, d, s, b, h, causal, drop)
        fg = float(r["tflops"])
        fmt = lambda x: f"{x:7.1f}" if x else "    n/a"
        ratio = f"{fg / fl:8.2f}" if fl else "     n/a"
        print(f"{d:4d} {s:6d} {'yes' if causal else 'no':>6} {drop:5.1f} {fg:9.1f} {fmt(fl)} {fmt(cu)} {ratio}")
        sys.stdout.flush()


if __name__ == "__main__":
    main()

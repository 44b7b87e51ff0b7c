"""Sliding windows beside FlashAttention 4: flashgen.attention(window=) and
flash_attn_func(window_size=) on the same tensors, timed in turns in one
process (sdpa.py's in_turns: three rounds, medians), forward and
forward+backward; bf16, 16k tokens a batch, hidden size 2048 (heads 2048 / d),
d 64, 128 and 256, seqlen 2k and 8k, windows (1023, 0) and (512, 511), and at
8k (255, 0) and (4095, 0). Prints each side's milliseconds and flashgen's speed
as a share of FlashAttention 4's (above 1: flashgen faster), after checking
that the two outputs agree (largest difference; above 2e-2 a warning).

usage: python3 bench/window.py [--quick]  (the flashgen package importable, a GPU,
       flash-attn-4 for the peer's columns; --quick: d 128 at 8k only)
"""
import sys

from requires import torch_and_gpus  # bench/, the script's folder

torch = torch_and_gpus()
import flashgen  # noqa: E402
from sdpa import fa4, fa4_out, in_turns, time_ms  # noqa: E402

TOKENS, HIDDEN, TOLERANCE = 16384, 2048, 2e-2


def shapes(quick):
    for d in (128,) if quick else (64, 128, 256):
        for seqlen in (8192,) if quick else (2048, 8192):
            windows = [(1023, 0), (512, 511)] + ([(255, 0), (4095, 0)] if seqlen == 8192 else [])
            for window in windows:
                yield d, seqlen, window


def calls(q, k, v, window):
    """{name: attention call} for flashgen and, where importable, FlashAttention 4."""
    out = {"flashgen": lambda q, k, v: flashgen.attention(q, k, v, window=window)}
    if fa4():
        out["fa4"] = lambda q, k, v: fa4_out(fa4()(q, k, v, causal=False, window_size=window))
    return out


def main(argv):
    quick = "--quick" in argv
    print("bf16, 16k tokens, hidden 2048; ms, and flashgen's speed / FlashAttention 4's"
          + ("" if fa4() else " (fa4: flash-attn-4 not importable)"))
    print(f"{'d':>4} {'seq':>5} {'window':>11} {'fg fwd':>7} {'fa4':>7} {'ratio':>6} "
          f"{'fg f+b':>7} {'fa4':>7} {'ratio':>6}")
    for d, seqlen, window in shapes(quick):
        batch, heads = TOKENS // seqlen, HIDDEN // d
        leaves = [torch.randn(batch, seqlen, heads, d, device="cuda", dtype=torch.bfloat16,
                              requires_grad=True) for _ in range(3)]
        dout = torch.randn_like(leaves[0])
        fns = calls(*leaves, window)
        if "fa4" in fns:
            with torch.no_grad():
                diff = (fns["flashgen"](*leaves).float() - fns["fa4"](*leaves).float()).abs().max().item()
            if diff > TOLERANCE:
                print(f"warning: d {d} seqlen {seqlen} window {window}: outputs differ by {diff:.3g}")
        timers = {}
        for name, fn in fns.items():
            timers[name] = (lambda fn=fn: (
                time_ms(lambda: fn(*leaves)),
                time_ms(lambda: torch.autograd.grad(fn(*leaves), leaves, dout))))
        got = in_turns(timers)
        fg_f, fg_b = got["flashgen"]
        f4_f, f4_b = got.get("fa4") or (None, None)
        cell = lambda x: f"{x:7.3f}" if x else f"{'-':>7}"
        ratio = lambda peer, own: f"{peer / own:6.2f}" if peer else f"{'-':>6}"
        print(f"{d:4d} {seqlen:5d} {str(window):>11} {cell(fg_f)} {cell(f4_f)} {ratio(f4_f, fg_f)} "
              f"{cell(fg_b)} {cell(f4_b)} {ratio(f4_b, fg_b)}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])

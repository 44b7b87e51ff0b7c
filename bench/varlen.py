"""Packed sequences (flashgen.attention_varlen) against PyTorch's
scaled_dot_product_attention on the same batch as a jagged nested tensor,
FlashAttention 4's varlen call where flash-attn-4 is importable, and
flashgen's dense attention at the batch's mean length, in the same run, the
forward and then forward+backward (3.5x the forward's FLOPs), the four
timed in turns (bench/sdpa.py's in_turns: three rounds, medians): bf16,
64 sequences of random lengths 128..8192 (seed 0), 16 heads, d 128, causal
and not. TFLOP/s count the real work: 4·L²·H·D per sequence, halved when
causal.

usage: python3 bench/varlen.py  (the flashgen package importable, a GPU)
"""
from requires import torch_and_gpus  # bench/, the script's folder

torch = torch_and_gpus()
import torch.nn.functional as F  # noqa: E402

import flashgen  # noqa: E402
from sdpa import fa4, fa4_out, in_turns, time_ms as time_many  # noqa: E402


def time_ms(fn):
    return time_many(fn, repeats=4)  # calls of tens of milliseconds


def fa4_ms(fn):
    """fn's time, or None where FlashAttention 4 is absent or refuses."""
    if fa4("flash_attn_varlen_func") is None:
        return None
    try:
        return time_ms(fn)
    except Exception as e:  # noqa: BLE001 - a peer's failure is reported, not fatal
        print(f"    (FlashAttention 4 not timed: {type(e).__name__}: {str(e).splitlines()[-1][:150]})")
        return None


def timed_in_turns(fg, sdpa, dense, f4):
    """The four calls' ms, timed in turns (sdpa.in_turns), FlashAttention 4's
    None where it is absent or refuses."""
    ms = in_turns({"fg": lambda: time_ms(fg), "sdpa": lambda: time_ms(sdpa),
                   "dense": lambda: time_ms(dense), "f4": lambda: fa4_ms(f4)})
    return ms["fg"], ms["sdpa"], ms["dense"], ms["f4"]


def main(count=64, heads=16, d=128, lo=128, hi=8192):
    g = torch.Generator().manual_seed(0)
    lens = torch.randint(lo, hi + 1, (count,), generator=g).tolist()
    total, longest, mean = sum(lens), max(lens), sum(lens) // count
    cu = torch.tensor([0] + lens, device="cuda").cumsum(0)
    cu32 = cu.to(torch.int32)
    q, k, v = (torch.randn(total, heads, d, device="cuda", dtype=torch.bfloat16)
               for _ in range(3))
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}")
    print(f"bf16, {count} sequences of {lo}..{hi} (mean {mean}, {total} tokens), H{heads} d{d}")
    nested = [torch.nested.nested_tensor_from_jagged(x, offsets=cu).transpose(1, 2)
              for x in (q, k, v)]  # (B, H, j, D)
    dq, dk, dv = (torch.randn(count, mean, heads, d, device="cuda", dtype=torch.bfloat16)
                  for _ in range(3))
    for causal in (False, True):
        work = sum(4 * n * n * heads * d for n in lens) / (2 if causal else 1)
        dense_work = count * 4 * mean * mean * heads * d / (2 if causal else 1)
        fa4v = fa4("flash_attn_varlen_func")
        fg, sdpa, dense, f4 = timed_in_turns(
            lambda: flashgen.attention_varlen(q, k, v, cu32, cu32, longest, longest, causal=causal),
            lambda: F.scaled_dot_product_attention(*nested, is_causal=causal),
            lambda: flashgen.attention(dq, dk, dv, causal=causal),
            lambda: fa4v(q, k, v, cu_seqlens_q=cu32, cu_seqlens_k=cu32, max_seqlen_q=longest,
                         max_seqlen_k=longest, causal=causal))
        tf = lambda w, ms: w / (ms * 1e-3) / 1e12
        print(f"forward {'causal' if causal else 'full  '}: flashgen varlen {fg:8.3f} ms "
              f"{tf(work, fg):6.1f} TFLOP/s | SDPA jagged {sdpa:8.3f} ms {tf(work, sdpa):6.1f} | "
              f"flashgen dense at mean length {tf(dense_work, dense):6.1f} | varlen/SDPA "
              f"{sdpa / fg:.2f}x, varlen/dense {tf(work, fg) / tf(dense_work, dense):.2f}"
              + (f" | FA4 varlen {f4:8.3f} ms {tf(work, f4):6.1f}, varlen/FA4 {f4 / fg:.2f}x" if f4 else ""))

        qg, kg, vg = (x.detach().requires_grad_() for x in (q, k, v))
        dout = torch.randn_like(q)
        ng = [x.detach().requires_grad_() for x in (q, k, v)]
        nd = [torch.nested.nested_tensor_from_jagged(x, offsets=cu).transpose(1, 2) for x in ng]
        dg = [x.detach().requires_grad_() for x in (dq, dk, dv)]
        ddout = torch.randn_like(dq)
        fg, sdpa, dense, f4 = timed_in_turns(
            lambda: torch.autograd.grad(flashgen.attention_varlen(
                qg, kg, vg, cu32, cu32, longest, longest, causal=causal), (qg, kg, vg), dout),
            lambda: torch.autograd.grad(
                F.scaled_dot_product_attention(*nd, is_causal=causal).transpose(1, 2).values(), ng,
                dout),
            lambda: torch.autograd.grad(flashgen.attention(*dg, causal=causal), dg, ddout),
            lambda: torch.autograd.grad(fa4_out(fa4v(
                qg, kg, vg, cu_seqlens_q=cu32, cu_seqlens_k=cu32, max_seqlen_q=longest,
                max_seqlen_k=longest, causal=causal)), (qg, kg, vg), dout))
        print(f"fwd+bwd {'causal' if causal else 'full  '}: flashgen varlen {fg:8.3f} ms "
              f"{tf(3.5 * work, fg):6.1f} TFLOP/s | SDPA jagged {sdpa:8.3f} ms "
              f"{tf(3.5 * work, sdpa):6.1f} | flashgen dense at mean length "
              f"{tf(3.5 * dense_work, dense):6.1f} | varlen/SDPA {sdpa / fg:.2f}x, varlen/dense "
              f"{tf(work, fg) / tf(dense_work, dense):.2f}"
              + (f" | FA4 varlen {f4:8.3f} ms {tf(3.5 * work, f4):6.1f}, varlen/FA4 {f4 / fg:.2f}x"
                 if f4 else ""))


if __name__ == "__main__":
    main()

"""A value head dim of its own (DeepSeek's 192/128) through the Python package,
beside FlashAttention 4 and PyTorch's cuDNN attention on the same shapes in the
same run, and each beside its own d = 128 rate per FLOP: bf16, 16 heads,
16k tokens per batch (seqlen 8k and 16k), causal and not; forward and
forward+backward, ms and TFLOP/s. FLOPs count each product at its own width:
the forward 2·pairs·(d + dv) per head, the backward 2·pairs·(3d + 2dv) (S
again, dP and dV over dv, dQ and dK over d). Columns: "fg/impl" flashgen's 192/128
TFLOP/s over the implementation's; "d128" the implementation's TFLOP/s at d = dv =
128 on the same tokens and heads; "own/128" its 192/128 rate over that, per FLOP
(flashgen's bar: 0.95).

Before the timing, flashgen's output and gradients are compared with an fp32
reference on one batch row and two heads (and its output with FlashAttention
4's where that runs); a difference above 2e-2 prints a warning.

usage: python3 bench/value_head_dim.py [--quick]  (the flashgen package importable, a GPU;
       --quick: seqlen 8k only)
"""
import sys

from requires import torch_and_gpus  # bench/, the script's folder

torch = torch_and_gpus()
import flashgen  # noqa: E402
from sdpa import fa4, fa4_out  # noqa: E402
from variants import timed  # noqa: E402

HEADS, TOKENS, D, DV = 16, 16384, 192, 128
BAR_OWN = 0.95  # of flashgen's d = 128 TFLOP/s
TOLERANCE = 2e-2
CHECK_HEADS = [0, HEADS - 1]
HEADER = (f"{'seq':>5} {'causal':>6} {'pass':4s} {'impl':12s} {'ms':>8} {'TFLOP/s':>7} "
          f"{'fg/impl':>7} {'d128':>7} {'own/128':>8}")


def sdpa_cudnn(q, k, v, causal):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):  # (B, S, H, D) viewed as (B, H, S, D)
        return scaled_dot_product_attention(*(x.transpose(1, 2) for x in (q, k, v)),
                                            is_causal=causal).transpose(1, 2)


def impls(causal):
    """(name, fn(q, k, v) -> out); the first is flashgen's."""
    return [("flashgen", lambda q, k, v: flashgen.attention(q, k, v, causal=causal)),
            ("FA4", lambda q, k, v: fa4_out(fa4()(q, k, v, causal=causal))),
            ("sdpa-cudnn", lambda q, k, v: sdpa_cudnn(q, k, v, causal))]


def leaves(batch, seqlen, d, dv):
    q, k = (torch.randn(batch, seqlen, HEADS, d, device="cuda", dtype=torch.bfloat16,
                        requires_grad=True) for _ in range(2))
    v = torch.randn(batch, seqlen, HEADS, dv, device="cuda", dtype=torch.bfloat16,
                    requires_grad=True)
    return q, k, v


def check(q, k, v, dout, causal):
    """flashgen against fp32 autograd on batch row 0, CHECK_HEADS (output and
    gradients relative to their largest) and against FlashAttention 4's output."""
    out = flashgen.attention(q, k, v, causal=causal)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    rows = [x[:1, :, CHECK_HEADS].detach().float().requires_grad_() for x in (q, k, v)]
    ref = torch.nn.functional.scaled_dot_product_attention(
        *(x.transpose(1, 2) for x in rows), is_causal=causal).transpose(1, 2)
    ref_grads = torch.autograd.grad(ref, rows, dout[:1, :, CHECK_HEADS].float())
    found = [("output vs fp32", (out[:1, :, CHECK_HEADS].float() - ref).abs().max().item()),
             ("gradients vs fp32 (relative)", max(
                 ((a[:1, :, CHECK_HEADS].float() - b).abs().max() / b.abs().max()).item()
                 for a, b in zip(grads, ref_grads)))]
    if fa4() is not None:
        try:
            theirs = fa4_out(fa4()(q, k, v, causal=causal))
            found.append(("output vs FA4", (out.float() - theirs.float()).abs().max().item()))
        except Exception as e:  # noqa: BLE001 - a shape it does not take
            print(f"    (FA4 check not run: {type(e).__name__}: {str(e)[:100]})")
    print("    check " + ", ".join(f"{what} {diff:.1e}" for what, diff in found))
    for what, diff in found:
        if not diff <= TOLERANCE:
            print(f"    WARNING: {what} differs by {diff:.2e}, above {TOLERANCE:g}")


def shape(seqlen, causal):
    batch = TOKENS // seqlen
    pairs = batch * HEADS * (seqlen * (seqlen + 1) // 2 if causal else seqlen * seqlen)
    print(f"seqlen {seqlen} {'causal' if causal else 'not causal'}: batch {batch}, "
          f"d {D}, dv {DV}")
    q, k, v = leaves(batch, seqlen, D, DV)
    dout = torch.randn(batch, seqlen, HEADS, DV, device="cuda", dtype=torch.bfloat16)
    check(q, k, v, dout, causal)
    print(HEADER)
    same = leaves(batch, seqlen, 128, 128)
    same_dout = torch.randn_like(same[0])
    for backward in (False, True):
        pass_ = "f+b" if backward else "fwd"

        def flops(d, dv):
            return 2 * pairs * ((d + dv) + ((3 * d + 2 * dv) if backward else 0))

        def tflops(name, d, dv, fn, tensors, grad):
            ms = timed(f"{name} {d}/{dv} {pass_}", lambda: fn(*tensors), list(tensors), grad,
                       backward)
            return ms, (flops(d, dv) / (ms * 1e-3) / 1e12 if ms else None)
        ours = None
        for name, fn in impls(causal):
            ms, tf = tflops(name, D, DV, fn, (q, k, v), dout)
            _, tf128 = tflops(name, 128, 128, fn, same, same_dout)
            ours = ours or tf
            ratio = f"{ours / tf:7.2f}" if tf and name != "flashgen" else f"{'':7s}"
            own = f"{tf / tf128:8.2f}" if tf and tf128 else f"{'n/a':>8s}"
            bar = f"  (bar {BAR_OWN} for flashgen)" if name == "flashgen" else ""
            print(f"{seqlen:5d} {str(causal):>6} {pass_:4s} {name:12s} "
                  f"{ms or float('nan'):8.3f} {tf or float('nan'):7.1f} {ratio} "
                  f"{tf128 or float('nan'):7.1f} {own}{bar}")


def main():
    quick = "--quick" in sys.argv[1:]
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, "
          f"FA4 {'present' if fa4() else 'absent'}")
    for seqlen in (8192,) if quick else (8192, 16384):
        for causal in (False, True):
            shape(seqlen, causal)


if __name__ == "__main__":
    main()

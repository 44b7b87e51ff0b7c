"""The built-in score variants through the Python package beside FlashAttention 4,
on the same shapes in the same run: plain, softcap 50, ALiBi (slopes (H,) fp32,
as flash-attn's), sinks ((H,) fp32, differentiable) and a sliding window of
1024 keys; bf16, 16 heads, d 128 and 256, 16k tokens per batch (seqlen 8k
and 2k), causal and not. For each: flashgen's forward and forward+backward
(ms, TFLOP/s over the visible pairs, forward+backward 3.5x the forward's
FLOPs), its ratio to flashgen's plain kernel (TFLOP/s over TFLOP/s: plain time
/ variant time where the work is the same), and FlashAttention 4's time where
flash-attn-4 is importable and its flash_attn_func takes the variant (softcap=,
learnable_sink=, window_size=; not ALiBi), with flashgen's speed over its.
Before the timing, each variant's output is checked against FlashAttention
4's (its gradients too, relative to their largest) and against an fp32
reference on one batch row and two heads, with a cap of 5 (the same kernel,
the cap a runtime value; 50 hardly bends these scores); a difference above
2e-2 prints a warning.

usage: python3 bench/variants.py [--quick]  (the flashgen package importable, a GPU;
       --quick: seqlen 8k only)
"""
import math
import sys

from requires import torch_and_gpus  # bench/, the script's folder

torch = torch_and_gpus()
import flashgen  # noqa: E402
from sdpa import fa4, fa4_out, time_ms  # noqa: E402

HEADS, TOKENS = 16, 16384
SOFTCAP = 50.0
WINDOW = 1024  # keys each query sees: (1023, 0) causal, (512, 511) not
BARS = {"softcap": 0.9, "alibi": 0.9, "sinks": 0.95}  # of flashgen's plain kernel
TOLERANCE = 2e-2
CHECK_SOFTCAP = 5.0  # the check's cap: 50 hardly bends scores of randn inputs
CHECK_HEADS = (0, HEADS - 1)
REPEATS = 10
_said = set()  # reasons already printed
HEADER = (f"{'d':>4} {'seq':>5} {'causal':>6} {'variant':8s} {'pass':4s} {'fg ms':>8} "
          f"{'TFLOP/s':>7} {'ratio':>6} {'FA4 ms':>8} {'TFLOP/s':>7} {'fg/FA4':>6}")


def window(causal):
    return (WINDOW - 1, 0) if causal else (WINDOW // 2, WINDOW // 2 - 1)


def visible_pairs(seqlen, causal, name):
    """(query, key) pairs the mask lets through, for one batch row and head."""
    left, right = window(causal) if name == "window" else (seqlen, seqlen)
    right = 0 if causal else right
    return sum(min(i, left) + min(seqlen - 1 - i, right) + 1 for i in range(seqlen))


def alibi_slopes():
    """flash-attn's ALiBi slopes for a power of two of heads: 2^(-8 (h + 1) / H)."""
    return torch.tensor([2 ** (-8 * (h + 1) / HEADS) for h in range(HEADS)], device="cuda",
                        dtype=torch.float32)


def sink_logits():
    """(H,) fp32, exact in bf16 (FlashAttention 4 takes its sinks in bf16): from
    negligible beside a row's sum (head 0) to most of it (the last head)."""
    return torch.linspace(4.0, 20.0, HEADS).to(torch.bfloat16).float().cuda()


def variants(causal, slopes, sinks):
    """(name, flashgen's keywords, FlashAttention 4's keywords or None)."""
    return [("plain", {}, {}),
            ("softcap", {"softcap": SOFTCAP}, {"softcap": SOFTCAP}),
            ("alibi", {"alibi_slopes": slopes}, None),
            ("sinks", {"sinks": sinks}, {"learnable_sink": sinks.detach().to(torch.bfloat16)}),
            ("window", {"window": window(causal)}, {"window_size": window(causal)})]


def tflops(flops, ms):
    return flops / (ms * 1e-3) / 1e12 if ms else None


def fmt(x, width, digits):
    return f"{x:{width}.{digits}f}" if x else f"{'n/a':>{width}}"


def say_once(what, e):
    reason = f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[-1][:120]}"
    if (what, reason) not in _said:
        _said.add((what, reason))
        print(f"    ({what} not run: {reason})")


def flashgen_fn(q, k, v, causal, kw):
    return lambda: flashgen.attention(q, k, v, causal=causal, **kw)


def fa4_fn(q, k, v, causal, kw):
    return lambda: fa4_out(fa4()(q, k, v, causal=causal, **kw))


def timed(what, fn, leaves, dout, backward):
    """Median ms of fn (forward, without autograd) or of fn and its backward,
    or None where it cannot run (the reason printed once)."""
    try:
        if not backward:
            with torch.no_grad():
                return time_ms(fn, repeats=REPEATS)

        def step():
            for x in leaves:
                x.grad = None
            fn().backward(dout)
        return time_ms(step, repeats=REPEATS)
    except Exception as e:  # noqa: BLE001 - a peer's refusal is reported, not fatal
        say_once(what, e)
        return None


def reference(q, k, v, causal, kw):
    """fp32 output of batch row 0 at CHECK_HEADS, (S, len(CHECK_HEADS), D)."""
    heads = list(CHECK_HEADS)
    qs, ks, vs = (x[0, :, heads].float().transpose(0, 1) for x in (q, k, v))
    seqlen = qs.shape[1]
    s = qs @ ks.transpose(1, 2) / math.sqrt(q.shape[-1])
    if "softcap" in kw:
        s = kw["softcap"] * torch.tanh(s / kw["softcap"])
    i = torch.arange(seqlen, device="cuda")[:, None]
    j = torch.arange(seqlen, device="cuda")[None, :]
    if "alibi_slopes" in kw:
        s -= kw["alibi_slopes"][heads][:, None, None] * (i - j).abs().float()
    left, right = kw.get("window", (seqlen, seqlen))
    visible = (j >= i - left) & (j <= i + (0 if causal else right))
    s = s.masked_fill(~visible, float("-inf"))
    if "sinks" in kw:
        sink = kw["sinks"].detach()[heads][:, None, None].expand(-1, seqlen, 1)
        p = torch.softmax(torch.cat([s, sink], -1), -1)[..., :-1]
    else:
        p = torch.softmax(s, -1)
    return (p @ vs).transpose(0, 1)


def check(label, q, k, v, dout, causal, name, fg_kw, f4_kw):
    """Prints flashgen's differences from FlashAttention 4 (output, and
    gradients relative to their largest) and from the fp32 reference; warns
    above TOLERANCE. The cap is CHECK_SOFTCAP here, a runtime value of the
    same kernel, so that it bends these scores."""
    def for_check(kw):
        return {x: (CHECK_SOFTCAP if x == "softcap" else y.detach() if torch.is_tensor(y) else y)
                for x, y in kw.items()}
    fg_kw = for_check(fg_kw)
    leaves = [x.detach().requires_grad_() for x in (q, k, v)]
    out = flashgen.attention(*leaves, causal=causal, **fg_kw)
    grads = torch.autograd.grad(out, leaves, dout)
    found = []
    if f4_kw is not None and fa4() is not None:
        try:
            theirs = fa4_out(fa4()(*leaves, causal=causal, **for_check(f4_kw)))
            found.append(("output vs FA4", (out.float() - theirs.float()).abs().max().item()))
        except Exception as e:  # noqa: BLE001
            say_once(f"FA4 {name} forward check", e)
        else:
            try:
                their_grads = torch.autograd.grad(theirs, leaves, dout)
                found.append(("gradients vs FA4 (relative)", max(
                    ((a.float() - b.float()).abs().max() / b.float().abs().max()).item()
                    for a, b in zip(grads, their_grads))))
            except Exception as e:  # noqa: BLE001
                say_once(f"FA4 {name} backward check", e)
    with torch.no_grad():
        ref = reference(*leaves, causal, fg_kw)
        found.append((f"output vs fp32 (row 0, heads {CHECK_HEADS[0]}, {CHECK_HEADS[1]})",
                      (out[0, :, list(CHECK_HEADS)].float() - ref).abs().max().item()))
    print(f"    check {name:8s}" + ", ".join(f"{what} {diff:.1e}" for what, diff in found))
    for what, diff in found:
        if not diff <= TOLERANCE:
            print(f"    WARNING: {name} at {label}: {what} differs by {diff:.2e}, "
                  f"above {TOLERANCE:g}")


def shape(d, seqlen, causal, rows):
    batch = TOKENS // seqlen
    label = f"d{d} {seqlen} {'causal' if causal else 'not causal'}"
    q, k, v = (torch.randn(batch, seqlen, HEADS, d, device="cuda", dtype=torch.bfloat16,
                           requires_grad=True) for _ in range(3))
    dout = torch.randn_like(q)
    slopes = alibi_slopes()
    sinks = sink_logits().requires_grad_()
    table = variants(causal, slopes, sinks)
    print(f"{label}: batch {batch}")
    for name, fg_kw, f4_kw in table:
        check(label, q, k, v, dout, causal, name, fg_kw, f4_kw)
    print(HEADER)
    plain = {}
    for name, fg_kw, f4_kw in table:
        flops = 4 * batch * HEADS * d * visible_pairs(seqlen, causal, name)
        for backward in (False, True):
            pass_ = "f+b" if backward else "fwd"
            work = flops * (3.5 if backward else 1.0)
            fg_leaves = [q, k, v] + ([sinks] if "sinks" in fg_kw else [])
            ours = timed(f"flashgen {name} {pass_}", flashgen_fn(q, k, v, causal, fg_kw),
                         fg_leaves, dout, backward)
            theirs = None
            if f4_kw is not None and fa4() is not None:
                theirs = timed(f"FA4 {name} {pass_}", fa4_fn(q, k, v, causal, f4_kw),
                               [q, k, v], dout, backward)
            ours_tf, theirs_tf = tflops(work, ours), tflops(work, theirs)
            if name == "plain":
                plain[pass_] = ours_tf
            ratio = ours_tf / plain[pass_] if ours and plain.get(pass_) else None
            rows.append((label, name, pass_, ratio))
            bar = BARS.get(name)
            mark = "  below its bar" if ratio and bar and ratio < bar else ""
            print(f"{d:4d} {seqlen:5d} {'yes' if causal else 'no':>6} {name:8s} {pass_:4s} "
                  f"{fmt(ours, 8, 3)} {fmt(ours_tf, 7, 1)} {fmt(ratio, 6, 3)} "
                  f"{fmt(theirs, 8, 3)} {fmt(theirs_tf, 7, 1)} "
                  f"{fmt(ours_tf / theirs_tf if ours and theirs else None, 6, 2)}{mark}")
            sys.stdout.flush()


def summary(rows):
    print("bars (ratio to flashgen's plain kernel over the shapes above):")
    for name, bar in BARS.items():
        for pass_ in ("fwd", "f+b"):
            got = [(r, label) for label, n, p, r in rows if n == name and p == pass_ and r]
            if not got:
                print(f"  {name:8s} {pass_}: not measured")
                continue
            low = [label for r, label in got if r < bar]
            print(f"  {name:8s} {pass_}: {min(got)[0]:.3f}-{max(got)[0]:.3f} (bar {bar}) "
                  + (f"below at {', '.join(low)}" if low else "met"))


def main():
    quick = "--quick" in sys.argv[1:]
    torch.manual_seed(0)
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, "
          f"flashgen {flashgen.__version__}"
          + ("" if fa4() else "; FA4: flash-attn-4 not importable, its columns n/a"))
    print(f"bf16, H{HEADS}, {TOKENS // 1024}k tokens; softcap {SOFTCAP:g}, ALiBi slopes (H,) fp32, "
          f"sinks (H,) fp32, window of {WINDOW} keys")
    print("ratio: TFLOP/s over flashgen's plain kernel's; fg/FA4: flashgen's TFLOP/s over")
    print("FlashAttention 4's (FA4 returns no gradient for its sinks, flashgen does)")
    rows = []
    for d in (128, 256):
        for seqlen in ((8192,) if quick else (8192, 2048)):
            for causal in (False, True):
                shape(d, seqlen, causal, rows)
                torch.cuda.empty_cache()
    summary(rows)


if __name__ == "__main__":
    main()

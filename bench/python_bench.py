"""flashgen through its Python package beside PyTorch's attention on the same
GPU in the same run: scaled_dot_product_attention with the flash and cuDNN
backends, and FlexAttention (compiled). Forward and forward+backward, bf16,
16k tokens per call; then the host time per call of each entry point beside
PyTorch's call for the same problem, and of the C call underneath (ctypes,
prebuilt arguments), at tiny sizes.

    python bench/python_bench.py [--dtype bf16|fp16] [--quick]"""
import argparse
import ctypes
import statistics
import time

from requires import torch_and_gpus  # bench/, the script's folder

torch = torch_and_gpus()
import torch.nn.functional as F  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402

import flashgen  # noqa: E402
from flashgen import _native, _ops  # noqa: E402


def gpu_ms(fn, reps=20, warmup=5):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def peers(causal):
    def sdpa(backend):
        def run(q, k, v):
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        return run
    out = {"flashgen": lambda q, k, v: flashgen.attention(q, k, v, causal=causal, align="top-left",
                                                          layout="bhsd"),
           "sdpa-flash": sdpa(SDPBackend.FLASH_ATTENTION),
           "sdpa-cudnn": sdpa(SDPBackend.CUDNN_ATTENTION)}
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
        # one compile per shape: past dynamo's recompile limit flex_attention
        # would run unfused and be timed as such
        torch._dynamo.config.recompile_limit = 1 << 10
        flex = torch.compile(flex_attention, dynamic=False)
        masks = {}

        def run_flex(q, k, v):
            if not causal:
                return flex(q, k, v)
            key = q.shape[2]
            if key not in masks:
                masks[key] = create_block_mask(lambda b, h, i, j: j <= i, None, None, key, key)
            return flex(q, k, v, block_mask=masks[key])
        out["flex"] = run_flex
    except ImportError:
        pass
    return out


def table(dtype, quick):
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, flashgen "
          f"{flashgen.__version__}, {dtype}, 16k tokens per call, B·S = 16384, H·D = 2048")
    names = None
    for d in (64, 128):
        for causal in (False, True):
            for S in ((1024, 8192) if quick else (512, 1024, 2048, 4096, 8192, 16384)):
                B, H = 16384 // S, 2048 // d
                q, k, v = (torch.randn(B, H, S, d, device="cuda", dtype=dtype, requires_grad=True)
                           for _ in range(3))
                d_out = torch.randn_like(q)
                flops = 4 * B * H * S * S * d * (0.5 if causal else 1)
                row = {}
                for name, fn in peers(causal).items():
                    try:
                        fwd = gpu_ms(lambda: fn(q, k, v))
                        both = gpu_ms(lambda: torch.autograd.grad(fn(q, k, v), (q, k, v), d_out))
                        row[name] = (fwd, both)
                    except Exception as e:  # a peer that cannot run this shape
                        row[name] = None
                        print(f"#   {name} d={d} S={S}: {type(e).__name__}: {str(e)[:80]}")
                if names is None:
                    names = list(row)
                    print("| d | causal | S | " + " | ".join(
                        f"{n} fwd TF/s | {n} f+b TF/s" for n in names) +
                        " | fwd vs best peer | f+b vs best peer |")
                    print("|" + "---|" * (3 + 2 * len(names) + 2))
                cells, best = [], [None, None]
                for n in names:
                    r = row.get(n)
                    if r is None:
                        cells += ["-", "-"]
                        continue
                    tf = (flops / r[0] / 1e9, 3.5 * flops / r[1] / 1e9)
                    cells += [f"{tf[0]:.0f}", f"{tf[1]:.0f}"]
                    if n != "flashgen":
                        best = [max(b or 0, t) for b, t in zip(best, tf)]
                mine = row["flashgen"]
                ratio = [f"{(flops / mine[0] / 1e9) / best[0]:.2f}" if best[0] else "-",
                         f"{(3.5 * flops / mine[1] / 1e9) / best[1]:.2f}" if best[1] else "-"]
                print(f"| {d} | {'yes' if causal else 'no'} | {S} | " + " | ".join(cells) +
                      f" | {ratio[0]} | {ratio[1]} |")


def host_us(rows, n=1000, rounds=9):
    """Host time per call of each (name, fn) in rows: the median over rounds,
    the rows timed in turn within each round, so that a drift of the host's
    speed reaches them alike (the loop queues work faster than a tiny kernel
    runs, so it measures the host)."""
    for _, fn in rows:
        for _ in range(100):
            fn()
    torch.cuda.synchronize()
    per_call = {name: [] for name, _ in rows}
    for _ in range(rounds):
        for name, fn in rows:
            t = time.perf_counter()
            for _ in range(n):
                fn()
            per_call[name].append((time.perf_counter() - t) / n * 1e6)
            torch.cuda.synchronize()
    return {name: statistics.median(times) for name, times in per_call.items()}


def _varlen_peer(q, cu, longest):
    """PyTorch's own packed call (torch.nn.attention.varlen.varlen_attn,
    causal), or None where this PyTorch has none."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    try:
        varlen_attn(q, q, q, cu, cu, longest, longest, window_size=(-1, 0))
    except (TypeError, RuntimeError):  # an older signature, or a GPU it does not run on
        return None
    return lambda: varlen_attn(q, q, q, cu, cu, longest, longest, window_size=(-1, 0))


def host_overhead(dtype):
    """Each entry point's host time beside PyTorch's call for the same
    problem (the issue's bar: at most 1.0), and the package against the C
    call underneath."""
    q, k, v = (torch.randn(1, 128, 8, 64, device="cuda", dtype=dtype) for _ in range(3))
    out = torch.empty_like(q)
    lse = torch.empty(1, 8, 128, device="cuda")
    views = [_ops._viewed(t) for t in (q, k, v, out)]
    args = _ops._call(*views, lse, 1, 0, -1, -1, 0.0, 0.125, 0, 0, 0, 0, 0, 0, 0)
    spec = _ops._spec(dtype, 64, 1, False, 0, 0, 0, 0)
    ctx = _native.device_context(q.device.index)
    fg_forward, h, sp, ar = _native._lib.fg_forward, ctx.handle, ctypes.byref(spec), ctypes.byref(args)
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
    # a decoding step: one query of 32 heads over 4k keys of 8 KV heads, in
    # transformers' (B, H, S, D) cache, and over 250 keys in pages of 16
    q1 = torch.randn(1, 32, 1, 128, device="cuda", dtype=dtype)
    kc, vc = (torch.randn(1, 8, 4096, 128, device="cuda", dtype=dtype) for _ in range(2))
    kp, vp = (torch.randn(16, 8, 16, 128, device="cuda", dtype=dtype) for _ in range(2))
    table = torch.arange(16, device="cuda", dtype=torch.int32).reshape(1, 16)
    lens = torch.tensor([250], device="cuda", dtype=torch.int32)
    # two packed sequences of 64 rows
    qp = torch.randn(128, 8, 64, device="cuda", dtype=dtype)
    cu = torch.tensor([0, 64, 128], device="cuda", dtype=torch.int32)
    with torch.no_grad():
        sdpa = ("F.scaled_dot_product_attention, causal",
                lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=True))
        step = ("F.scaled_dot_product_attention, the step",
                lambda: F.scaled_dot_product_attention(q1, kc, vc, enable_gqa=True))
        rows = [("C call (ctypes, prebuilt arguments)", lambda: fg_forward(h, sp, ar)), sdpa,
                ("flashgen.attention", lambda: flashgen.attention(q, k, v, causal=True)),
                ("flashgen.scaled_dot_product_attention", lambda:
                 flashgen.scaled_dot_product_attention(qt, kt, vt, is_causal=True)),
                ("torch.ops.flashgen.forward", lambda: torch.ops.flashgen.forward(
                    q, k, v, 1, 0, -1, -1, 0.0, 0.125, 0, 0, 0, 0, 0, False)), step,
                ("flashgen.attention_with_kvcache", lambda: flashgen.attention_with_kvcache(
                    q1, kc, vc, layout="bhsd")),
                ("  pages of 16, 250 keys", lambda: flashgen.attention_with_kvcache(
                    q1, kp, vp, cache_seqlens=lens, block_table=table, layout="bhsd")),
                ("flashgen.attention_varlen", lambda: flashgen.attention_varlen(
                    qp, qp, qp, cu, cu, 64, 64, causal=True))]
        peers = {"flashgen.attention": sdpa[0], "flashgen.scaled_dot_product_attention": sdpa[0],
                 "flashgen.attention_with_kvcache": step[0], "  pages of 16, 250 keys": step[0],
                 "flashgen.attention_varlen": sdpa[0]}
        varlen = _varlen_peer(qp, cu, 64)
        if varlen is not None:
            rows.append(("torch varlen_attn", varlen))
        times = host_us(rows)
    print(f"\n# host time per call, {dtype}, no grad, median of 9 rounds of 1000 calls, the rows "
          "in turn: (1, 128, 8, 64) causal; a step of 32/8 heads, d 128, one query; two packed "
          "sequences of 64 rows; the ratio to PyTorch's call for the same problem")
    for name, us in times.items():
        peer = peers.get(name)
        line = f"{name:42s} {us:7.2f} us"
        if peer:
            line += f"   {us / times[peer]:.2f} of {peer.strip()}"
        if name == "flashgen.attention_varlen" and varlen is not None:
            line += f", {us / times['torch varlen_attn']:.2f} of torch varlen_attn"
        print(line)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtype", choices=["bf16", "fp16"], default="bf16")
    ap.add_argument("--quick", action="store_true", help="two sequence lengths only")
    a = ap.parse_args()
    dtype = torch.bfloat16 if a.dtype == "bf16" else torch.float16
    table(dtype, a.quick)
    host_overhead(dtype)


if __name__ == "__main__":
    main()

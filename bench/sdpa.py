"""PyTorch's scaled_dot_product_attention on the shapes of `flashgen bench`,
flash and cuDNN backends, FlexAttention (compiled, with a block mask for
causal; no dropout) and, where the package flash-attn-4 is importable,
FlashAttention 4 (its CuTe DSL kernels; no dropout), in the same run; prints
them beside flashgen's figures and flashgen's ratio to the best of them.
Where the flashgen package imports, flashgen is timed here too, through it,
in turns with the peers (each shape ROUNDS rounds of every implementation
once, each figure the median of its rounds), so all run under the same
clock, power and heat; the CSV's figure (`flashgen bench`, its own process,
earlier) is printed last as "bench". Without the package, flashgen's figures
are the CSV's.

usage: flashgen bench --csv > fg.csv && python3 bench/sdpa.py fg.csv [other.csv]
       flashgen bench --backward --csv > fgb.csv && python3 bench/sdpa.py fgb.csv
other.csv: a second flashgen run (another family, FLASHGEN_FAMILIES=fwd_sm80),
printed beside the first. --results FILE also writes flashgen's figures and
the peers' in the results format (bench/results.py), which
bench/plot_speed.py draws; a forward and a backward run may go to one file
(the second run appends).
"""
import csv
import datetime
import os
import subprocess
import sys
import time

import results  # bench/, the script's folder

RESULTS = None  # --results FILE
_rows = []

if __name__ == "__main__":  # the arguments, then what the run needs (time_ms is imported too)
    argv = sys.argv[1:]
    if "--results" in argv:
        at = argv.index("--results")
        RESULTS = argv[at + 1] if at + 1 < len(argv) else None
        del argv[at:at + 2]
    if len(argv) not in (1, 2) or ("--results" in sys.argv and not RESULTS):
        print("usage: python3 bench/sdpa.py FG.csv [OTHER.csv] [--results FILE], FG.csv from "
              "`flashgen bench --csv`", file=sys.stderr)
        sys.exit(2)
    sys.argv[1:] = argv
    from requires import torch_and_gpus  # bench/, the script's folder
    torch_and_gpus()

import torch  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402
from torch.nn.functional import scaled_dot_product_attention as sdpa  # noqa: E402


WARM_S = 0.5  # seconds of calls before the samples, as `flashgen bench` (harness/timing.c)


def time_ms(fn, repeats=20):
    """Milliseconds per call: the median of 5 samples of `repeats` calls,
    after a first call (compiling, where a peer compiles) and WARM_S seconds
    of calls, so the GPU runs at the clock it holds under load, not the one
    it boosts to from idle."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    fn()
    torch.cuda.synchronize()
    warm_from = time.perf_counter()
    while time.perf_counter() - warm_from < WARM_S:
        for _ in range(repeats):
            fn()
        torch.cuda.synchronize()
    samples = []
    for _ in range(5):
        start.record()
        for _ in range(repeats):
            fn()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) / repeats)
    return sorted(samples)[2]


ROUNDS = 3  # rounds of in_turns


def in_turns(timers):
    """{name: timer} -> {name: median of ROUNDS results}: every timer called
    once a round, in turn, so each runs under the clock and heat the others
    do; a timer returns a figure, a tuple of figures (the median taken of
    each), or None (then None); a timer that is not there (False) gives None."""
    got = {name: [] for name in timers}
    for _ in range(ROUNDS):
        for name, timer in timers.items():
            got[name].append(timer() if timer else None)
    median = lambda xs: sorted(xs)[len(xs) // 2]
    out = {}
    for name, rounds in got.items():
        if any(r is None for r in rounds):
            out[name] = None
        elif isinstance(rounds[0], tuple):
            out[name] = tuple(median([r[i] for r in rounds]) for i in range(len(rounds[0])))
        else:
            out[name] = median(rounds)
    return out


_flashgen = []  # the flashgen package, or None, imported once


def flashgen_package():
    """The flashgen package, where it imports and runs a call; else None."""
    if not _flashgen:
        try:
            import flashgen
            x = torch.randn(1, 128, 1, 64, device="cuda", dtype=torch.bfloat16)
            flashgen.attention(x, x, x)
            _flashgen.append(flashgen)
        except Exception:  # noqa: BLE001 - not importable here: the CSV's figures stand
            _flashgen.append(None)
    return _flashgen[0]


def flashgen_tflops(d, seqlen, batch, heads, causal, dropout):
    fg = flashgen_package()
    q, k, v = (torch.randn(batch, seqlen, heads, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    flops = 4 * batch * heads * seqlen * seqlen * d / (2 if causal else 1)
    ms = time_ms(lambda: fg.attention(q, k, v, causal=causal, dropout_p=dropout))
    return flops / (ms * 1e-3) / 1e12


def flashgen_backward(d, seqlen, batch, heads, causal, dropout, deterministic=False):
    """(backward ms, forward+backward ms) of flashgen through its package; the
    deterministic schedule's backward alone ((ms, None))."""
    fg = flashgen_package()
    leaves = [torch.randn(batch, seqlen, heads, d, device="cuda", dtype=torch.bfloat16,
                          requires_grad=True) for _ in range(3)]
    call = lambda: fg.attention(*leaves, causal=causal, dropout_p=dropout, deterministic=deterministic)
    out = call()
    dout = torch.randn_like(out)
    bwd = time_ms(lambda: torch.autograd.grad(out, leaves, dout, retain_graph=True))
    if deterministic:
        return bwd, None
    both = time_ms(lambda: torch.autograd.grad(call(), leaves, dout))
    return bwd, both


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


_flex = None


def flex_tflops(d, seqlen, batch, heads, causal, dropout):
    global _flex
    if dropout:
        return None
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    if _flex is None:
        # one compiled kernel per shape: more than dynamo keeps by default
        torch._dynamo.config.recompile_limit = 256
        _flex = torch.compile(flex_attention, dynamic=False)
    q, k, v = (torch.randn(batch, seqlen, heads, d, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
               for _ in range(3))
    mask = create_block_mask(lambda b, h, i, j: i >= j, None, None, seqlen, seqlen) if causal else None
    flops = 4 * batch * heads * seqlen * seqlen * d / (2 if causal else 1)
    try:
        ms = time_ms(lambda: _flex(q, k, v, block_mask=mask))
    except Exception:  # shapes the Triton kernel cannot take (shared memory)
        return None
    return flops / (ms * 1e-3) / 1e12


_fa4 = {}  # name -> FlashAttention 4's function or None, looked up once


def fa4(name="flash_attn_func"):
    """FlashAttention 4's function of that name (flash_attn_func,
    flash_attn_varlen_func), or None where flash-attn-4 (or its CuTe DSL
    libraries) cannot be imported."""
    if name not in _fa4:
        try:
            from flash_attn.cute import interface
            _fa4[name] = getattr(interface, name)
        except Exception:  # noqa: BLE001 - absent, or its libraries missing: no column
            _fa4[name] = None
    return _fa4[name]


def fa4_out(out):
    """The output of a FlashAttention 4 call (some versions return (out, lse))."""
    return out[0] if isinstance(out, tuple) else out


def _fa4_out(q, k, v, causal):
    return fa4_out(fa4()(q, k, v, causal=causal))


def fa4_tflops(d, seqlen, batch, heads, causal, dropout):
    if dropout or fa4() is None:
        return None
    q, k, v = (torch.randn(batch, seqlen, heads, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    flops = 4 * batch * heads * seqlen * seqlen * d / (2 if causal else 1)
    try:
        ms = time_ms(lambda: _fa4_out(q, k, v, causal))
    except Exception:  # noqa: BLE001 - a head dim or target it does not serve
        return None
    return flops / (ms * 1e-3) / 1e12


def fa4_backward(d, seqlen, batch, heads, causal, dropout):
    """(backward ms, forward+backward ms) of FlashAttention 4, or None."""
    if dropout or fa4() is None:
        return None
    leaves = [torch.randn(batch, seqlen, heads, d, device="cuda", dtype=torch.bfloat16,
                          requires_grad=True) for _ in range(3)]
    try:
        out = _fa4_out(*leaves, causal)
        dout = torch.randn_like(out)
        bwd = time_ms(lambda: torch.autograd.grad(out, leaves, dout, retain_graph=True))
        both = time_ms(lambda: torch.autograd.grad(_fa4_out(*leaves, causal), leaves, dout))
    except Exception:  # noqa: BLE001
        return None
    return bwd, both


def sdpa_backward(backend, d, seqlen, batch, heads, causal, dropout):
    """(backward ms, forward+backward ms), or None where the backend refuses."""
    leaves = [torch.randn(batch, seqlen, heads, d, device="cuda", dtype=torch.bfloat16,
                          requires_grad=True) for _ in range(3)]
    q, k, v = (x.transpose(1, 2) for x in leaves)
    try:
        with sdpa_kernel(backend):
            out = sdpa(q, k, v, is_causal=causal, dropout_p=dropout)
            dout = torch.randn_like(out)
            bwd = time_ms(lambda: torch.autograd.grad(out, leaves, dout, retain_graph=True))
            both = time_ms(lambda: torch.autograd.grad(
                sdpa(q, k, v, is_causal=causal, dropout_p=dropout), leaves, dout))
    except RuntimeError:
        return None
    return bwd, both


def _software():
    driver = "?"
    try:
        driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                capture_output=True, text=True, timeout=30).stdout.split()[0]
    except (OSError, IndexError, subprocess.SubprocessError):
        pass
    return f"CUDA {torch.version.cuda}, driver {driver}, PyTorch {torch.__version__}"


def _flashgen_cli():
    """FLASHGEN_CLI, else the command line built beside FLASHGEN_LIBRARY, else
    flashgen on PATH."""
    library = os.environ.get("FLASHGEN_LIBRARY")
    beside = os.path.join(os.path.dirname(library), "flashgen") if library else None
    if "FLASHGEN_CLI" not in os.environ and beside and os.access(beside, os.X_OK):
        return beside
    return os.environ.get("FLASHGEN_CLI", "flashgen")


def _flashgen_version():
    try:
        out = subprocess.run([_flashgen_cli(), "--version"],
                             capture_output=True, text=True, timeout=30).stdout.split()
        return out[1] if len(out) > 1 else "?"
    except (OSError, subprocess.SubprocessError):
        return "?"


def record(pass_, impl, r, tflops, kernels=""):
    """One figure for --results: r is flashgen's CSV row of the shape."""
    if RESULTS is None or not tflops:
        return
    fg = impl.startswith("flashgen")
    _rows.append({"pass": pass_, "impl": impl, "head_dim": r["head_dim"], "seqlen": r["seqlen"],
                  "causal": r["causal"], "dropout": r["dropout"], "tflops": f"{tflops:.1f}",
                  "gpu": torch.cuda.get_device_name(),
                  "recorded": datetime.date.today().isoformat(), "software": _software(),
                  "flashgen": _flashgen_version() if fg else "",
                  "kernels": os.environ.get("FLASHGEN_FAMILIES", "") if fg else "",
                  "source": f"bench/sdpa.py {os.path.basename(sys.argv[1])}, one run"})


def save_results():
    if RESULTS is None:
        return
    old = results.read(RESULTS) if os.path.exists(RESULTS) else []
    fresh = {(r["pass"], r["impl"], int(r["head_dim"]), int(r["seqlen"]), int(r["causal"]),
              float(r["dropout"])) for r in _rows}
    kept = [r for r in old if (r["pass"], r["impl"], r["head_dim"], r["seqlen"], r["causal"],
                               r["dropout"]) not in fresh]
    results.write(RESULTS, kept + _rows, [f"written by bench/sdpa.py on "
                                          f"{datetime.date.today().isoformat()}"])
    print(f"wrote {len(_rows)} figures to {RESULTS}")


def main_backward(rows):
    here = flashgen_package() is not None
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}")
    print("bf16 backward TFLOP/s (2.5x forward FLOPs) and forward+backward (3.5x), "
          "16k tokens, hidden 2048; vs best: forward+backward against the fastest of flash, cudnn, fa4"
          + ("" if fa4() else " (fa4: flash-attn-4 not importable)"))
    print(f"flashgen timed here in turns with the peers, medians of {ROUNDS} rounds; bench: the CSV's "
          "forward+backward" if here else "flashgen: the CSV's figures (the flashgen package does not import)")
    print(f"{'d':>4} {'seq':>6} {'causal':>6} {'drop':>5} {'fg bwd':>7} {'det':>7} {'flash':>7} "
          f"{'cudnn':>7} {'fa4':>7} {'vs flash':>8} {'det/fast':>8} {'fg f+b':>7} {'flash':>7} {'cudnn':>7} "
          f"{'fa4':>7} {'vs best':>8} {'bench':>7}")
    for r in rows:
        d, s, b, h = (int(r[x]) for x in ("head_dim", "seqlen", "batch", "heads"))
        causal, drop = r["causal"] == "1", float(r["dropout"])
        flops = 4 * b * h * s * s * d / (2 if causal else 1)
        tf = lambda ms, mult: mult * flops / (ms * 1e-3) / 1e12
        shape = (d, s, b, h, causal, drop)
        ms = in_turns({
            "fg": here and (lambda: flashgen_backward(*shape)),
            "det": here and (lambda: flashgen_backward(*shape, deterministic=True)[:1]),
            "flash": lambda: sdpa_backward(SDPBackend.FLASH_ATTENTION, *shape),
            "cudnn": lambda: sdpa_backward(SDPBackend.CUDNN_ATTENTION, *shape),
            "fa4": lambda: fa4_backward(*shape)})
        bench = float(r["all_tflops"])
        if here:
            fg, fg_a, det = tf(ms["fg"][0], 2.5), tf(ms["fg"][1], 3.5), tf(ms["det"][0], 2.5)
        else:
            fg, det, fg_a = float(r["bwd_tflops"]), float(r["det_tflops"]), bench
        fl, cu, f4 = ms["flash"], ms["cudnn"], ms["fa4"]
        fmt = lambda x: f"{x:7.1f}" if x else "    n/a"
        fl_b, cu_b, f4_b = (tf(x[0], 2.5) if x else None for x in (fl, cu, f4))
        fl_a, cu_a, f4_a = (tf(x[1], 3.5) if x else None for x in (fl, cu, f4))
        for pass_, impl, value in (("backward", "flashgen", fg),
                                   ("backward", "flashgen-deterministic", det),
                                   ("backward", "sdpa-flash", fl_b), ("backward", "sdpa-cudnn", cu_b),
                                   ("backward", "fa4", f4_b),
                                   ("forward+backward", "flashgen", fg_a),
                                   ("forward+backward", "sdpa-flash", fl_a),
                                   ("forward+backward", "sdpa-cudnn", cu_a),
                                   ("forward+backward", "fa4", f4_a)):
            record(pass_, impl, r, value)
        ratio = f"{fg / fl_b:8.2f}" if fl_b else "     n/a"
        best = max([x for x in (fl_a, cu_a, f4_a) if x] or [0])
        vs_best = f"{fg_a / best:8.2f}" if best else "     n/a"
        print(f"{d:4d} {s:6d} {'yes' if causal else 'no':>6} {drop:5.1f} {fg:7.1f} {det:7.1f} "
              f"{fmt(fl_b)} {fmt(cu_b)} {fmt(f4_b)} {ratio} {det / fg:8.2f} {fg_a:7.1f} "
              f"{fmt(fl_a)} {fmt(cu_a)} {fmt(f4_a)} {vs_best} {bench:7.1f}")
        sys.stdout.flush()


def main():
    all_rows = list(csv.DictReader(open(sys.argv[1])))
    if all_rows and all_rows[0]["kind"] == "flashgen_bwd":
        return main_backward(all_rows)
    rows = [r for r in all_rows if r["kind"] == "flashgen"]
    other = {}
    if len(sys.argv) > 2:
        for r in csv.DictReader(open(sys.argv[2])):
            if r["kind"] == "flashgen":
                other[tuple(r[x] for x in ("head_dim", "seqlen", "causal", "dropout"))] = float(r["tflops"])
    here = flashgen_package() is not None
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}")
    print("bf16 forward TFLOP/s, 16k tokens, hidden 2048; best: the fastest of flash, cudnn, flex, fa4"
          + ("" if fa4() else " (fa4: flash-attn-4 not importable)"))
    print(f"flashgen timed here in turns with the peers, medians of {ROUNDS} rounds; bench: the CSV's"
          if here else "flashgen: the CSV's figures (the flashgen package does not import)")
    print(f"{'d':>4} {'seq':>6} {'causal':>6} {'drop':>5} {'flashgen':>9} {'other':>7} {'flash':>7} "
          f"{'cudnn':>7} {'flex':>7} {'fa4':>7} {'vs cudnn':>8} {'vs best':>8} {'bench':>7}")
    fmt = lambda x: f"{x:7.1f}" if x else "    n/a"
    for r in rows:
        d, s, b, h = (int(r[x]) for x in ("head_dim", "seqlen", "batch", "heads"))
        causal, drop = r["causal"] == "1", float(r["dropout"])
        shape = (d, s, b, h, causal, drop)
        figures = in_turns({"fg": here and (lambda: flashgen_tflops(*shape)),
                            "flash": lambda: sdpa_tflops(SDPBackend.FLASH_ATTENTION, *shape),
                            "cudnn": lambda: sdpa_tflops(SDPBackend.CUDNN_ATTENTION, *shape),
                            "flex": lambda: flex_tflops(*shape), "fa4": lambda: fa4_tflops(*shape)})
        fl, cu, fx, f4 = (figures[x] for x in ("flash", "cudnn", "flex", "fa4"))
        bench = float(r["tflops"])
        fg = figures["fg"] if here else bench
        best = max([x for x in (fl, cu, fx, f4) if x] or [0])
        vs_cu = f"{fg / cu:8.2f}" if cu else "     n/a"
        vs_best = f"{fg / best:8.2f}" if best else "     n/a"
        o = other.get(tuple(r[x] for x in ("head_dim", "seqlen", "causal", "dropout")))
        for impl, value in (("flashgen", fg), ("sdpa-flash", fl), ("sdpa-cudnn", cu), ("flex", fx),
                            ("fa4", f4)):
            record("forward", impl, r, value)
        print(f"{d:4d} {s:6d} {'yes' if causal else 'no':>6} {drop:5.1f} {fg:9.1f} {fmt(o)} {fmt(fl)} "
              f"{fmt(cu)} {fmt(fx)} {fmt(f4)} {vs_cu} {vs_best} {bench:7.1f}")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
    save_results()

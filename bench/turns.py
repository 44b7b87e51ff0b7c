"""Two flashgen builds timed in turns: before and after a kernel change.

    python3 bench/turns.py A/flashgen B/flashgen [-d 128 -d 64] [--seqlen 8192]
                           [--rounds 3] [--repeats 30] [--backward]

Runs `flashgen bench --csv` of each build for each head dim and length, the
builds alternating (A then B in odd rounds, B then A in even ones), so both
run under the same clock, power and heat. Each build compiles into a kernel
cache of its own. Prints every shape's times in milliseconds, round by round,
and the ratio of B's median to A's (below 1: B is faster). With --backward the
times are the backward's alone (fast schedule), from `bench --backward`.
"""
import argparse
import csv
import io
import os
import shutil
import statistics
import subprocess
import sys
import tempfile


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("a", help="the first build's flashgen executable")
    ap.add_argument("b", help="the second build's flashgen executable")
    ap.add_argument("-d", "--head-dim", type=int, action="append",
                    help="head dims (repeatable; default 128)")
    ap.add_argument("--seqlen", type=int, action="append",
                    help="sequence lengths (repeatable; default 8192 and 2048)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=30, help="timed runs a shape a call")
    ap.add_argument("--backward", action="store_true", help="time the backward")
    return ap.parse_args(argv)


def shape_times(exe, cache, d, seqlen, repeats, backward):
    """{(d, seqlen, batch, heads, causal, dropout): ms} from one bench call."""
    cmd = [exe, "bench", "--csv", "-d", str(d), "--seqlen", str(seqlen),
           "--repeats", str(repeats)] + (["--backward"] if backward else [])
    env = dict(os.environ, FLASHGEN_CACHE_DIR=cache, FLASHGEN_PROGRESS="0")
    out = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({out.returncode}): {out.stderr.strip()}")
    kind = "flashgen_bwd" if backward else "flashgen"
    col = "bwd_ms" if backward else "ms"
    times = {}
    rows = [line for line in out.stdout.splitlines() if line.startswith(("kind,", kind + ","))]
    for row in csv.DictReader(io.StringIO("\n".join(rows))):
        if row["kind"] != kind:
            continue
        key = tuple(row[k] for k in ("head_dim", "seqlen", "batch", "heads", "causal", "dropout"))
        times[key] = float(row[col])
    return times


def main(argv):
    args = parse_args(argv)
    dims = args.head_dim or [128]
    lens = args.seqlen or [8192, 2048]
    builds = {"A": args.a, "B": args.b}
    caches = {name: tempfile.mkdtemp(prefix=f"flashgen-turns-{name}-") for name in builds}
    times = {}  # (shape, build) -> [ms per round]
    try:
        for r in range(args.rounds):
            order = ["A", "B"] if r % 2 == 0 else ["B", "A"]
            for d in dims:
                for seqlen in lens:
                    for name in order:
                        got = shape_times(builds[name], caches[name], d, seqlen, args.repeats,
                                          args.backward)
                        for shape, ms in got.items():
                            times.setdefault((shape, name), []).append(ms)
    finally:
        for cache in caches.values():
            shutil.rmtree(cache, ignore_errors=True)
    print(f"A = {args.a}\nB = {args.b}\n{'backward' if args.backward else 'forward'} ms, "
          f"{args.rounds} rounds in turns")
    print(f"{'d':>4} {'seq':>6} {'causal':>6} {'drop':>5}  {'A':<28} {'B':<28} B/A")
    shapes = sorted({shape for shape, _ in times}, key=lambda s: (int(s[0]), -int(s[1]), s[4], s[5]))
    for shape in shapes:
        a, b = times.get((shape, "A"), []), times.get((shape, "B"), [])
        ratio = statistics.median(b) / statistics.median(a) if a and b else float("nan")
        fa = " ".join(f"{x:.3f}" for x in a)
        fb = " ".join(f"{x:.3f}" for x in b)
        causal = "yes" if shape[4] == "1" else "no"
        print(f"{shape[0]:>4} {shape[1]:>6} {causal:>6} {shape[5]:>5}  {fa:<28} {fb:<28} {ratio:.3f}")


if __name__ == "__main__":
    main(sys.argv[1:])

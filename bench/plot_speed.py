"""The picture of flashgen's speed beside its peers: forward and
forward+backward TFLOP/s at d = 64, 128 and 256, causal or not, from a results
file (bench/results.py has the format; bench/sdpa.py --results writes one),
with the GPU, the dates and the versions written under it.

usage: python3 bench/plot_speed.py [RESULTS.csv] [-o OUT.svg|OUT.png]
                                   [--seqlen S] [--dropout P]
defaults: bench/results-h200.csv, docs/speed-h200.svg, seqlen 8192, dropout 0.

Needs matplotlib (an optional dependency: pip install matplotlib); without
it, it says so in one line and exits with status 1.
"""
import argparse
import collections
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import results  # noqa: E402  (bench/results.py)

PASSES = [("forward", "forward"), ("forward+backward", "forward + backward")]
IMPLS = [("flashgen", "flashgen", "#d62728"),
         ("sdpa-flash", "PyTorch SDPA, FlashAttention 2", "#7f7f7f"),
         ("sdpa-cudnn", "PyTorch SDPA, cuDNN", "#1f77b4"),
         ("flex", "FlexAttention (compiled)", "#2ca02c"),
         ("fa4", "FlashAttention 4", "#9467bd")]
DIMS = [64, 128, 256]


def span(values):
    values = sorted(set(v for v in values if v))
    if not values:
        return "?"
    return values[0] if len(values) == 1 else f"{values[0]} to {values[-1]}"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", nargs="?", default=os.path.join(HERE, "results-h200.csv"))
    picture = os.path.normpath(os.path.join(HERE, "..", "docs", "speed-h200.svg"))
    parser.add_argument("-o", "--out", default=picture)
    parser.add_argument("--seqlen", type=int, default=8192)
    parser.add_argument("--dropout", type=float, default=0.0)
    args = parser.parse_args()
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ModuleNotFoundError as e:
        if e.name != "matplotlib" and not (e.name or "").startswith("matplotlib."):
            raise
        # an optional dependency: one line saying so, as the benchmarks say what they need
        sys.exit("plot_speed.py: needs matplotlib (pip install matplotlib)")

    rows = [r for r in results.read(args.results)
            if r["seqlen"] == args.seqlen and abs(r["dropout"] - args.dropout) < 1e-9]
    if not rows:
        print(f"bench/plot_speed.py: {args.results} has no rows at seqlen {args.seqlen}, "
              f"dropout {args.dropout}", file=sys.stderr)
        return 1
    value = {(r["pass"], r["impl"], r["head_dim"], r["causal"]): r for r in rows}
    groups = [(d, c) for d in DIMS for c in (0, 1)]

    plt.rcParams.update({"svg.fonttype": "none", "svg.hashsalt": "flashgen", "font.size": 9})
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.6), sharey=True)
    impls = [i for i in IMPLS if any(r["impl"] == i[0] for r in rows)]  # those measured
    width = 0.8 / len(impls)
    notes, used = [], []
    for ax, (pass_, title) in zip(axes, PASSES):
        kept = [r for r in rows if r["pass"] == pass_ and r["impl"] == "flashgen"]
        usual = collections.Counter(r["kernels"] for r in kept).most_common(1)
        usual = usual[0][0] if usual else ""
        for i, (impl, label, color) in enumerate(impls):
            xs, ys, odd = [], [], []
            for g, (d, c) in enumerate(groups):
                r = value.get((pass_, impl, d, c))
                if r is None:  # no figure: no bar
                    continue
                xs.append(g + (i - (len(impls) - 1) / 2) * width)
                ys.append(r["tflops"])
                odd.append(impl == "flashgen" and r["kernels"] != usual)
                used.append(r)
            if not xs:
                continue
            bars = ax.bar(xs, ys, width, color=color, label=label)
            for bar, y, other in zip(bars, ys, odd):
                if other:
                    bar.set_hatch("///")
                    bar.set_facecolor("#f4a3a3")
                    bar.set_edgecolor(color)
                if impl == "flashgen":
                    ax.annotate(f"{y:.0f}", (bar.get_x() + width / 2, y), ha="center",
                                va="bottom", fontsize=7, xytext=(0, 1),
                                textcoords="offset points")
        for r in kept:
            if r["kernels"] != usual and (r["kernels"], r["recorded"]) not in \
                    [(n[1], n[2]) for n in notes]:
                notes.append((title, r["kernels"], r["recorded"]))
        ax.set_title(f"{title} ({usual})" if usual else title)
        ax.set_xticks(range(len(groups)))
        ax.set_xticklabels([f"d {d}\n{'causal' if c else 'no mask'}" for d, c in groups])
        ax.grid(axis="y", alpha=0.3)
        ax.set_axisbelow(True)
    axes[0].set_ylabel("TFLOP/s")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper center", ncol=len(labels), frameon=False,
               bbox_to_anchor=(0.5, 0.935))

    gpu = span(r["gpu"] for r in used)
    footer = [f"{gpu}; bf16, seqlen {args.seqlen}, 16k tokens, hidden 2048"
              f"{'' if args.dropout == 0 else f', dropout {args.dropout:g}'}; recorded "
              f"{span(r['recorded'] for r in used)}; "
              f"{span(r['software'] for r in used)}; flashgen "
              f"{span(r['flashgen'].split(' ')[0] for r in used if r['flashgen'])}"]
    for title, kernels, recorded in notes:
        footer.append(f"hatched: {title} from an earlier run ({recorded}) on {kernels}; "
                      "its peers are that run's")
    footer.append(f"data: {os.path.relpath(args.results, os.path.join(HERE, '..'))} "
                  "(its source column names each number's table); bench/plot_speed.py")
    fig.suptitle(f"flashgen against PyTorch's attention on {gpu} (TFLOP/s, higher is better)",
                 fontsize=11)
    fig.text(0.01, 0.01, "\n".join(footer), fontsize=7.5, va="bottom", ha="left")
    fig.tight_layout(rect=(0, 0.02 + 0.03 * len(footer), 1, 0.9))
    fig.savefig(args.out, metadata={"Date": None} if args.out.endswith(".svg") else None)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The results format that bench/plot_speed.py draws and bench/sdpa.py writes
(--results FILE): CSV, one measurement a row, lines starting with '#'
comments (say there where the numbers come from).

Columns:
  pass      forward, backward or forward+backward
  impl      flashgen, flashgen-deterministic, sdpa-flash (PyTorch's SDPA,
            FlashAttention 2 backend), sdpa-cudnn (its cuDNN backend), flex
            (compiled FlexAttention), fa4 (FlashAttention 4, flash-attn-4)
  head_dim, seqlen, causal (0/1), dropout (the probability)
  tflops    TFLOP/s: 4·b·h·S²·d for the forward, halved when causal; the
            backward 2.5x that, forward+backward 3.5x (bench/sdpa.py's count)
  gpu       the device's name, as CUDA gives it
  recorded  the date of the measurement (YYYY-MM-DD)
  software  CUDA, driver and PyTorch versions
  flashgen  flashgen's version (and commit) for flashgen's rows
  kernels   the kernel families that ran flashgen's rows
  source    where the number comes from (a table, a run)

The shapes are `flashgen bench`'s: bf16, 16k tokens (batch 16384/S), hidden
size 2048 (heads 2048/d)."""
import csv

COLUMNS = ["pass", "impl", "head_dim", "seqlen", "causal", "dropout", "tflops", "gpu", "recorded",
           "software", "flashgen", "kernels", "source"]


def read(path):
    """The rows of a results file as dicts, numbers converted."""
    with open(path, newline="") as f:
        lines = [line for line in f if line.strip() and not line.lstrip().startswith("#")]
    rows = list(csv.DictReader(lines))
    missing = [c for c in COLUMNS if rows and c not in rows[0]]
    if missing:
        raise ValueError(f"{path}: no column {', '.join(missing)} "
                         "(bench/results.py has the format)")
    for r in rows:
        for column in ("head_dim", "seqlen", "causal"):
            r[column] = int(r[column])
        r["dropout"], r["tflops"] = float(r["dropout"]), float(r["tflops"])
    return rows


def write(path, rows, comments=()):
    """Rows (dicts with COLUMNS) into path, after '# ' comment lines."""
    with open(path, "w", newline="") as f:
        for c in comments:
            f.write(f"# {c}\n")
        w = csv.DictWriter(f, COLUMNS, lineterminator="\n", extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow(r)

"""flashgen.tune: time tilings around the derived plan on this GPU and keep
the fastest (in tuning.tsv in the kernel cache folder), so later calls of the
same kernel and sequence-length bucket use it with no timing."""
import os
import sys
import time

from . import _native


def _dtype_name(dtype):
    name = str(dtype).replace("torch.", "")
    return {"float16": "fp16", "half": "fp16", "bfloat16": "bf16"}.get(name, name)


def _device_index(device):
    if device is None:
        try:
            import torch
            return torch.cuda.current_device()
        except ImportError:
            return 0
    if isinstance(device, int):
        return device
    index = getattr(device, "index", None)
    if index is None and str(device).startswith("cuda:"):
        index = int(str(device)[5:])
    return 0 if index is None else index


def _duration(seconds):
    """A duration as the progress line shows it: 4.2s, 37s, 3m05s, 1h02m (as
    the command line's)."""
    s = max(0.0, seconds)
    if s < 9.95:
        return f"{s:.1f}s"
    if s < 59.5:
        return f"{s:.0f}s"
    if s < 3599.5:
        whole = int(s + 0.5)
        return f"{whole // 60}m{whole % 60:02d}s"
    minutes = int(s / 60 + 0.5)
    return f"{minutes // 60}h{minutes % 60:02d}m"


def progress_line(what, done, total, elapsed, label=None):
    """The progress line, as the command line writes it: "flashgen: tune
    2/6 (33%), 41s elapsed, about 1m22s left: d128 bf16 causal seqlen 4096"."""
    line = f"flashgen: {what} {done}/{total}"
    if total > 0:
        line += f" ({100 * done // total}%)"
    line += f", {_duration(elapsed)} elapsed"
    if 0 < done < total:
        line += f", about {_duration(elapsed / done * (total - done))} left"
    if label:
        line += f": {label}"
    return line


class _Progress:
    """Progress on stream (sys.stderr): redrawn in place on a terminal, a
    line per update where FLASHGEN_PROGRESS=1 (or progress=True) asks for it
    elsewhere, nothing otherwise (FLASHGEN_PROGRESS=0, or progress=False)."""

    def __init__(self, what, total, progress=None, stream=None):
        self.stream = sys.stderr if stream is None else stream
        self.what, self.total, self.done = what, total, 0
        self.start = time.monotonic()
        self.shown = False
        try:
            terminal = self.stream.isatty()
        except (AttributeError, ValueError):
            terminal = False
        if progress is None:
            env = os.environ.get("FLASHGEN_PROGRESS", "")
            progress = {"1": True, "0": False}.get(env, terminal)
        self.mode = 0 if not progress else (1 if terminal else 2)

    def step(self, more, label=None):
        if not self.mode:
            return
        self.done += more
        line = progress_line(self.what, self.done, self.total, time.monotonic() - self.start,
                             label)
        if self.mode == 2:
            self.stream.write(line + "\n")
        else:
            columns = 80
            try:
                columns = os.get_terminal_size(self.stream.fileno()).columns
            except (AttributeError, OSError, ValueError):
                pass
            self.stream.write("\r" + line[:max(columns - 1, 1)] + "\033[K")
            self.shown = True
        self.stream.flush()

    def hide(self):
        if self.shown:
            self.stream.write("\r\033[K")
            self.stream.flush()
            self.shown = False

    def end(self):
        self.hide()
        if self.mode == 2:
            self.stream.write(f"flashgen: {self.what} finished in "
                              f"{_duration(time.monotonic() - self.start)}\n")
            self.stream.flush()
        self.mode = 0


def tune(head_dim, dtype="bf16", *, mask="none", dropout=False, sparsity=None, backward=False,
         seqlen=4096, device=None, progress=None, head_dim_v=None):
    """Tune the forward (or with backward=True the backward) kernel of a spec
    for seqlen's bucket on a CUDA device (default: PyTorch's current one).
    dtype: "fp16"/"bf16" or a torch dtype; mask: "none", "causal" or
    "window"; sparsity: None, a BlockLayout or a Butterfly (its kind and
    block size). head_dim_v: the value head dim, None for head_dim's (a
    kernel of its own). seqlen: a length, or a list of lengths (each bucket
    tuned in turn). Returns the report (a list of them for a list of lengths): derived
    and chosen plans, their median times in ms, the run-to-run spread, and
    whether the choice was saved.

    progress: None shows "flashgen: tune DONE/TOTAL (P%), ELAPSED elapsed,
    about LEFT left: WHAT" on sys.stderr when it is a terminal (FLASHGEN_PROGRESS=1
    shows it anyway, a line per update; FLASHGEN_PROGRESS=0 never); True or
    False to choose."""
    from .sparsity import describe
    several = not isinstance(seqlen, (int, str, bytes)) and hasattr(seqlen, "__iter__")
    lengths = [int(s) for s in seqlen] if several else [seqlen]
    kind, block_q, block_k, factors, _ = describe(sparsity)
    dtype_name = _dtype_name(dtype)
    spec = _native.make_spec(head_dim, dtype_name, mask, dropout,
                             ["none", "layout", "butterfly"][kind], (block_q, block_k), factors,
                             head_dim_v=head_dim_v)
    ctx = _native.device_context(_device_index(device))
    value = "" if head_dim_v is None or head_dim_v == head_dim else f"v{head_dim_v}"
    what = f"d{head_dim}{value} {dtype_name}" + ("" if mask == "none" else f" {mask}") + \
        (" dropout" if dropout else "") + (" backward" if backward else "")
    shown = _Progress("tune", len(lengths), progress)
    reports = []
    try:
        for i, length in enumerate(lengths):
            shown.step(1 if i else 0, f"{what} seqlen {length}")
            reports.append(ctx.tune(spec, "backward" if backward else "forward", length))
    finally:
        shown.end()
    return reports if several else reports[0]

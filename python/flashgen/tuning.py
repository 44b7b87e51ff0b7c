"""flashgen.tune: time tilings around the derived plan on this GPU and keep
the fastest (in tuning.tsv in the kernel cache folder), so later calls of the
same kernel and sequence-length bucket use it with no timing."""
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


def tune(head_dim, dtype="bf16", *, mask="none", dropout=False, sparsity=None, backward=False,
         seqlen=4096, device=None):
    """Tune the forward (or with backward=True the backward) kernel of a spec
    for seqlen's bucket on a CUDA device (default: PyTorch's current one).
    dtype: "fp16"/"bf16" or a torch dtype; mask: "none", "causal" or
    "window"; sparsity: None, a BlockLayout or a Butterfly (its kind and
    block size). Returns the report: derived and chosen plans, their median
    times in ms, the run-to-run spread, and whether the choice was saved."""
    from .sparsity import describe
    kind, block_q, block_k, factors, _ = describe(sparsity)
    spec = _native.make_spec(head_dim, _dtype_name(dtype), mask, dropout,
                             ["none", "layout", "butterfly"][kind], (block_q, block_k), factors)
    ctx = _native.device_context(_device_index(device))
    return ctx.tune(spec, "backward" if backward else "forward", seqlen)

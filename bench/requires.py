"""What a benchmark needs before it starts: PyTorch and CUDA GPUs. A script
that lacks one ends at once with one line saying what, never a traceback."""
import os
import sys


def torch_and_gpus(count=1):
    """torch, where PyTorch is installed and sees at least count CUDA GPUs;
    else exit 1 with the reason on one line."""
    script = os.path.basename(sys.argv[0])
    try:
        import torch
    except ModuleNotFoundError as e:
        if e.name != "torch":
            raise
        sys.exit(f"{script}: needs PyTorch (pip install torch)")
    seen = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if seen < count:
        wanted = "a CUDA GPU" if count == 1 else f"{count} CUDA GPUs"
        sys.exit(f"{script}: needs {wanted}, and PyTorch sees {seen or 'none'}")
    return torch

"""Tests of the Python package. Without PyTorch, or without a GPU, the tests
that need them report themselves skipped with the reason. Every test runs
with its own kernel cache folder, removed afterwards."""
import os

import pytest


@pytest.fixture(autouse=True)
def _kernel_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FLASHGEN_CACHE_DIR", str(tmp_path / "kernel-cache"))


def gpu_or_skip():
    """torch, after checking that a CUDA GPU is there."""
    torch = pytest.importorskip("torch", reason="PyTorch is not installed")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU", allow_module_level=True)
    return torch


REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

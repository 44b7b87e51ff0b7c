"""flashgen: exact attention with CUDA kernels generated for the problem at hand."""
from ._native import library_path

__all__ = ["library_path"]

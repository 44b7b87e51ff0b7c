"""flashgen: exact attention with CUDA kernels generated for the problem at hand.

    import flashgen
    out = flashgen.attention(q, k, v, causal=True)          # (B, S, H, D)
    out = flashgen.scaled_dot_product_attention(q, k, v, is_causal=True)   # (B, H, S, D)
    out = flashgen.attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_q, max_k)
    out = flashgen.attention_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=lengths,
                                          block_table=pages)                  # decoding
    out = flashgen.attention(q, k, v, score_mod="s + bias[h, q - k + seqlen_k - 1]",
                             aux={"bias": bias})          # score and mask expressions
    out = flashgen.flex_attention(q, k, v, score_mod=fn, block_mask=mask)   # FlexAttention's

    from flashgen import distributed        # sequences sharded across GPUs (NCCL)
    out = distributed.context_parallel_attention(q_shard, k_shard, v_shard, group, causal=True)

Kernels compile on first use (one line each on the "flashgen" logger) and are
cached on disk. Without PyTorch, the package still plans, generates and
compiles kernels for named targets through flashgen.Context."""
from ._native import (Context, Error, InvalidArgument, NoDevice, Unsupported, add_bundle,
                      library_path, make_spec, version)
from .sparsity import BlockLayout, BlockMask, Butterfly
from .tuning import tune

__version__ = version()
__all__ = ["attention", "attention_varlen", "attention_with_kvcache", "mla_with_kvcache",
           "scaled_dot_product_attention", "flex_attention", "create_block_mask", "translate",
           "BlockLayout", "BlockMask", "Butterfly", "Context",
           "Error", "InvalidArgument", "NoDevice", "Unsupported", "add_bundle", "make_spec",
           "tune", "library_path", "__version__"]

try:
    import torch as _torch  # noqa: F401
except ImportError:
    _torch = None

if _torch is not None:
    from ._api import (attention, attention_varlen, attention_with_kvcache, create_block_mask,
                       flex_attention, mla_with_kvcache, scaled_dot_product_attention)
    from ._expressions import translate
else:
    def _needs_torch(name):
        def call(*args, **kwargs):
            from ._requires import missing
            raise missing(f"flashgen.{name}", "torch")
        call.__name__ = name
        return call

    attention = _needs_torch("attention")
    attention_varlen = _needs_torch("attention_varlen")
    attention_with_kvcache = _needs_torch("attention_with_kvcache")
    mla_with_kvcache = _needs_torch("mla_with_kvcache")
    scaled_dot_product_attention = _needs_torch("scaled_dot_product_attention")
    flex_attention = _needs_torch("flex_attention")
    create_block_mask = _needs_torch("create_block_mask")
    translate = _needs_torch("translate")

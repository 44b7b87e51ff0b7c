"""flashgen as a transformers attention implementation.

    import flashgen.integrations.transformers as fg_tf
    fg_tf.register()
    model = AutoModelForCausalLM.from_pretrained(..., attn_implementation="flashgen")

Serves decoder models (causal, or non-causal where the module says so) with
grouped-query attention, dropout and KV caches (the query block is aligned
bottom-right: the last query sees every key). Refused, with an error naming
what: padded batches (an attention mask with zeros), packed sequences,
sliding windows, logit soft-capping and attention sinks."""
import torch

import flashgen

NAME = "flashgen"
_REFUSED = {"sliding_window": "sliding-window attention", "softcap": "logit soft-capping",
            "s_aux": "attention sinks"}


def _packed(position_ids):
    # Packed sequences restart their positions inside a row.
    return position_ids is not None and position_ids.dim() == 2 and position_ids.shape[1] > 1 \
        and bool((position_ids[:, 1:] - position_ids[:, :-1] != 1).any())


def flashgen_attention_forward(module, query, key, value, attention_mask, scaling=None,
                               dropout=0.0, **kwargs):
    """query (B, H, S, D), key and value (B, Hkv, S, D) → ((B, S, H, D), None)."""
    if attention_mask is not None:
        raise NotImplementedError(
            "attn_implementation='flashgen': padded batches (an attention_mask with zeros) are "
            "not supported; pass unpadded sequences or use 'sdpa'")
    for name, what in _REFUSED.items():
        if kwargs.get(name) is not None:
            raise NotImplementedError(f"attn_implementation='flashgen': {what} ({name}="
                                      f"{kwargs[name]!r}) is not supported")
    if not torch.compiler.is_compiling() and _packed(kwargs.get("position_ids")):
        raise NotImplementedError("attn_implementation='flashgen': packed sequences "
                                  "(position_ids restarting within a row) are not supported")
    is_causal = kwargs.get("is_causal")
    if is_causal is None:
        is_causal = getattr(module, "is_causal", True)
    out = flashgen.attention(query, key, value, causal=bool(is_causal), align="bottom-right",
                             dropout_p=dropout, softmax_scale=scaling, layout="bhsd")
    return out.transpose(1, 2), None  # flashgen's (B, S, H, D) storage, contiguous


def _answer_flash_kernel_loading():
    """transformers 5 takes every implementation whose name holds "flash" for
    a flash-attention kernel and loads that kernel's functions when a model
    is made (a hub download for unknown names). flashgen's is an attention
    function with nothing to load: its load is answered here, and every
    other name still goes to transformers' loader."""
    try:
        from transformers import modeling_flash_attention_utils as fa
    except ImportError:
        return
    load = getattr(fa, "_lazy_imports", None)
    if load is None or getattr(load, "answers_flashgen", False):
        return

    def lazy_imports(implementation, *args, **kwargs):
        if implementation == NAME:
            return None, None, None, fa._pad_input, fa._unpad_input
        return load(implementation, *args, **kwargs)
    lazy_imports.answers_flashgen = True
    fa._lazy_imports = lazy_imports


def register():
    """Register "flashgen" with transformers' AttentionInterface, and its mask
    function: none for unpadded batches (padding then reaches the attention
    function as a mask, which it refuses)."""
    from transformers import AttentionInterface
    AttentionInterface.register(NAME, flashgen_attention_forward)
    _answer_flash_kernel_loading()
    try:
        from transformers.masking_utils import AttentionMaskInterface, flash_attention_mask
    except ImportError:  # older transformers build 4-D masks for every implementation
        return
    AttentionMaskInterface.register(NAME, flash_attention_mask)

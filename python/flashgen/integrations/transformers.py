"""flashgen as a transformers attention implementation.

    import flashgen.integrations.transformers as fg_tf
    fg_tf.register()
    model = AutoModelForCausalLM.from_pretrained(..., attn_implementation="flashgen")

Serves decoder models (causal, or non-causal where the module says so) with
grouped-query attention, dropout and KV caches (the query block is aligned
bottom-right: the last query sees every key), and padded batches: the 2-D
padding mask transformers passes to flash-style implementations is turned
into packed sequences (flashgen.attention_varlen), padding left or right,
and the padded rows of the output are zeros; and sequences packed into a
row, whose position_ids restart at 0 (padding-free training). Refused, with
an error naming what: other attention masks, position_ids that restart
beside a KV cache, sliding windows, logit soft-capping and attention
sinks."""
import torch

import flashgen

NAME = "flashgen"
_REFUSED = {"sliding_window": "sliding-window attention", "softcap": "logit soft-capping",
            "s_aux": "attention sinks"}


def _packed(position_ids):
    # Packed sequences restart their positions inside a row.
    return position_ids is not None and position_ids.dim() == 2 and position_ids.shape[1] > 1 \
        and bool((position_ids[:, 1:] - position_ids[:, :-1] != 1).any())


def _by_positions(query, key, value, position_ids, causal, dropout, scaling):
    """Sequences packed into rows: one starts at each position 0 and at each
    row's start. query (B, H, S, D), key and value (B, Hkv, S, D)."""
    B, H, S, D = query.shape
    starts = (position_ids.reshape(B, S) == 0)
    starts[:, 0] = True
    first = starts.flatten().nonzero().flatten().to(torch.int32)
    cu = torch.cat([first, first.new_tensor([B * S])])
    longest = int((cu[1:] - cu[:-1]).max())
    q, k, v = (x.transpose(1, 2).reshape(B * S, x.shape[1], D) for x in (query, key, value))
    out = flashgen.attention_varlen(q, k, v, cu, cu, longest, longest, causal=causal,
                                    dropout_p=dropout, softmax_scale=scaling)
    return out.view(B, S, H, D)


def _unpadded(query, key, value, mask, causal, dropout, scaling):
    """Attention of a padded batch through packed sequences. query (B, H, Sq,
    D), key and value (B, Hkv, Sk, D), mask (B, Sk) with 1 on real tokens;
    the queries are the last Sq positions (a KV cache's new tokens)."""
    B, H, Sq, D = query.shape
    Sk = key.shape[2]
    keep_k = mask.bool()
    keep_q = keep_k[:, -Sq:]

    def pack(x, keep):  # (B, H, S, D) -> (tokens, H, D), and the tokens' rows
        rows = keep.flatten().nonzero().flatten()
        return x.transpose(1, 2).reshape(-1, x.shape[1], D)[rows], rows

    def offsets(keep):
        lens = keep.sum(-1, dtype=torch.int32)
        return torch.nn.functional.pad(lens.cumsum(0, dtype=torch.int32), (1, 0)), lens

    (q, rows_q), (k, _), (v, _) = pack(query, keep_q), pack(key, keep_k), pack(value, keep_k)
    (cu_q, lens_q), (cu_k, lens_k) = offsets(keep_q), offsets(keep_k)
    out = flashgen.attention_varlen(q, k, v, cu_q, cu_k, int(lens_q.max()), int(lens_k.max()),
                                    causal=causal, align="bottom-right", dropout_p=dropout,
                                    softmax_scale=scaling)
    full = out.new_zeros((B * Sq, H, D))
    full[rows_q] = out
    return full.view(B, Sq, H, D)


def flashgen_attention_forward(module, query, key, value, attention_mask, scaling=None,
                               dropout=0.0, **kwargs):
    """query (B, H, S, D), key and value (B, Hkv, S, D) → ((B, S, H, D), None)."""
    if attention_mask is not None and (attention_mask.dim() != 2 or
                                       attention_mask.shape != (key.shape[0], key.shape[2])):
        raise NotImplementedError(
            "attn_implementation='flashgen': an attention_mask of shape "
            f"{tuple(attention_mask.shape)} is not supported (only the (batch, keys) padding "
            "mask of flash-style implementations); use 'sdpa'")
    for name, what in _REFUSED.items():
        if kwargs.get(name) is not None:
            raise NotImplementedError(f"attn_implementation='flashgen': {what} ({name}="
                                      f"{kwargs[name]!r}) is not supported")
    is_causal = kwargs.get("is_causal")
    if is_causal is None:
        is_causal = getattr(module, "is_causal", True)
    if attention_mask is not None:  # it says where the sequences are
        return _unpadded(query, key, value, attention_mask, bool(is_causal), dropout,
                         scaling), None
    position_ids = kwargs.get("position_ids")
    if not torch.compiler.is_compiling() and _packed(position_ids):
        if key.shape[2] != query.shape[2]:
            raise NotImplementedError("attn_implementation='flashgen': packed sequences "
                                      "(position_ids restarting within a row) beside a KV cache "
                                      "are not supported")
        return _by_positions(query, key, value, position_ids, bool(is_causal), dropout,
                             scaling), None
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
    function: none for unpadded batches, the (batch, keys) padding mask for
    padded ones."""
    from transformers import AttentionInterface
    AttentionInterface.register(NAME, flashgen_attention_forward)
    _answer_flash_kernel_loading()
    try:
        from transformers.masking_utils import AttentionMaskInterface, flash_attention_mask
    except ImportError:  # older transformers build 4-D masks for every implementation
        return
    AttentionMaskInterface.register(NAME, flash_attention_mask)

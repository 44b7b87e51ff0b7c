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
row, whose position_ids restart at 0 (padding-free training). The keyword
arguments of transformers' flash-attention call are taken as it means them:
sliding_window=W (Mistral, Qwen2, Gemma 2, gpt-oss: a query sees the W keys
up to its own, a window of W - 1 to the left; W - 1 on both sides without a
causal mask, as transformers' flash path passes it), softcap (Gemma 2's
logit soft-capping) and s_aux (gpt-oss's sink logits, one per head, whose
gradient flows back to the module's parameter). Refused, with an error
naming what: other attention masks and position_ids that restart beside a
KV cache. The padded and packed paths check what flashgen.attention checks
(ranks, shapes, head dims, heads, dtypes and devices), and the padding mask
and position_ids against them, before anything is reshaped or indexed. The
value head dim may differ from the query's and key's (DeepSeek-V3's): every
path reshapes each tensor by its own head dim, and the output takes the
value's.

Decoding steps go to the decode family (flashgen.attention_with_kvcache):
up to 16 new queries against a longer cache (Sk > Sq), without dropout or a
gradient, head dims (the query's and the value's) that are multiples of 8,
outside torch.compile. The
cache transformers hands over, (B, Hkv, Sk, D) with the new rows already in
it, is read in place through a transposed view; a padding mask becomes a
mask predicate on the keys (no packing, no host sync), and the padded
queries' rows are zeros as on the packed path. Windows, softcap and sinks
go through as on the other paths. Everything else runs as before."""
import functools

from flashgen._requires import require

torch = require("torch", "flashgen.integrations.transformers", "transformers")
import flashgen  # noqa: E402
from flashgen import _checks  # noqa: E402

NAME = "flashgen"


def _packed(position_ids):
    # Packed sequences restart their positions inside a row.
    return position_ids is not None and position_ids.dim() == 2 and position_ids.shape[1] > 1 \
        and bool((position_ids[:, 1:] - position_ids[:, :-1] != 1).any())


def _checked(query, key, value):
    """query, key and value as flashgen.attention checks them, with its
    messages: the packed and padded paths reshape and index them with one
    another's shapes, so a shape that does not fit is refused first (on the
    GPU an index past a tensor is a device-side assert). fp16/bf16 and CUDA
    are attention_varlen's checks, before its kernels."""
    names = ("q", "k", "v")
    _checks.ranks(names, (query, key, value), "bhsd")
    (B, H, S, D), (Bk, Hk, Sk, Dk), (Bv, Hv, Sv, Dv) = query.shape, key.shape, value.shape
    _checks.bshd_shapes(names, (B, S, H, D), (Bk, Sk, Hk, Dk), (Bv, Sv, Hv, Dv))
    _checks.agree(names, (query, key, value))


def _by_positions(query, key, value, position_ids, causal, dropout, scaling, variants):
    """Sequences packed into rows: one starts at each position 0 and at each
    row's start. query (B, H, S, D), key (B, Hkv, S, D) and value (B, Hkv,
    S, Dv), checked (_checked, position_ids). Returns (B, S, H, Dv)."""
    B, H, S, _ = query.shape
    Dv = value.shape[3]
    starts = (position_ids.expand(B, S) == 0)
    starts[:, 0] = True
    first = starts.flatten().nonzero().flatten().to(torch.int32)
    cu = torch.cat([first, first.new_tensor([B * S])])
    longest = int((cu[1:] - cu[:-1]).max())
    # (B, H, S, D) -> (B * S, H, D), each by its own head dim
    q, k, v = (x.transpose(1, 2).reshape(B * S, x.shape[1], x.shape[3])
               for x in (query, key, value))
    out = flashgen.attention_varlen(q, k, v, cu, cu, longest, longest, causal=causal,
                                    dropout_p=dropout, softmax_scale=scaling, **variants)
    return out.view(B, S, H, Dv)


def _unpadded(query, key, value, mask, causal, dropout, scaling, variants):
    """Attention of a padded batch through packed sequences. query (B, H, Sq,
    D), key (B, Hkv, Sk, D), value (B, Hkv, Sk, Dv), mask (B, Sk) with 1 on
    real tokens; the queries are the last Sq positions (a KV cache's new
    tokens). Checked (_checked, padding_mask): the rows kept index each
    tensor. Returns (B, Sq, H, Dv)."""
    B, H, Sq, _ = query.shape
    Dv = value.shape[3]
    keep_k = mask.bool()
    keep_q = keep_k[:, -Sq:]

    def pack(x, keep):  # (B, H, S, D) -> (tokens, H, D), and the tokens' rows
        rows = keep.flatten().nonzero().flatten()
        return x.transpose(1, 2).reshape(-1, x.shape[1], x.shape[3])[rows], rows

    def offsets(keep):
        lens = keep.sum(-1, dtype=torch.int32)
        return torch.nn.functional.pad(lens.cumsum(0, dtype=torch.int32), (1, 0)), lens

    (q, rows_q), (k, _), (v, _) = pack(query, keep_q), pack(key, keep_k), pack(value, keep_k)
    (cu_q, lens_q), (cu_k, lens_k) = offsets(keep_q), offsets(keep_k)
    out = flashgen.attention_varlen(q, k, v, cu_q, cu_k, int(lens_q.max()), int(lens_k.max()),
                                    causal=causal, align="bottom-right", dropout_p=dropout,
                                    softmax_scale=scaling, **variants)
    full = out.new_zeros((B * Sq, H, Dv))  # out: (tokens, H, Dv)
    full[rows_q] = out
    return full.view(B, Sq, H, Dv)


# The decode family is built for a few queries per sequence (decoding,
# speculative decoding: 1..16; docs/decode-notes.md); more go to the dense
# or packed kernels.
DECODE_QUERIES = 16


def _rows_in_place(t):
    """Whether the decode family can read t ((B, Hkv, S, D)) where it is, by
    its strides: its head dim contiguous, rows of whole 16-byte pieces (the
    cache is never copied; its address is _decoding_now's)."""
    s0, s1, s2, s3 = t.stride()
    return s3 == 1 and not (s0 % 8 or s1 % 8 or s2 % 8)


def _decoding_shapes(query, key, value, dropout):
    """Whether a call, checked (_checked), is shaped as a decoding step the
    decode family computes as the other paths would: a few new queries
    against a longer cache, no dropout, head dims it serves, a cache it can
    read in place. What the call's shapes, strides and dropout settle, so
    kept for calls like it (_call_key); fp16/bf16 and CUDA are
    attention_with_kvcache's checks, with attention's messages."""
    _, _, Sq, D = query.shape
    Sk, Dv = key.shape[2], value.shape[3]
    if not (1 <= Sq <= DECODE_QUERIES and Sk > Sq and dropout == 0.0):
        return False
    if D % 8 or D > 256 or Dv % 8 or Dv > 256:
        return False  # the decode family takes multiples of 8
    return _rows_in_place(key) and _rows_in_place(value)


def _decoding_now(query, key, value, variants):
    """The rest of the choice, which each call makes: outside torch.compile,
    no gradient to carry (the decode family has no backward), the cache's
    rows 16-byte aligned."""
    if torch.compiler.is_compiling():
        return False  # the operator is declared to write its cache: a graph could copy it
    sinks = variants.get("sinks")
    if torch.is_grad_enabled() and (query.requires_grad or key.requires_grad or
                                    value.requires_grad or
                                    (sinks is not None and sinks.requires_grad)):
        return False
    return not (key.data_ptr() % 16 or value.data_ptr() % 16)


# A call like an earlier one (shapes, strides, dtypes and devices of query,
# key and value; dropout) skips _checked and _decoding_shapes: a decoding
# step's host time is on generation's critical path, as the entry points'.
_seen = {}


def _call_key(query, key, value, dropout):
    """What _checked and _decoding_shapes read of a call, or None (checked
    every time: under torch.compile, or arguments that are not tensors)."""
    if torch.compiler.is_compiling():
        return None
    try:
        return (query.shape, key.shape, value.shape, query.stride(), key.stride(),
                value.stride(), query.dtype, key.dtype, value.dtype, query.get_device(),
                key.get_device(), value.get_device(), dropout)
    except (AttributeError, TypeError):  # not tensors
        return None


def _checked_shapes(query, key, value, dropout):
    """_checked, then _decoding_shapes, kept per call shape (an unhashable
    dropout keeps nothing)."""
    call = _call_key(query, key, value, dropout)
    try:
        decoding = _seen.get(call) if call is not None else None
    except TypeError:
        call = decoding = None
    if decoding is None:
        _checked(query, key, value)
        decoding = _decoding_shapes(query, key, value, dropout)
        if call is not None:
            if len(_seen) > 1024:
                _seen.clear()
            _seen[call] = decoding
    return decoding


def _decode(query, key, value, mask, causal, scaling, variants):
    """A decoding step through flashgen.attention_with_kvcache. query (B, H,
    Sq, D), key and value (B, Hkv, Sk, D|Dv): the cache with the new rows
    already in it, so no rows are appended and each sequence sees all Sk
    keys, the queries the last Sq (bottom-right). mask (B, Sk), nonzero on
    real tokens, or None: padded keys are hidden by a predicate, as the
    packed path leaves them out (padding left or right keeps a sequence's
    real tokens together, so causal masks and windows count the same keys),
    and padded queries' rows are zeros, as there. Returns (B, Sq, H, Dv)."""
    aux = mask_mod = None
    if mask is not None:
        mask_mod, aux = "valid[b, k] != 0", {"valid": mask.to(torch.int32)}
    out = flashgen.attention_with_kvcache(query, key, value, causal=causal, align="bottom-right",
                                          softmax_scale=scaling, mask_mod=mask_mod, aux=aux,
                                          layout="bhsd", **variants).transpose(1, 2)
    if mask is not None:
        out = out.masked_fill(~mask[:, -query.shape[2]:, None, None].bool(), 0.0)
    return out


def _window(sliding_window, causal):
    """flashgen's window for transformers' sliding_window (None: none). In
    transformers a sliding layer's query i sees keys i - W < j <= i (its
    masks' sliding_window_overlay), which its flash path passes on as
    window_size (W - 1, W - 1) with the causal mask cutting the right side."""
    if sliding_window is None:
        return None
    if isinstance(sliding_window, bool) or not isinstance(sliding_window, int) or \
            sliding_window < 1:
        raise ValueError(f"attn_implementation='flashgen': sliding_window={sliding_window!r}; "
                         "expected an int >= 1 (the keys a query sees, its own included)")
    return (sliding_window - 1, 0 if causal else sliding_window - 1)


def _variants(kwargs, causal, query):
    """attention()'s window, softcap and sinks keywords from transformers'
    keyword arguments."""
    out = {}
    window = _window(kwargs.get("sliding_window"), causal)
    if window is not None:
        out["window"] = window
    if kwargs.get("softcap") is not None:
        out["softcap"] = float(kwargs["softcap"])
    sinks = kwargs.get("s_aux")
    if sinks is not None:
        # gpt-oss's sinks parameter, in the model's dtype: fp32 for the
        # kernels (a cast autograd carries the gradient back through)
        out["sinks"] = sinks.to(device=query.device, dtype=torch.float32).reshape(-1)
    return out


def flashgen_attention_forward(module, query, key, value, attention_mask, scaling=None,
                               dropout=0.0, **kwargs):
    """query (B, H, S, D), key (B, Hkv, S, D), value (B, Hkv, S, Dv) →
    ((B, S, H, Dv), None)."""
    if attention_mask is not None:
        decoding = _checked_shapes(query, key, value, dropout)
        if attention_mask.dim() != 2 or attention_mask.shape != (key.shape[0], key.shape[2]):
            raise NotImplementedError(
                "attn_implementation='flashgen': an attention_mask of shape "
                f"{tuple(attention_mask.shape)} is not supported (only the (batch, keys) "
                "padding mask of flash-style implementations); use 'sdpa'")
        _checks.padding_mask(attention_mask, query.shape[2], query)
    is_causal = kwargs.get("is_causal")
    if is_causal is None:
        is_causal = getattr(module, "is_causal", True)
    variants = _variants(kwargs, bool(is_causal), query)
    if attention_mask is not None:  # it says where the sequences are
        if decoding and _decoding_now(query, key, value, variants):
            return _decode(query, key, value, attention_mask, bool(is_causal), scaling,
                           variants), None
        return _unpadded(query, key, value, attention_mask, bool(is_causal), dropout,
                         scaling, variants), None
    position_ids = kwargs.get("position_ids")
    if not torch.compiler.is_compiling() and _packed(position_ids):
        _checked(query, key, value)
        if key.shape[2] != query.shape[2]:
            raise NotImplementedError("attn_implementation='flashgen': packed sequences "
                                      "(position_ids restarting within a row) beside a KV cache "
                                      "are not supported")
        _checks.position_ids(position_ids, query.shape[0], query.shape[2], query)
        return _by_positions(query, key, value, position_ids, bool(is_causal), dropout,
                             scaling, variants), None
    # attention's checks and messages, before the shapes are read
    if _checked_shapes(query, key, value, dropout) and _decoding_now(query, key, value, variants):
        return _decode(query, key, value, None, bool(is_causal), scaling, variants), None
    out = flashgen.attention(query, key, value, causal=bool(is_causal), align="bottom-right",
                             dropout_p=dropout, softmax_scale=scaling, layout="bhsd", **variants)
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


def _keep_the_name():
    """Models that list the flash kernels they work with (gpt-oss's
    `_compatible_flash_implementations`: a hub build of vLLM's
    flash-attention 3, flash-attention 4, a Metal kernel) have transformers
    5 (PreTrainedModel._check_and_adjust_attn_implementation, 5.17) replace
    any other implementation whose name holds "flash" by the first of them,
    with a warning, and then load it from the hub, which needs the `kernels`
    package and a download: attn_implementation="flashgen" would never run
    flashgen, and fails where neither is to be had. The check of a model's
    implementation is answered here for "flashgen" as transformers answers
    it for a registered attention function with nothing to load
    (get_correct_attn_implementation: the name must be registered); every
    other name is checked by transformers as before."""
    try:
        from transformers import PreTrainedModel
    except ImportError:
        return
    check = getattr(PreTrainedModel, "_check_and_adjust_attn_implementation", None)
    if check is None or getattr(check, "answers_flashgen", False) or \
            not hasattr(PreTrainedModel, "get_correct_attn_implementation"):
        return

    @functools.wraps(check)
    def checked(self, attn_implementation, *args, **kwargs):
        if attn_implementation == NAME:
            is_init_check = kwargs.get("is_init_check", args[0] if args else False)
            return self.get_correct_attn_implementation(NAME, is_init_check)
        return check(self, attn_implementation, *args, **kwargs)
    checked.answers_flashgen = True
    PreTrainedModel._check_and_adjust_attn_implementation = checked


def register():
    """Register "flashgen" with transformers' AttentionInterface, and its mask
    function: none for unpadded batches, the (batch, keys) padding mask for
    padded ones. transformers then neither replaces the name by a hub
    kernel nor tries to load one for it (_keep_the_name,
    _answer_flash_kernel_loading): nothing is downloaded."""
    transformers = require("transformers", "flashgen.integrations.transformers")
    transformers.AttentionInterface.register(NAME, flashgen_attention_forward)
    _answer_flash_kernel_loading()
    _keep_the_name()
    try:
        from transformers.masking_utils import AttentionMaskInterface, flash_attention_mask
    except ImportError:  # older transformers build 4-D masks for every implementation
        return
    AttentionMaskInterface.register(NAME, flash_attention_mask)

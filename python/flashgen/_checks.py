"""Argument checks of flashgen.attention and scaled_dot_product_attention.

Plain functions over tensor-likes (shape, dtype, device, dim()), with no
torch import, so they are tested where PyTorch is not installed. Every
message names the argument as the caller spelled it."""
import math

from ._native import ALIGNS, AUX_TYPES, MAX_AUX

INT32_MAX = (1 << 31) - 1


def tensors(names, ts, layout, half_dtypes, rank=4):
    """Types, ranks, dtypes (one of half_dtypes) and devices of q, k, v (or
    query, key, value); layout names the shape in messages."""
    ranks(names, ts, layout, rank)
    kinds(names, ts, half_dtypes)


def ranks(names, ts, layout, rank=4):
    """Types and ranks of q, k, v: what the shape checks read."""
    for name, t in zip(names, ts):
        if not (hasattr(t, "shape") and hasattr(t, "dtype") and hasattr(t, "device")):
            raise TypeError(f"{name}: {type(t).__name__}; expected a torch.Tensor")
        if t.dim() != rank:
            raise ValueError(f"{name}: {t.dim()}-D; expected {rank}-D ({layout.upper()})")


def agree(names, ts):
    """The dtypes and devices of ts[1:] against ts[0]'s."""
    q = ts[0]
    for name, t in zip(names[1:], ts[1:]):
        if t.dtype != q.dtype:
            raise TypeError(f"{name}: {t.dtype}, but {names[0]} is {q.dtype}")
        if t.device != q.device:
            raise ValueError(f"{name}: on {t.device}, but {names[0]} is on {q.device}")


def kinds(names, ts, half_dtypes):
    """Dtypes and devices of tensors that ranks() passed: one dtype of
    half_dtypes, one CUDA device."""
    agree(names, ts)
    q = ts[0]
    if q.dtype not in half_dtypes:
        raise TypeError(f"{names[0]}: {q.dtype}; flashgen takes torch.float16 or torch.bfloat16")
    if q.device.type != "cuda":
        raise ValueError(f"{names[0]}: on {q.device}; flashgen runs on CUDA devices")


def bshd_shapes(names, q, k, v):
    """(B, S, H, D) shapes of q, k and v against each other; v's head dim
    (the output's) may differ from q's and k's."""
    (B, Sq, Hq, D), (Bk, Sk, Hk, Dk) = tuple(q), tuple(k)
    if tuple(v)[:3] != tuple(k)[:3]:
        raise ValueError(f"{names[2]}: shape {tuple(v)} differs from {names[1]}'s {tuple(k)} "
                         "(as B, S, H, D)")
    if Bk != B or Dk != D:
        raise ValueError(f"{names[1]}: batch {Bk} and head dim {Dk}, but {names[0]} has batch "
                         f"{B} and head dim {D}")
    if not 1 <= D <= 256:
        raise ValueError(f"{names[0]}: head dim {D}; flashgen supports 1..256")
    if not 1 <= tuple(v)[3] <= 256:
        raise ValueError(f"{names[2]}: head dim {tuple(v)[3]}; flashgen supports 1..256")
    if Hk == 0 or Hq % Hk:
        raise ValueError(f"{names[1]}: {Hk} heads; the query heads ({Hq}) must be a multiple "
                         "(grouped-query attention)")


def packed_shapes(q, k, v):
    """(total, H, D) shapes of packed q, k and v against each other; v's
    head dim may differ."""
    (_, Hq, D), (_, Hk, Dk) = tuple(q), tuple(k)
    if tuple(v)[:2] != tuple(k)[:2]:
        raise ValueError(f"v: shape {tuple(v)} differs from k's {tuple(k)} (as total, H, D)")
    if Dk != D:
        raise ValueError(f"k: head dim {Dk}, but q has {D}")
    if not 1 <= D <= 256:
        raise ValueError(f"q: head dim {D}; flashgen supports 1..256")
    if not 1 <= tuple(v)[2] <= 256:
        raise ValueError(f"v: head dim {tuple(v)[2]}; flashgen supports 1..256")
    if Hk == 0 or Hq % Hk:
        raise ValueError(f"k: {Hk} heads; the query heads ({Hq}) must be a multiple "
                         "(grouped-query attention)")


def seqlens(name, t, entries, q, int32):
    """cu_seqlens_q, cu_seqlens_k (batch + 1 entries) or seqused_k (batch):
    a 1-D int32 tensor on q's device. entries None: any count >= 2."""
    if not (hasattr(t, "shape") and hasattr(t, "dtype") and hasattr(t, "device")):
        raise TypeError(f"{name}: {type(t).__name__}; expected a torch.Tensor of int32")
    if t.dim() != 1:
        raise ValueError(f"{name}: {t.dim()}-D; expected 1-D")
    if t.dtype != int32:
        raise TypeError(f"{name}: {t.dtype}; expected torch.int32")
    if t.device != q.device:
        raise ValueError(f"{name}: on {t.device}, but q is on {q.device} (the kernels read it "
                         "there)")
    if entries is None and t.shape[0] < 2:
        raise ValueError(f"{name}: {t.shape[0]} entries; expected batch + 1 >= 2")
    if entries is not None and t.shape[0] != entries:
        raise ValueError(f"{name}: {t.shape[0]} entries; expected {entries}")


def kvcache_shapes(q, k_cache, v_cache, k, v, paged):
    """(B, S, H, D) shapes of a decoding step's query, cache (with paged:
    (num_pages, page_size, H, D)) and new rows against each other; V's rows
    may be of a value head dim Dv of their own."""
    (B, _, Hq, D), (P, _, Hk, Dk) = tuple(q.shape), tuple(k_cache.shape)
    Dv = v_cache.shape[3]
    if tuple(v_cache.shape)[:3] != tuple(k_cache.shape)[:3]:
        raise ValueError(f"v_cache: shape {tuple(v_cache.shape)} differs from k_cache's "
                         f"{tuple(k_cache.shape)} (only the head dims may differ)")
    if Dk != D:
        raise ValueError(f"k_cache: head dim {Dk}, but q has {D}")
    if not 8 <= D <= 256 or D % 8:
        raise ValueError(f"q: head dim {D}; a decoding step takes multiples of 8 up to 256")
    if not 8 <= Dv <= 256 or Dv % 8:
        raise ValueError(f"v_cache: value head dim {Dv}; a decoding step takes multiples of 8 "
                         "up to 256")
    if Hk == 0 or Hq % Hk:
        raise ValueError(f"k_cache: {Hk} heads; the query heads ({Hq}) must be a multiple "
                         "(grouped-query attention)")
    if not paged and P != B:
        raise ValueError(f"k_cache: batch {P}, but q has {B} (without a block_table the cache "
                         "holds each sequence's rows)")
    if (k is None) != (v is None):
        raise ValueError(f"{'v' if k is not None else 'k'}: None, but "
                         f"{'k' if k is not None else 'v'} is given (both or neither)")
    if k is not None:
        (Bn, Sn, Hn, Dn) = tuple(k.shape)
        if tuple(v.shape)[:3] != tuple(k.shape)[:3]:
            raise ValueError(f"v: shape {tuple(v.shape)} differs from k's {tuple(k.shape)} (only "
                             "the head dims may differ)")
        if v.shape[3] != Dv:
            raise ValueError(f"v: value head dim {v.shape[3]}, but v_cache has {Dv}")
        if (Bn, Hn, Dn) != (B, Hk, D):
            raise ValueError(f"k: shape {tuple(k.shape)}; expected (batch {B}, new rows, "
                             f"{Hk} heads, head dim {D})")
        if Sn == 0:
            raise ValueError("k: no new rows (pass k=None)")


def padding_mask(mask, seqlen_q, q):
    """A (batch, keys) padding mask that is already that shape (nonzero on
    real tokens) against the queries it is used for: on q's device, and at
    most as many queries as keys (the queries are the last keys'
    positions)."""
    if mask.device != q.device:
        raise ValueError(f"attention_mask: on {mask.device}, but q is on {q.device}")
    if seqlen_q > mask.shape[1]:
        raise ValueError(f"q: {seqlen_q} rows, but attention_mask has {mask.shape[1]} keys (a "
                         "padded batch's queries are its last keys' positions)")


def position_ids(t, batch, seqlen, q):
    """position_ids of sequences packed into rows: (batch, seqlen) or
    (1, seqlen), on q's device."""
    if tuple(t.shape) not in ((batch, seqlen), (1, seqlen)):
        raise ValueError(f"position_ids: shape {tuple(t.shape)}; expected (batch {batch}, "
                         f"{seqlen}) or (1, {seqlen}): a position per token of q")
    if t.device != q.device:
        raise ValueError(f"position_ids: on {t.device}, but q is on {q.device}")


def block_table(t, batch, q, int32):
    """A (batch, max_pages) int32 tensor on q's device."""
    if not (hasattr(t, "shape") and hasattr(t, "dtype") and hasattr(t, "device")):
        raise TypeError(f"block_table: {type(t).__name__}; expected a torch.Tensor of int32")
    if t.dim() != 2 or t.shape[0] != batch or t.shape[1] == 0:
        raise ValueError(f"block_table: shape {tuple(t.shape)}; expected (batch {batch}, "
                         "pages per sequence >= 1)")
    if t.dtype != int32:
        raise TypeError(f"block_table: {t.dtype}; expected torch.int32")
    if t.device != q.device:
        raise ValueError(f"block_table: on {t.device}, but q is on {q.device} (the kernels read "
                         "it there)")


def mla_shapes(q, kv_cache, head_dim_v, paged):
    """A latent decoding step's q (B, Sq, Hq, D) against its cache (B or
    num_pages, rows, Hkv, D), V the cache's first head_dim_v columns."""
    (B, _, Hq, D), (P, _, Hk, Dk) = tuple(q.shape), tuple(kv_cache.shape)
    if Dk != D:
        raise ValueError(f"kv_cache: head dim {Dk}, but q has {D}")
    if not 16 <= D <= 576 or D % 16:
        raise ValueError(f"q: head dim {D}; a latent cache takes multiples of 16 up to 576")
    if isinstance(head_dim_v, bool) or not isinstance(head_dim_v, int) or \
            not 32 <= head_dim_v <= min(D, 512) or head_dim_v % 32:
        raise ValueError(f"head_dim_v: {head_dim_v!r}; expected a multiple of 32 up to "
                         f"{min(D, 512)} (V is the cache's first columns)")
    if Hk == 0 or Hq % Hk:
        raise ValueError(f"kv_cache: {Hk} heads; the query heads ({Hq}) must be a multiple")
    if not paged and P != B:
        raise ValueError(f"kv_cache: batch {P}, but q has {B} (without a block_table the cache "
                         "holds each sequence's rows)")


def kvcache_room(cache_shape, pages, new, cached=None):
    """A decoding step's rows against the rows a sequence has: S_cache
    (cache_shape[1]), or with a block table of `pages` pages per sequence
    pages x page_size. The new rows must fit, and with an int cache_seqlens
    the cached keys and the new rows together. Lengths in a tensor are on
    the GPU, out of the host's sight: FLASHGEN_DEBUG=1 checks them there."""
    rows = cache_shape[1]
    if pages is None:
        room, has = rows, f"the cache holds {rows} rows per sequence"
    else:
        room = pages * rows
        has = f"a sequence's {pages} pages (block_table) of {rows} rows hold {room}"
    if new > room:
        raise ValueError(f"k: {new} new rows; {has}")
    if cached is not None and cached + new > room:
        step = f" and {new} new rows make {cached + new} keys" if new else ""
        raise ValueError(f"cache_seqlens: {cached}{step}; {has}")


def num_splits(x):
    if isinstance(x, bool) or not isinstance(x, int) or not 0 <= x <= 128:
        raise ValueError(f"num_splits: {x!r}; expected an int in 0..128 (0: chosen for the GPU)")


def max_seqlen(name, x):
    if isinstance(x, bool) or not isinstance(x, int) or not 0 <= x <= 1 << 30:
        raise ValueError(f"{name}: {x!r}; expected an int in 0..2^30")


def options(causal, align, window, dropout_p, softmax_scale):
    """(mask, align, window_left, window_right, dropout_p, scale) as the
    operator takes them: mask 0 none, 1 causal, 2 window; scale 0 for
    1/sqrt(D)."""
    if align not in ALIGNS:
        raise ValueError(f"align: {align!r}; valid: {', '.join(map(repr, ALIGNS))}")
    mask, left, right = (1 if causal else 0), -1, -1
    if window is not None:
        try:
            left, right = (int(w) for w in window)
        except (TypeError, ValueError):
            raise ValueError(f"window: {window!r}; expected (left, right), -1 for unbounded") \
                from None
        if left < -1 or right < -1:
            raise ValueError(f"window: ({left}, {right}); sizes are >= 0, or -1 for unbounded")
        # the library's sides are int32; one wider than any call's keys bounds nothing
        left, right = min(left, INT32_MAX), min(right, INT32_MAX)
        if causal:
            if right not in (0, -1):
                raise ValueError(f"window: right is {right}; with causal=True it must be 0 or -1")
            right = 0
        mask = 2
    try:
        p = float(dropout_p)
    except (TypeError, ValueError):
        raise TypeError(f"dropout_p: {dropout_p!r}; expected a float") from None
    if not 0.0 <= p < 1.0:
        raise ValueError(f"dropout_p: {dropout_p}; must be in [0, 1)")
    scale = 0.0
    if softmax_scale is not None:
        scale = float(softmax_scale)
        if not (math.isfinite(scale) and scale != 0.0):
            raise ValueError(f"softmax_scale: {softmax_scale}; must be finite and nonzero")
    return mask, ALIGNS[align], left, right, p, scale


def variants(softcap, alibi_slopes, sinks, q, batch, heads_q, float32):
    """softcap: None, or a finite cap > 0; alibi_slopes: None, or fp32 of
    shape (heads_q,) or (batch, heads_q) on q's device; sinks: None, or fp32
    (heads_q,) on q's device. Returns the cap as the operator takes it (0.0:
    none)."""
    cap = 0.0
    if softcap is not None:
        try:
            if isinstance(softcap, (bool, str, bytes)):
                raise TypeError
            cap = float(softcap)
        except (TypeError, ValueError):
            raise TypeError(f"softcap: {softcap!r}; expected a float > 0 (None: no cap)") \
                from None
        if not (math.isfinite(cap) and cap > 0.0):
            raise ValueError(f"softcap: {softcap!r}; must be finite and > 0 (None: no cap)")
    if alibi_slopes is not None:
        shapes = f"({heads_q},) or (batch {batch}, {heads_q})"
        _fp32_on(q, "alibi_slopes", alibi_slopes, shapes, float32)
        if tuple(alibi_slopes.shape) not in ((heads_q,), (batch, heads_q)):
            raise ValueError(f"alibi_slopes: shape {tuple(alibi_slopes.shape)}; expected "
                             f"{shapes}: a slope per query head")
    if sinks is not None:
        _fp32_on(q, "sinks", sinks, f"({heads_q},)", float32)
        if tuple(sinks.shape) != (heads_q,):
            raise ValueError(f"sinks: shape {tuple(sinks.shape)}; expected ({heads_q},): a sink "
                             "logit per query head")
    return cap


def _fp32_on(q, name, t, shapes, float32):
    if not (hasattr(t, "shape") and hasattr(t, "dtype") and hasattr(t, "device")):
        raise TypeError(f"{name}: {type(t).__name__}; expected a torch.Tensor of float32, "
                        f"shape {shapes}")
    if t.dtype != float32:
        raise TypeError(f"{name}: {t.dtype}; expected torch.float32")
    if t.device != q.device:
        raise ValueError(f"{name}: on {t.device}, but q is on {q.device} (the kernels read it "
                         "there)")


def sdpa_fallback(query, key, value, attn_mask, scale, half_dtypes, capability):
    """Why scaled_dot_product_attention hands a call to PyTorch, or None.
    half_dtypes: (float16, bfloat16); capability(device) -> (major, minor)
    of a CUDA device."""
    ts = (query, key, value)
    if attn_mask is not None:
        return "attn_mask is a tensor (flashgen takes is_causal, windows and block sparsity)"
    if any(t.dim() != 4 for t in ts):
        return "inputs are not 4-D (B, H, S, D)"
    if query.device.type != "cuda" or any(t.device != query.device for t in ts):
        return f"inputs are on {query.device.type}, not one CUDA device"
    if query.dtype not in half_dtypes or any(t.dtype != query.dtype for t in ts):
        return f"dtype {query.dtype} (flashgen takes float16 and bfloat16)"
    if key.shape[-1] != query.shape[-1]:
        return "key's head dim differs from the query's"
    # the value's may differ: the output takes it
    if not 1 <= query.shape[-1] <= 256:
        return f"head dim {query.shape[-1]} (flashgen supports 1..256)"
    if not 1 <= value.shape[-1] <= 256:
        return f"value head dim {value.shape[-1]} (flashgen supports 1..256)"
    if key.shape[0] != query.shape[0] or tuple(value.shape[:3]) != tuple(key.shape[:3]):
        return "batch or key/value shapes broadcast"
    if scale is not None and not (math.isfinite(scale) and scale != 0.0):
        return f"scale={scale}"
    major, minor = capability(query.device)
    if major * 10 + minor < 75 or (query.dtype == half_dtypes[1] and major < 8):
        return f"{query.dtype} on sm_{major}{minor}"
    return None


def gqa_heads(query_heads, key_heads, enable_gqa):
    if query_heads == key_heads:
        return
    if not enable_gqa:
        raise ValueError(f"key: {key_heads} heads but query has {query_heads}; pass "
                         "enable_gqa=True for grouped-query attention")
    if key_heads == 0 or query_heads % key_heads:
        raise ValueError(f"key: {key_heads} heads; query's {query_heads} must be a multiple")


# ---- score and mask expressions --------------------------------------------------

# Names an aux tensor cannot take: the language's variables and functions.
RESERVED = frozenset({"s", "b", "h", "q", "k", "seqlen_q", "seqlen_k", "inf", "exp", "log",
                      "tanh", "sqrt", "floor", "abs", "min", "max", "floordiv", "int",
                      "where", "select"})


def _aux_name_ok(name):
    """[A-Za-z_][A-Za-z0-9_]*, at most 32 characters (no regex: this runs
    under torch.compile's tracing too)."""
    return (isinstance(name, str) and 1 <= len(name) <= 32 and name.isascii()
            and (name[0].isalpha() or name[0] == "_")
            and all(c.isalnum() or c == "_" for c in name))


def expressions(score_mod, mask_mod, names, tensors, q, float32, int32, softcap=0.0,
                alibi_slopes=None):
    """The expressions' arguments: score_mod and mask_mod texts (None for
    none), the aux tensors' names and tensors (float32 or int32, 1 to 3
    dimensions, on q's device, fewer than 2^31 elements, spanning fewer).
    Returns their declarations ((name, type id, rank) each), as the library
    takes them."""
    for what, text in (("score_mod", score_mod), ("mask_mod", mask_mod)):
        if text is not None and not isinstance(text, str):
            raise TypeError(f"{what}: {type(text).__name__}; expected an expression string or "
                            "a function")
    if score_mod and (softcap or alibi_slopes is not None):
        raise ValueError(f"score_mod: a score modifier replaces "
                         f"{'softcap' if softcap else 'alibi_slopes'}; write it in the "
                         "expression (30.0 * tanh(s / 30.0), s - slopes[h] * abs(q - k))")
    if names and not score_mod and not mask_mod:
        raise ValueError(f"aux: {', '.join(names)} given, but no score_mod or mask_mod reads "
                         "them")
    if len(names) > MAX_AUX:
        raise ValueError(f"aux: {len(names)} tensors ({', '.join(names)}); at most {MAX_AUX}")
    decls = []
    for name, t in zip(names, tensors):
        if not _aux_name_ok(name):
            raise ValueError(f"aux: name {name!r}; a name is a letter or _ then letters, digits "
                             "or _, at most 32 characters")
        if name in RESERVED:
            raise ValueError(f"aux: name {name!r} is the language's own (reserved: "
                             f"{', '.join(sorted(RESERVED))})")
        what = f"aux[{name!r}]"
        if not (hasattr(t, "shape") and hasattr(t, "dtype") and hasattr(t, "device")):
            raise TypeError(f"{what}: {type(t).__name__}; expected a torch.Tensor of float32 or "
                            "int32")
        if t.dtype not in (float32, int32):
            raise TypeError(f"{what}: {t.dtype}; aux tensors are torch.float32 or torch.int32")
        if not 1 <= t.dim() <= 3:
            raise ValueError(f"{what}: {t.dim()}-D, shape {tuple(t.shape)}; aux tensors have 1 "
                             "to 3 dimensions")
        if t.device != q.device:
            raise ValueError(f"{what}: on {t.device}, but q is on {q.device} (the kernels read "
                             "it there)")
        # the kernels index in 32 bits: the elements number, and the last
        # one's offset is, below 2^31
        elements, span = 1, 0
        strides = t.stride() if hasattr(t, "stride") else (0,) * t.dim()
        for n, st in zip(t.shape, strides):
            elements *= n
            span += (n - 1) * st if n > 0 else 0
        if elements >= 1 << 31 or span >= 1 << 31:
            raise ValueError(f"{what}: shape {tuple(t.shape)}, strides {tuple(strides)}; the "
                             "kernels read tensors of fewer than 2^31 elements")
        decls.append((name, AUX_TYPES["int32"] if t.dtype == int32 else AUX_TYPES["float32"],
                      t.dim()))
    return tuple(decls)

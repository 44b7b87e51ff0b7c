"""flashgen.attention, attention_varlen, attention_with_kvcache,
scaled_dot_product_attention and flex_attention: checked arguments
(_checks), score and mask modifiers translated (_expressions), then the
custom operators flashgen::forward (or flashgen::varlen_forward),
differentiable through flashgen::backward (flashgen::varlen_backward), and
flashgen::kvcache_forward."""
import warnings
import weakref

import torch

from . import _checks, _expressions, _native, _ops, sparsity as _sparsity


_HALF = (torch.float16, torch.bfloat16)
_checked = {}


# ---- score and mask modifiers ------------------------------------------------------

def _is_function(mod):
    return mod is not None and not isinstance(mod, str) and callable(mod)


# Under torch.compile the tracer runs as Python, outside the graph (a graph
# break: with fullgraph=True pass expression strings and aux tensors, made
# with flashgen.translate outside the compiled function if need be). torch's
# lazy wrapper keeps importing flashgen from importing torch._dynamo.
_translate_in_compile = getattr(torch, "_disable_dynamo", lambda fn: fn)(_expressions.translate)


def _translated(score_mod, mask_mod, aux, q):
    """The modifiers as (score_mod text, mask_mod text, aux names, aux
    tensors), texts None for none; None when there are none at all."""
    if score_mod is None and mask_mod is None and aux is None:
        return None
    device = q.device if isinstance(q, torch.Tensor) else None
    if (_is_function(score_mod) or _is_function(mask_mod)) and torch.compiler.is_compiling():
        tr = _translate_in_compile(score_mod, mask_mod, aux, device)
    else:
        tr = _expressions.translate(score_mod, mask_mod, aux, device)
    if tr.score_mod is None and tr.mask_mod is None and not tr.aux:
        return None
    return tr.score_mod, tr.mask_mod, tuple(tr.aux), tuple(tr.aux.values())


def _with_aux(block_mask_aux, aux):
    """A call's aux tensors beside its block mask's (a name names one tensor)."""
    merged = dict(block_mask_aux)
    for name, t in (aux or {}).items():
        if name in merged and merged[name] is not t:
            raise ValueError(f"aux: {name!r} names another tensor than the block mask's")
        merged[name] = t
    return merged


def _exprs_key(exprs):
    """What the checks read of the modifiers."""
    if exprs is None:
        return None
    score_mod, mask_mod, names, tensors = exprs
    return score_mod, mask_mod, names, tuple(_about(t) for t in tensors)


def _check_exprs(exprs, q, cap, alibi_slopes):
    """Checks the modifiers (the library parses the texts: ValueError with
    the column) and the aux tensors; returns their declarations."""
    if exprs is None:
        return None
    score_mod, mask_mod, names, tensors = exprs
    decls = _checks.expressions(score_mod, mask_mod, names, tensors, q, torch.float32,
                                torch.int32, cap, alibi_slopes)
    if not torch.compiler.is_compiling():  # (the operators' fake functions check it there)
        _native.check_expressions(score_mod, mask_mod, decls)
    return decls


def _op_exprs(exprs):
    """The modifiers as the operators take them: (score_mod, mask_mod,
    aux_names, aux), or None."""
    if exprs is None:
        return None
    score_mod, mask_mod, names, tensors = exprs
    return score_mod or "", mask_mod or "", ",".join(names), list(tensors) if tensors else None


# ---- the calls ------------------------------------------------------------------------------

def _check(q, k, v, causal, align, window, dropout_p, softmax_scale, sparsity, deterministic,
           layout, softcap, alibi_slopes, sinks, exprs=None):
    """The operator's options and the cap (0.0: none), after every argument is
    checked (exprs: _translated's)."""
    if layout not in ("bshd", "bhsd"):
        raise ValueError(f"layout: {layout!r}; valid: 'bshd', 'bhsd'")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: {type(t).__name__}; expected a torch.Tensor")
    # shapes first, then dtypes and devices, as attention_varlen and
    # attention_with_kvcache check them (and the transformers integration)
    _checks.ranks(("q", "k", "v"), (q, k, v), layout)
    shapes = [t.shape if layout == "bshd" else t.transpose(1, 2).shape for t in (q, k, v)]
    _checks.bshd_shapes(("q", "k", "v"), *shapes)
    _checks.kinds(("q", "k", "v"), (q, k, v), _HALF)
    options = _checks.options(causal, align, window, dropout_p, softmax_scale) + \
        _sparsity.describe(sparsity) + (bool(deterministic),)
    cap = _checks.variants(softcap, alibi_slopes, sinks, q, shapes[0][0], shapes[0][2],
                           torch.float32)
    _check_exprs(exprs, q, cap, alibi_slopes)
    return options, cap


def _about(t):
    """What the checks read of an optional tensor argument."""
    return None if t is None else (t.shape, t.dtype, t.get_device())


def _variants(cap, alibi_slopes, sinks):
    """The variants as the operators take them, or None when all are off."""
    if not cap and alibi_slopes is None and sinks is None:
        return None
    return cap, alibi_slopes, sinks


def attention(q, k, v, *, causal=False, align="bottom-right", window=None, dropout_p=0.0,
              softmax_scale=None, sparsity=None, deterministic=False, return_lse=False,
              layout="bshd", softcap=None, alibi_slopes=None, sinks=None, score_mod=None,
              mask_mod=None, aux=None):
    """Exact attention softmax(q kᵀ · scale) v on CUDA fp16/bf16 tensors.

    layout "bshd": q (B, Sq, Hq, D), k (B, Sk, Hkv, D) and v (B, Sk, Hkv,
    Dv); "bhsd": (B, H, S, D). Any strides; Hq a multiple of Hkv
    (grouped-query). v's head dim Dv (1..256) may differ from D (DeepSeek's
    192 and 128): the output takes it, and v's gradient has v's shape.
    causal: key j visible to query i iff j <= i + offset, offset Sk - Sq for
    align="bottom-right" (the last query sees every key), 0 for "top-left".
    window=(left, right): keys i+offset-left .. i+offset+right, -1 for
    unbounded; with causal=True, right must be 0 or -1 (it becomes 0).
    dropout_p: runs as round(p·256)/256, kept values scaled to match; drawn
    from PyTorch's CUDA generator (torch.manual_seed makes it
    reproducible); the backward redraws the same mask.
    softmax_scale: default 1/sqrt(D), the query/key head dim. sparsity:
    flashgen.BlockLayout or flashgen.Butterfly. deterministic: bitwise
    reproducible gradients.

    The scores' variants, alone or together (any mask, dropout, sparsity,
    GQA): with s = scale·q·k the score of query i and key j, the softmax
    sees t = softcap·tanh(s / softcap) − slope[b, h]·|i + offset − j|
    (offset as for causal: Sk - Sq bottom-right, 0 top-left, also without
    a mask). softcap: a finite float > 0 (Gemma 2's logit soft-capping).
    alibi_slopes: ALiBi's slopes, fp32 (Hq,) or (B, Hq) on q's device;
    they get no gradient (as flash-attn's). sinks: fp32 (Hq,) on q's
    device, each head's sink logit (gpt-oss): exp(sinks[h]) joins each
    row's softmax denominator and no value goes with it; differentiable
    when it requires grad. The lse returned includes the sink.

    score_mod, mask_mod: modifiers compiled into the kernels
    (docs/python-expressions.md): an expression string, such as
    "s + bias[h, q - k + seqlen_k - 1]" or "doc[q] == doc[k]", or a Python
    function with FlexAttention's signature, score_mod(score, b, h, q_idx,
    kv_idx) or mask_mod(b, h, q_idx, kv_idx), translated into one by
    tracing it (the tensors it captures are read as aux tensors; what
    cannot be translated exactly is refused with a ValueError). b is the
    batch row, h the query head, q and k the indices of the query and the
    key. A score modifier rewrites each visible score s = scale·q·k (-inf
    hides the key; it replaces softcap and alibi_slopes), a mask hides the
    keys where it is false (beside causal, window and sparsity). aux: the
    tensors the strings read, name -> tensor on q's device, float32 or
    int32, 1 to 3 dimensions, any strides (a read outside gives 0). The
    float ones a score modifier reads get gradients when they require grad.
    sparsity may also be a flashgen.BlockMask (create_block_mask): the
    kernels skip its empty blocks and test its predicate only in partial
    ones; without a mask_mod of its own the call takes the block mask's
    (and its aux tensors).
    Returns out (B, Sq, Hq, Dv) in q's layout, and with return_lse also the
    fp32 log-sum-exp of each row, (B, Hq, Sq), which is not
    differentiable."""
    if mask_mod is None and isinstance(sparsity, _sparsity.BlockMask):
        mask_mod, aux = sparsity.mask_mod, _with_aux(sparsity.aux, aux)
    exprs = _translated(score_mod, mask_mod, aux, q)
    args = (causal, align, window, dropout_p, softmax_scale, sparsity, deterministic, layout,
            softcap, alibi_slopes, sinks, exprs)
    return _attend(q, k, v, args, _dense_key(q, k, v, args), return_lse)


def _dense_key(q, k, v, args):
    """What attention()'s checks read of a call (shapes, dtypes, devices,
    the options; a sparsity pattern by identity) and the strides, so that
    the key also holds all a kept call's struct depends on (_ops.run_forward),
    or None (checked every time: under torch.compile, or an argument the key
    cannot hold). args: _check's after q, k, v. An unhashable option shows
    where the key is first looked up (_lookup): hashing it here as well
    would cost a call a hash of the key more."""
    if torch.compiler.is_compiling():
        return None
    (causal, align, window, dropout_p, softmax_scale, sparsity, deterministic, layout, softcap,
     alibi_slopes, sinks, exprs) = args
    try:
        return (q.shape, k.shape, v.shape, q.stride(), k.stride(), v.stride(), q.dtype, k.dtype,
                v.dtype, q.get_device(), k.get_device(), v.get_device(), causal, align, window,
                dropout_p, softmax_scale, id(sparsity), deterministic, layout, softcap,
                _about(alibi_slopes), _about(sinks), _exprs_key(exprs))
    except (AttributeError, TypeError):  # not tensors
        return None


def _lookup(table, key, default=None):
    """(table's entry for key, or default; the key, or None where it is
    None or cannot be hashed: an unhashable option, checked every call)."""
    if key is None:
        return default, None
    try:
        return table.get(key, default), key
    except TypeError:
        return default, None


def _attend(q, k, v, args, key, return_lse):
    """attention() once its arguments are gathered: its checks, skipped for
    a call like an earlier one (key: _dense_key's), and the call."""
    sparsity, layout, alibi_slopes, sinks, exprs = args[5], args[7], args[9], args[10], args[11]
    hit, key = _lookup(_checked, key)
    if hit is not None and hit[0] is sparsity:
        options, cap = hit[1]
    else:
        options, cap = _check(q, k, v, *args)
        if key is not None:
            if len(_checked) > 1024:
                _checked.clear()
            _checked[key] = (sparsity, (options, cap))
    out, lse = _ops.attention(q, k, v, options, return_lse, _variants(cap, alibi_slopes, sinks),
                              _op_exprs(exprs), heads_first=layout == "bhsd", call_key=key)
    return (out, lse) if return_lse else out


def attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *,
                     seqused_k=None, causal=False, align="bottom-right", window=None,
                     dropout_p=0.0, softmax_scale=None, deterministic=False, return_lse=False,
                     softcap=None, alibi_slopes=None, sinks=None, score_mod=None, mask_mod=None,
                     aux=None):
    """Exact attention over a batch of sequences of their own lengths, packed
    along the first dimension (as flash-attn's flash_attn_varlen_func).

    q (total_q, Hq, D), k (total_k, Hkv, D) and v (total_k, Hkv, Dv) (Dv
    may differ from D), CUDA fp16/bf16, any strides with the head dim
    contiguous. cu_seqlens_q and cu_seqlens_k: int32 (batch + 1,) on q's
    device: sequence b is rows cu_seqlens_q[b] .. cu_seqlens_q[b+1]-1 of q
    and cu_seqlens_k[b] .. cu_seqlens_k[b+1]-1 of k and v. max_seqlen_q,
    max_seqlen_k: the longest sequence's rows (ints; a longer sequence
    would be computed only in part: FLASHGEN_DEBUG=1 checks
    the arrays). seqused_k: int32 (batch,), the keys of each sequence that
    its queries see (default all). Masks are aligned per sequence; the
    options are attention()'s, softcap, alibi_slopes ((Hq,), or (batch,
    Hq): a row per sequence), sinks, score_mod, mask_mod and aux included
    (b is the sequence, q and k count from its first row). Sequences may be
    empty.
    Returns out (total_q, Hq, Dv) (its rows outside the sequences are not
    written), and with return_lse also the fp32 log-sum-exp (Hq, total_q).
    The gradients of rows that no sequence sees are zeros."""
    args = (q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k)
    settings = (max_seqlen_q, max_seqlen_k, causal, align, window, dropout_p, softmax_scale)
    exprs = _translated(score_mod, mask_mod, aux, q)
    key = _call_key("varlen", args, settings + (type(max_seqlen_q), type(max_seqlen_k)),
                    softcap, alibi_slopes, sinks, exprs)
    (options, cap), key = _checked_once(key, lambda: _check_varlen(*args, *settings, softcap,
                                                                   alibi_slopes, sinks, exprs))
    out, lse = _ops.varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q,
                           max_seqlen_k, options, deterministic,
                           _variants(cap, alibi_slopes, sinks), _op_exprs(exprs),
                           with_lse=return_lse, call_key=key)
    return (out, lse) if return_lse else out


def _check_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k,
                  causal, align, window, dropout_p, softmax_scale, softcap, alibi_slopes, sinks,
                  exprs):
    """attention_varlen's checks; the operator's options (mask, align,
    window left and right, dropout_p, scale) and the cap."""
    names = ("q", "k", "v")
    _checks.ranks(names, (q, k, v), "(total, H, D)", rank=3)
    _checks.packed_shapes(q.shape, k.shape, v.shape)
    _checks.kinds(names, (q, k, v), _HALF)
    _checks.seqlens("cu_seqlens_q", cu_seqlens_q, None, q, torch.int32)
    batch = cu_seqlens_q.shape[0] - 1
    _checks.seqlens("cu_seqlens_k", cu_seqlens_k, batch + 1, q, torch.int32)
    if seqused_k is not None:
        _checks.seqlens("seqused_k", seqused_k, batch, q, torch.int32)
    _checks.max_seqlen("max_seqlen_q", max_seqlen_q)
    _checks.max_seqlen("max_seqlen_k", max_seqlen_k)
    options = _checks.options(causal, align, window, dropout_p, softmax_scale)
    cap = _checks.variants(softcap, alibi_slopes, sinks, q, batch, q.shape[1], torch.float32)
    _check_exprs(exprs, q, cap, alibi_slopes)
    return options, cap


def attention_with_kvcache(q, k_cache, v_cache, k=None, v=None, *, cache_seqlens=None,
                           block_table=None, causal=False, align="bottom-right", window=None,
                           softmax_scale=None, num_splits=0, return_lse=False, softcap=None,
                           alibi_slopes=None, sinks=None, score_mod=None, mask_mod=None,
                           aux=None, layout="bshd"):
    """One decoding step: a few new queries per sequence against a KV cache
    (as flash-attn's flash_attn_with_kvcache).

    q (B, Sq, Hq, D), CUDA fp16/bf16, D a multiple of 8 up to 256; Sq is
    small (1..16: decoding, speculative decoding) or large (chunked prefill,
    on an H100 through the Hopper forward); any Sq works. k_cache,
    v_cache: (B, S_cache, Hkv, D) and (B, S_cache, Hkv, Dv), or with
    block_table (B, max_pages) int32 pools of pages (num_pages, page_size,
    Hkv, D) and (..., Dv), any page_size >= 1: key j of sequence b is row
    j % page_size of page block_table[b, j // page_size]. The value head dim
    Dv, a multiple of 8 up to 256, may differ from D. The cache is used in
    place (its head dim contiguous). cache_seqlens: int32 (B,) on q's
    device, or an int: the keys each sequence holds (default: all S_cache,
    or max_pages x page_size). k (B, S_new, Hkv, D), v (B, S_new, Hkv, Dv):
    new keys and values, written into the cache at rows cache_seqlens[b]
    .. + S_new - 1 before attending (cache_seqlens itself is not changed).
    Each sequence then sees its cache_seqlens[b] + S_new keys; causal and
    window masks align per sequence (bottom-right: the last query sees every
    key). num_splits: thread blocks splitting each sequence's keys (0:
    chosen to fill the GPU; 1: none). softcap, alibi_slopes ((Hq,) or
    (B, Hq)) and sinks as in attention(); ALiBi's distances count from
    each sequence's diagonal. score_mod, mask_mod and aux as in attention()
    (b is the cache row; k counts the sequence's keys, the new rows
    last). layout "bhsd": q, the caches, k and v with their second and
    third dimensions swapped ((B, Hq, Sq, D), (B, Hkv, S_cache, D), pages
    (num_pages, Hkv, page_size, D); transformers' cache), and so is out. No
    gradient. Returns out (B, Sq, Hq, Dv), and with return_lse also the fp32
    log-sum-exp (B, Hq, Sq). New rows past a sequence's rows in the cache (S_cache,
    or max_pages x page_size) are refused, and so is an int cache_seqlens
    whose keys and new rows together pass them. A tensor's lengths are on
    the GPU, out of the host's sight: the kernels clamp them to the cache
    (nothing outside it is read or written; new rows past it are dropped
    and the result is wrong), and FLASHGEN_DEBUG=1 reads them back and
    refuses them, as it does block table entries outside the pool."""
    # An int cache_seqlens is checked against the cache on every call (the
    # checks kept for a step's shapes do not see its value), and made a
    # tensor once the arguments are checked
    held = None
    if isinstance(cache_seqlens, int) and not isinstance(cache_seqlens, bool):
        if cache_seqlens < 0:
            raise ValueError(f"cache_seqlens: {cache_seqlens}; must be >= 0")
        held = cache_seqlens = int(cache_seqlens)
    args = (q, k_cache, v_cache, k, v, cache_seqlens, block_table)
    settings = (causal, align, window, softmax_scale, num_splits, layout)
    exprs = _translated(score_mod, mask_mod, aux, q)

    def check():
        if layout not in ("bshd", "bhsd"):
            raise ValueError(f"layout: {layout!r}; valid: 'bshd', 'bhsd'")
        given = [(n, t) for n, t in zip(("q", "k_cache", "v_cache", "k", "v"), args[:5])
                 if t is not None]
        _checks.ranks([n for n, _ in given], [t for _, t in given], layout)
        viewed = _as_bshd(args[:5], layout)  # the checks read (B, S, H, D)
        options = _check_kvcache(*viewed, *args[5:], *settings[:-1]) + (
            _checks.variants(softcap, alibi_slopes, sinks, q, q.shape[0], viewed[0].shape[2],
                             torch.float32),)
        _check_exprs(exprs, q, options[-1], alibi_slopes)
        return options
    key = _call_key("kvcache", args, settings, softcap, alibi_slopes, sinks, exprs, guarded=True)
    options, key = _checked_once(key, check)
    if held is not None:
        _checks.kvcache_room(_as_bshd((k_cache,), layout)[0].shape,
                             None if block_table is None else block_table.shape[1],
                             0 if k is None else k.shape[1 if layout == "bshd" else 2], held)
        args = args[:5] + (torch.full((q.shape[0],), held, dtype=torch.int32, device=q.device),
                           block_table)
    out, lse = _ops.kvcache(*args, *options[:-1],
                            variants=_variants(options[-1], alibi_slopes, sinks),
                            exprs=_op_exprs(exprs), with_lse=return_lse, call_key=key,
                            heads_first=layout == "bhsd")
    return (out, lse) if return_lse else out


def _as_bshd(tensors, layout):
    """(B, S, H, D) views of a call's 4-D tensors in layout (None stays)."""
    if layout == "bshd":
        return tuple(tensors)
    return tuple(None if t is None else t.transpose(1, 2) for t in tensors)


def mla_with_kvcache(q, kv_cache, block_table, cache_seqlens, head_dim_v, *,
                     softmax_scale=None, causal=False, num_splits=0, return_lse=False):
    """One decoding step over a latent cache (multi-head latent attention,
    as DeepSeek V2/V3 decode; shaped like FlashMLA's flash_mla_with_kvcache):
    one cache whose rows are read as the key and whose first head_dim_v
    columns are also the value.

    q (B, Sq, Hq, D), CUDA fp16/bf16, D a multiple of 16 up to 576
    (DeepSeek's 512 + 64), Sq 1..2 usually (multi-token prediction; any
    works). kv_cache: (num_pages, page_size, Hkv, D) pages with block_table
    (B, max_pages) int32 (key j of sequence b is row j % page_size of page
    block_table[b, j // page_size]; any page size), or (B, S, Hkv, D) with
    block_table None; Hq a multiple of Hkv (DeepSeek: Hkv 1, Hq 16..128).
    cache_seqlens: int32 (B,) on q's device, or an int: the keys each
    sequence holds. head_dim_v: a multiple of 32 up to 512 and D. causal:
    the queries are the last Sq keys' positions (bottom-right). softmax_scale
    default 1/sqrt(D). num_splits: thread blocks splitting each sequence's
    keys (0: chosen). No gradient; under torch.compile, a mode or a tensor
    subclass it runs as the operator torch.ops.flashgen.mla_forward.
    Returns out (B, Sq, Hq, head_dim_v), and with return_lse also the fp32
    log-sum-exp (B, Hq, Sq)."""
    held = None
    if isinstance(cache_seqlens, int) and not isinstance(cache_seqlens, bool):
        if cache_seqlens < 0:
            raise ValueError(f"cache_seqlens: {cache_seqlens}; must be >= 0")
        held = int(cache_seqlens)
    names = ("q", "kv_cache")
    _checks.ranks(names, (q, kv_cache), "bshd")
    paged = block_table is not None
    _checks.mla_shapes(q, kv_cache, head_dim_v, paged)
    _checks.kinds(names, (q, kv_cache), _HALF)
    if paged:
        _checks.block_table(block_table, q.shape[0], q, torch.int32)
    if held is None and cache_seqlens is not None:
        _checks.seqlens("cache_seqlens", cache_seqlens, q.shape[0], q, torch.int32)
    _checks.kvcache_room(kv_cache.shape, block_table.shape[1] if paged else None, 0, held)
    _checks.num_splits(num_splits)
    mask, align, left, right, _, scale = _checks.options(causal, "bottom-right", None, 0.0,
                                                         softmax_scale)
    if held is not None:
        cache_seqlens = torch.full((q.shape[0],), held, dtype=torch.int32, device=q.device)
    out, lse = _ops.mla(q, kv_cache, cache_seqlens, block_table, mask, align, left, right,
                        scale, num_splits, head_dim_v, with_lse=return_lse)
    return (out, lse) if return_lse else out


# ---- checks once per call shape -----------------------------------------------------
# A call like an earlier one (every tensor's shape, strides, offset, dtype
# and device; the options) skips the checks: host time matters at small
# sizes, and a decoding step's is on the critical path.

try:  # one C++ check of tensors' types, shapes, strides, dtypes and devices
    from torch._C._dynamo.guards import TensorGuards as _TensorGuards
except ImportError:  # (a PyTorch without it: every call builds its key)
    _TensorGuards = None

# Each entry point's latest key, with what it was built from: (the tensors'
# types and the options, the tensors' guards, the key).
_latest = {}


def _call_key(entry, tensors, settings, softcap, alibi_slopes, sinks, exprs, guarded=False):
    """What an entry point's checks read of a call, or None (checked every
    time: under torch.compile, or an argument the key cannot hold).
    guarded: a call without variant tensors or expressions whose tensors
    pass the entry point's latest call's guards and whose options equal its
    takes its key unbuilt (reading each tensor for the key costs about 0.5
    us, seven in a decoding step). The guards refuse a call that passes one
    tensor twice (packed self-attention's cu_seqlens do): such a call keeps
    none, and an entry point whose calls often do is better unguarded."""
    if torch.compiler.is_compiling():
        return None
    guarded = guarded and alibi_slopes is None and sinks is None and exprs is None
    if guarded:
        kinds = (*map(type, tensors), *settings, softcap)
        given = [t for t in tensors if type(t) is torch.Tensor]
        latest = _latest.get(entry)
        try:
            if latest is not None and latest[0] == kinds and latest[1].check(*given):
                return latest[2]
        except (TypeError, ValueError):  # an option that does not compare (an array)
            guarded = False
    try:
        key = (entry, *map(_described, tensors), *settings, softcap, _described(alibi_slopes),
               _described(sinks), _exprs_key(exprs))
    except TypeError:  # an argument of another type (an unhashable option shows in _lookup)
        return None
    if guarded and _TensorGuards is not None and len(set(map(id, given))) == len(given):
        try:  # (the tensors are plain, None or ints: _described's)
            _latest[entry] = (kinds, _TensorGuards(
                *given, dynamic_dims_sizes=[list(t.shape) for t in given],
                dynamic_dims_strides=[list(t.stride()) for t in given]), key)
        except Exception:  # noqa: BLE001 (another PyTorch's guards: no memo)
            pass
    return key


def _checked_once(key, check):
    """(check()'s result, kept for later calls with the same key; the key,
    None where it is None or cannot be hashed, and then nothing is kept)."""
    hit, key = _lookup(_checked, key)
    if hit is None:
        hit = check()
        if key is not None:
            if len(_checked) > 1024:
                _checked.clear()
            _checked[key] = hit
    return hit, key


def _described(t):
    """What the checks read of a tensor argument (None stays None; an int
    cache_seqlens is checked on every call): not its address, whose
    alignment the call itself checks every time."""
    if t is None:
        return None
    if type(t) is int:
        return int
    if type(t) is not torch.Tensor:
        raise TypeError("not a tensor")
    return t.shape, t.stride(), t.dtype, t.get_device()


def _check_kvcache(q, k_cache, v_cache, k, v, cache_seqlens, block_table, causal, align, window,
                   softmax_scale, num_splits):
    """attention_with_kvcache's checks; the operator's options (mask, align,
    window left and right, scale, num_splits)."""
    names, new = ("q", "k_cache", "v_cache"), ("q", "k", "v")
    _checks.ranks(names, (q, k_cache, v_cache), "bshd")
    paged = block_table is not None
    if k is not None and v is not None:
        _checks.ranks(new, (q, k, v), "bshd")
    _checks.kvcache_shapes(q, k_cache, v_cache, k, v, paged)
    _checks.kinds(names, (q, k_cache, v_cache), _HALF)
    if k is not None:
        _checks.kinds(new, (q, k, v), _HALF)
    B = q.shape[0]
    if paged:
        _checks.block_table(block_table, B, q, torch.int32)
    if cache_seqlens is not None and type(cache_seqlens) is not int:
        _checks.seqlens("cache_seqlens", cache_seqlens, B, q, torch.int32)
    if k is not None and cache_seqlens is None:
        raise ValueError("cache_seqlens: None, but k and v are given (the new rows go after "
                         "each sequence's cached keys)")
    _checks.kvcache_room(k_cache.shape, block_table.shape[1] if paged else None,
                         0 if k is None else k.shape[1])
    _checks.num_splits(num_splits)
    mask, align_id, left, right, _, scale = _checks.options(causal, align, window, 0.0,
                                                            softmax_scale)
    return mask, align_id, left, right, scale, num_splits


_warned = set()
_capabilities = {}
_sdpa_verdicts = {}
_UNSEEN = object()


def _capability(device):
    if torch.compiler.is_compiling():
        return torch.cuda.get_device_capability(device)
    cap = _capabilities.get(device)
    if cap is None:
        cap = _capabilities[device] = torch.cuda.get_device_capability(device)
    return cap


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0,
                                 is_causal=False, scale=None, enable_gqa=False):
    """A drop-in for torch.nn.functional.scaled_dot_product_attention:
    (B, H, S, D) tensors, causal aligned top-left; value's head dim may
    differ from the query's (the output takes it). What flashgen does not
    do (an attn_mask tensor, fp32, CPU tensors, head dims over 256, a key
    head dim unlike the query's, broadcast batches) runs PyTorch's
    function instead, with a warning the first time for each reason."""
    tensors = (isinstance(query, torch.Tensor) and isinstance(key, torch.Tensor)
               and isinstance(value, torch.Tensor))
    reason = None
    args = (bool(is_causal), "top-left", None, dropout_p, scale, None, False, "bhsd", None, None,
            None, None)  # attention()'s
    memo = _dense_key(query, key, value, args) if tensors and attn_mask is None else None
    if memo is not None and query.is_cuda:
        # the verdict for a CUDA call like an earlier one (host time matters)
        reason, memo = _lookup(_sdpa_verdicts, memo, _UNSEEN)
        if reason is _UNSEEN:
            reason = _checks.sdpa_fallback(query, key, value, None, scale, _HALF, _capability)
            if memo is not None:
                if len(_sdpa_verdicts) > 1024:
                    _sdpa_verdicts.clear()
                _sdpa_verdicts[memo] = reason
    elif tensors:
        reason = _checks.sdpa_fallback(query, key, value, attn_mask, scale, _HALF, _capability)
    if reason is not None or not tensors:
        if reason is not None and reason not in _warned:
            _warned.add(reason)
            warnings.warn(f"flashgen.scaled_dot_product_attention: {reason}; using "
                          "torch.nn.functional.scaled_dot_product_attention", stacklevel=2)
        return torch.nn.functional.scaled_dot_product_attention(
            query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
            scale=scale, enable_gqa=enable_gqa)
    _checks.gqa_heads(query.shape[1], key.shape[1], enable_gqa)
    return _attend(query, key, value, args, memo, False)


def flex_attention(query, key, value, score_mod=None, block_mask=None, scale=None,
                   enable_gqa=False, return_lse=False, kernel_options=None, *, return_aux=None):
    """A drop-in for torch.nn.attention.flex_attention.flex_attention, with
    its arguments and defaults: query (B, Hq, L, E), key (B, Hkv, S, E) and
    value (B, Hkv, S, Ev), CUDA fp16/bf16. score_mod(score, b, h, q_idx,
    kv_idx) and the mask_mod of block_mask (a BlockMask from
    create_block_mask, for these lengths, or flashgen.create_block_mask's)
    are translated into flashgen expressions by tracing them (flashgen.attention's score_mod and
    mask_mod). A Flex BlockMask's mask_mod gets flashgen's own block mask,
    built on the first call with it for these heads (and kept with it), so
    empty blocks are skipped and full ones untested. enable_gqa:
    Hq a multiple of Hkv (without it, equal heads). Returns the output
    (B, Hq, L, Ev); with return_lse also the natural-log log-sum-exp
    (B, Hq, L), fp32; with return_aux=AuxRequest(lse=True) (out,
    AuxOutput(lse=...)). kernel_options are Triton's and ignored. What
    flashgen cannot run (another dtype or device, batches that broadcast, a
    modifier with no exact translation, max_scores) raises instead of
    running elsewhere."""
    names = ("query", "key", "value")
    for name, t in zip(names, (query, key, value)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: {type(t).__name__}; expected a torch.Tensor")
    _checks.tensors(names, (query, key, value), "(B, H, S, E)", _HALF)
    _checks.gqa_heads(query.shape[1], key.shape[1], enable_gqa)
    if key.shape[0] != query.shape[0]:
        raise ValueError(f"key: batch {key.shape[0]}, but query has {query.shape[0]} (flashgen "
                         "does not broadcast batches)")
    sparsity = None
    if isinstance(block_mask, _sparsity.BlockMask):
        sparsity = block_mask
    elif block_mask is not None:
        sparsity = _flex_block_mask(block_mask, query, key)
    if return_lse and return_aux is not None:
        raise ValueError("Cannot specify both return_lse and return_aux (return_lse is "
                         "deprecated: return_aux=AuxRequest(lse=True))")
    if return_aux is not None and getattr(return_aux, "max_scores", False):
        raise ValueError("return_aux: max_scores is not computed by flashgen (lse is)")
    out, lse = attention(query, key, value, softmax_scale=scale, return_lse=True, layout="bhsd",
                         score_mod=score_mod, sparsity=sparsity)
    if return_aux is not None:
        from torch.nn.attention.flex_attention import AuxOutput
        return out, AuxOutput(lse=lse if return_aux.lse else None, max_scores=None)
    return (out, lse) if return_lse else out


def create_block_mask(mask_mod, B, H, Q_LEN, KV_LEN, device="cuda", BLOCK_SIZE=128, *,
                      aux=None):
    """FlexAttention's create_block_mask, built by flashgen on the GPU:
    mask_mod(b, h, q_idx, kv_idx) (a function, traced as flashgen.attention
    traces one, or an expression text such as "doc[q] == doc[k]" with its
    aux tensors) evaluated on every element of each BLOCK_SIZE block (an int
    or a (queries, keys) pair, multiples of 16) of Q_LEN x KV_LEN: blocks
    where it holds nowhere are left out, those where it holds everywhere
    marked full. B and H: the batch and query heads of the calls (None: 1);
    the block mask has a set of blocks per batch row only where the
    predicate reads b, per head only where it reads h, and the calls must
    then have B rows, H heads. The build is queued on the current stream.
    Returns a flashgen.BlockMask, for flashgen.attention(sparsity=...) and
    flashgen.flex_attention(block_mask=...), reusable across calls and
    layers."""
    if mask_mod is None:
        raise ValueError("mask_mod: None; a block mask is made from a mask predicate")
    device = torch.device(device)
    if device.type != "cuda":
        raise ValueError(f"device: {device}; block masks are built on CUDA devices")
    if device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    batch, heads = (1 if x is None else int(x) for x in (B, H))
    for name, value in (("B", batch), ("H", heads), ("Q_LEN", Q_LEN), ("KV_LEN", KV_LEN)):
        if int(value) < 1:
            raise ValueError(f"{name}: {value}; must be >= 1")
    block_size = _sparsity._block_size(BLOCK_SIZE)
    tr = _expressions.translate(None, mask_mod, aux, device)
    names, tensors = tuple(tr.aux), tuple(tr.aux.values())
    decls = _checks.expressions(None, tr.mask_mod, names, tensors, torch.empty(0, device=device),
                                torch.float32, torch.int32)
    _native.check_expressions(None, tr.mask_mod, decls)
    exprs = ("", tr.mask_mod, ",".join(names), tensors)
    return _ops.build_block_mask(device.index, batch, heads, int(Q_LEN), int(KV_LEN), block_size,
                                 exprs, lambda handle: _sparsity.BlockMask(
                                     handle, device.index, tr.mask_mod, tr.aux, block_size,
                                     (int(Q_LEN), int(KV_LEN))))


# Flex BlockMask (by id) -> {(B, H, device index): flashgen.BlockMask}, kept
# while the Flex one lives
_flex_masks = {}


def _flex_block_mask(block_mask, query, key):
    """flashgen's block mask for a Flex BlockMask's mask_mod at query's
    batch, heads and lengths, built once per Flex BlockMask (per call where
    the object takes no weak reference)."""
    B, H, q_len, _ = query.shape
    kv_len = key.shape[2]
    mod = _block_mask_mod(block_mask, q_len, kv_len)
    where = (B, H, query.get_device())
    built = _flex_masks.get(id(block_mask))
    if built is None:
        built = {}
        try:
            weakref.finalize(block_mask, _flex_masks.pop, id(block_mask), None)
            _flex_masks[id(block_mask)] = built
        except TypeError:
            pass
    mask = built.get(where)
    if mask is None:
        size = getattr(block_mask, "BLOCK_SIZE", (128, 128))
        try:
            block = _sparsity._block_size(tuple(size))
        except ValueError:
            block = (128, 128)  # Flex's blocks are its own: flashgen's tiles want 16s
        mask = built[where] = create_block_mask(mod, B, H, q_len, kv_len, query.device, block)
    return mask


def _block_mask_mod(block_mask, q_len, kv_len):
    """The mask_mod of a BlockMask made for q_len x kv_len (None: none)."""
    lengths = getattr(block_mask, "seq_lengths", None)
    if lengths is None or not hasattr(block_mask, "mask_mod"):
        raise TypeError(f"block_mask: {type(block_mask).__name__}; expected a BlockMask "
                        "(torch.nn.attention.flex_attention.create_block_mask)")
    if tuple(lengths) != (q_len, kv_len):
        raise ValueError(f"block_mask: made for seq_lengths {tuple(lengths)}, but query has "
                         f"{q_len} rows and key {kv_len} (flashgen evaluates its mask_mod, "
                         "which must be for these lengths)")
    mod = block_mask.mask_mod
    if getattr(mod, "__name__", "") == "_sliced_mask_mod_error":
        raise ValueError("block_mask: a sliced BlockMask has no mask_mod (slice the inputs, or "
                         "make the block mask for them)")
    return mod

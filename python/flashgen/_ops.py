"""flashgen's forward and backward as PyTorch custom operators.

flashgen::forward(q, k, v, ...) -> (out, lse, rng) and flashgen::backward,
with fake (meta) implementations and the forward's autograd formula, so
torch.compile traces through them without graph breaks. Tensors are seen as
(B, S, H, D) with any strides; the C library needs the head dim contiguous
and, for head dims that are multiples of 8, 16-byte aligned rows: a tensor
that is not so is copied first. v's head dim Dv may differ from q's and k's
(spec.head_dim_v): out and its gradient are (B, Sq, Hq, Dv) contiguous, lse
(B, Hq, Sq) fp32, rng a CPU int64 pair (seed, offset) that the backward
reuses to draw the same dropout mask. Plain tensors outside torch.compile
take a shorter road to the same functions (Attention, attention()): the
dispatcher costs more host time than the rest of a call.

The scores' variants ride at the end of every operator's arguments, with
defaults that leave them off: softcap (float, 0.0: none), alibi_slopes
(fp32 (Hq,) or (B, Hq), or None) and sinks (fp32 (Hq,), or None). The
backward operators return the sinks' gradient after dq, dk and dv: (Hq,)
fp32, or an empty tensor without sinks.

The expressions ride after them: score_mod and mask_mod (str, "": none;
docs/expressions.md), aux_names (str: the aux tensors' names, joined by
commas) and aux (Tensor[], or None: float32 or int32, 1 to 3 dimensions,
any strides), whose declarations (type, rank) come from the tensors
themselves. The backward operators take aux_grads last (int: bit i asks for
aux[i]'s gradient, a float tensor the score modifier reads) and return the
aux tensors' gradients after d_sinks: a list with one fp32 tensor per aux
tensor, of its shape where asked for, else empty."""
import math
import struct
from typing import Optional

import torch

from . import _native
from .sparsity import layout_by_id

_DTYPES = {torch.float16: 0, torch.bfloat16: 1}
_UINT64 = (1 << 64) - 1


def _view(t):
    """(data, stride_batch, stride_seq, stride_head) of a (B, S, H, D) tensor
    as the C library takes it (runtime/call.c), or None when it must be
    copied first. The stride of a dimension of size 1 is never used: 0
    keeps it legal."""
    shape, stride = t.shape, t.stride()
    if stride[3] != 1 and shape[3] > 1:
        return None
    s0 = stride[0] if shape[0] > 1 else 0
    s1 = stride[1] if shape[1] > 1 else 0
    s2 = stride[2] if shape[2] > 1 else 0
    data = t.data_ptr()
    if shape[3] % 8 == 0 and (data % 16 or s0 % 8 or s1 % 8 or s2 % 8):
        return None
    return data, s0, s1, s2


def _viewed(t):
    """t, or its contiguous copy, and its view."""
    view = _view(t)
    if view is None:  # a fresh allocation: contiguous() keeps a misaligned one
        t = t.clone(memory_format=torch.contiguous_format)
        view = _view(t)
    return t, view


_specs = {}
_KV_LATENT = 2  # spec.kv_cache's FG_KV_LATENT


def _spec(dtype, head_dim, mask, dropout, sparsity, block_q, block_k, factors, varlen=False,
          kv_cache=False, flags=(0, 0, 0), exprs=None, head_dim_v=None):
    """The fg_spec; flags: (softcap, alibi, sinks), 0 or 1 each; exprs:
    (score_mod, mask_mod, aux declarations) (_spec_exprs) or None;
    head_dim_v: v's head dim (None: head_dim's). New expressions are
    checked by the library first (ValueError naming the column)."""
    # 0 for a value head dim equal to head_dim, as the library canonicalizes it
    dv = 0 if head_dim_v is None or head_dim_v == head_dim else head_dim_v
    key = (dtype, head_dim, dv, mask, dropout, sparsity, block_q, block_k, factors, varlen,
           kv_cache, flags, exprs)
    spec = _specs.get(key)
    if spec is None:
        spec = _native.Spec(_DTYPES[dtype], head_dim, mask, int(dropout), sparsity, block_q,
                            block_k, factors, int(varlen), int(kv_cache), *flags, dv)
        if exprs is not None:
            _native.check_expressions(*exprs)
            _native.expression_spec(spec, *exprs)
        if len(_specs) > 4096:
            _specs.clear()
        _specs[key] = spec
    return spec


# ---- the expressions' arguments ---------------------------------------------------
# As the operators take them: (score_mod, mask_mod, aux_names, aux), "" and
# None for none; None for the whole when there are no expressions.

def _spec_exprs(exprs):
    """(score_mod, mask_mod, declarations) for the spec, or None: each
    declaration (name, 0 float32 or 1 int32, rank) from the tensor."""
    if exprs is None:
        return None
    score_mod, mask_mod, aux_names, aux = exprs
    if not score_mod and not mask_mod:
        return None
    names = aux_names.split(",") if aux_names else []
    aux = aux or ()
    if len(names) != len(aux):
        raise ValueError(f"aux_names: {len(names)} names ({aux_names!r}) for {len(aux)} aux "
                         "tensors")
    decls = tuple((n, 1 if t.dtype == torch.int32 else 0, t.dim()) for n, t in zip(names, aux))
    return score_mod or None, mask_mod or None, decls


def _aux_fields(exprs):
    """(the tensors to keep referenced until the call is queued, the aux
    fields of forward_args: (data, sizes, strides) each). An empty tensor
    gets a one-element buffer (every read of it is outside: 0)."""
    if exprs is None or not exprs[3]:
        return (), ()
    keep, fields = [], []
    for t in exprs[3]:
        if t.numel() == 0:
            buf = torch.zeros(1, dtype=t.dtype, device=t.device)
            keep.append(buf)
            fields.append((buf.data_ptr(), tuple(t.shape), (0,) * t.dim()))
        else:
            fields.append((t.data_ptr(), tuple(t.shape), tuple(t.stride())))
    return keep, tuple(fields)


def _d_aux(exprs, aux_grads):
    """The aux tensors' gradients the backward writes: an fp32 tensor of the
    aux tensor's shape for each bit of aux_grads (a float tensor and a score
    modifier), else None."""
    if exprs is None or not aux_grads or not exprs[0]:
        return [None] * (len(exprs[3] or ()) if exprs is not None else 0)
    return [torch.empty(t.shape, dtype=torch.float32, device=t.device)
            if aux_grads >> i & 1 and t.dtype == torch.float32 else None
            for i, t in enumerate(exprs[3] or ())]


def _d_aux_ptrs(d_aux):
    return tuple(t.data_ptr() if t is not None and t.numel() else 0 for t in d_aux)


def _zeroed(d_aux):
    return [t.zero_() if t is not None else None for t in d_aux]


def _aux_grads(exprs):
    """aux_grads of a call's expressions: the float aux tensors a score
    modifier reads that require grad."""
    if exprs is None or not exprs[0] or not exprs[3]:
        return 0
    return sum(1 << i for i, t in enumerate(exprs[3])
               if t.dtype == torch.float32 and t.requires_grad)


_NO_FLAGS = (0, 0, 0)
_NO_VIEW = (0, 0, 0, 0)
_NO_VALUES = (0.0, 0, 0, 0)


def _variants(variants):
    """The scores' variants (softcap, alibi_slopes, sinks), or None, as the C
    library takes them: (the spec's flags, forward_args' variants, the
    tensors to keep referenced until the call is queued). The slopes need
    their last dimension contiguous (a batch stride of 0 broadcasts one row:
    an expanded (Hq,) works as (B, Hq)), the sinks all of it: others are
    copied."""
    if variants is None:
        return _NO_FLAGS, _NO_VALUES, ()
    cap, slopes, sinks = variants
    if not cap and slopes is None and sinks is None:
        return _NO_FLAGS, _NO_VALUES, ()
    slopes_ptr = stride = sinks_ptr = 0
    if slopes is not None:
        if slopes.shape[-1] > 1 and slopes.stride(-1) != 1:
            slopes = slopes.contiguous()
        if slopes.dim() == 2 and slopes.shape[0] > 1:
            stride = slopes.stride(0)
        slopes_ptr = slopes.data_ptr()
    if sinks is not None:
        sinks = sinks.contiguous()
        sinks_ptr = sinks.data_ptr()
    flags = (int(cap > 0), int(slopes is not None), int(sinks is not None))
    return flags, (float(cap), slopes_ptr, stride, sinks_ptr), (slopes, sinks)


def _no_key_lse(lse, sinks):
    """lse of rows that see no key: -inf, or with sinks the sink alone (the
    heads are lse's second-to-last dimension)."""
    if sinks is None:
        return lse.fill_(-math.inf)
    return lse.copy_(sinks.view(-1, 1).expand(lse.shape[-2:]).expand_as(lse))


def _d_sinks(variants, device):
    """The buffer of the sinks' gradient (the backward writes it), or None."""
    if variants is None or variants[2] is None:
        return None
    return torch.empty(variants[2].shape, dtype=torch.float32, device=device)


def _philox(device, dropout_p):
    """For dropout_p > 0: (seed, offset) from PyTorch's generator for the
    device, advanced so the next draw is independent: the kernels key Philox
    on the seed and the offset's high word and count on its low word, so
    distinct offsets never share a stream. torch.manual_seed makes calls
    reproducible."""
    if torch.cuda.is_current_stream_capturing():
        raise RuntimeError("flashgen: dropout_p > 0 cannot be captured in a CUDA graph (its seed "
                           "and offset would be frozen into the graph); capture with "
                           "dropout_p=0")
    gen = torch.cuda.default_generators[device.index]
    seed, offset = gen.initial_seed(), gen.get_offset()
    gen.set_offset(offset + 4)  # PyTorch keeps offsets multiples of 4
    return seed, offset


def _stream(index):
    return torch.cuda.current_stream(index).cuda_stream


if hasattr(torch._C, "_cuda_getCurrentRawStream"):  # the same, without a Stream object
    _stream = torch._C._cuda_getCurrentRawStream  # noqa: F811


# A split decoding step's workspace (its splits' partial rows) and turn
# counters (fg_forward_args.split_counters, one int32 a query row, zero
# between steps), kept per device and stream and grown as needed: steps on
# one stream run in order, so the next step finds them free, and an
# allocation per step costs more host time than the step's launches; with
# the counters a short step is one launch. Under graph capture a step takes
# a fresh workspace from PyTorch's allocator (the graph's pool) and no
# counters: a graph may replay on another stream, beside the eager steps
# that use the kept ones.
_step_workspaces = {}

# The current device's index (a kept workspace is for its device's steps),
# without a Python device object where PyTorch has the direct call
_current_device = getattr(torch._C, "_cuda_getDevice", torch.cuda.current_device)


def _step_workspace(q, index, stream, need, rows):
    """(workspace, counters) for a step of `rows` query rows on stream: a
    uint8 tensor of at least need bytes on q's device and an int32 tensor of
    at least rows zeros, or None (need 0; counters under capture); the
    caller holds them until the step is queued."""
    if not need:
        return None, None
    if _capturing() or _current_device() != index:  # (the check sees that device's)
        return q.new_empty(need, dtype=torch.uint8), None
    kept = _step_workspaces.get((index, stream))
    if kept is None:
        if len(_step_workspaces) > 64:  # streams come and go: keep a bounded few
            _step_workspaces.clear()
        kept = _step_workspaces[(index, stream)] = [q.new_empty(need, dtype=torch.uint8),
                                                   q.new_zeros(rows, dtype=torch.int32)]
    if kept[0].numel() < need:
        kept[0] = q.new_empty(need, dtype=torch.uint8)
    if kept[1].numel() < rows:
        kept[1] = q.new_zeros(rows, dtype=torch.int32)
    return kept


_capturing = getattr(torch._C, "_cuda_isCurrentStreamCapturing",
                     lambda: torch.cuda.is_current_stream_capturing())


def _call(q, k, v, o, lse, mask, align, window_left, window_right, dropout_p, scale, sparsity,
          block_q, block_k, factors, layout_id, seed, offset, positions=(0, 0),
          values=_NO_VALUES, aux=()):
    """fg_forward_args of a call; both passes start from it. q, k, v, o are
    (tensor, view) pairs; lse None skips it; positions (position_q,
    position_k): the call is a block of a longer one; values: the variants'
    (_variants); aux: the aux tensors' fields (_aux_fields)."""
    (B, Sq, Hq, _), (_, Sk, Hkv, _) = q[0].shape, k[0].shape
    index = q[0].get_device()
    layout = layout_by_id(layout_id).handle(index).value if sparsity == 1 else 0
    lse_data = lse.data_ptr() if lse is not None else 0
    return _native.forward_args(q[1], k[1], v[1], o[1], lse_data, B, Hq, Hkv, Sq, Sk, scale,
                                align, window_left, window_right, dropout_p, seed, offset, layout,
                                _stream(index), positions=positions, variants=values, aux=aux)


def build_block_mask(index, batch, heads, seqlen_q, seqlen_k, block_size, exprs, make):
    """make(handle): the block mask of exprs' mask predicate (exprs as
    run_forward's) for calls of these shapes on device index, built on its
    current stream."""
    _keep_aux, aux = _aux_fields(exprs)
    spec = _spec(torch.float16, 64, 0, False, 1, *block_size, 0, exprs=_spec_exprs(exprs))
    args = _native.forward_args(_NO_VIEW, _NO_VIEW, _NO_VIEW, _NO_VIEW, 0, batch, heads, heads,
                                seqlen_q, seqlen_k, 0.0, 0, -1, -1, 0.0, 0, 0, 0, _stream(index),
                                aux=aux)
    return make(_native.device_context(index).block_mask(spec, args))


def _bshd(shape, heads_first):
    """(B, S, H, D) of a 4-D shape, (B, H, S, D) with heads_first."""
    return (shape[0], shape[2], shape[1], shape[3]) if heads_first else tuple(shape)


def _new_out(q, B, Sq, Hq, Dv, heads_first):
    """A fresh output of q's dtype and device, (B, Sq, Hq, Dv), or with
    heads_first its (B, Hq, Sq, Dv) view: the kernels write (B, Sq, Hq, Dv)
    memory either way."""
    if heads_first:
        return torch.empty_strided((B, Hq, Sq, Dv), (Sq * Hq * Dv, Dv, Hq * Dv, 1),
                                   dtype=q.dtype, device=q.device)
    return q.new_empty((B, Sq, Hq, Dv))


def run_forward(q, k, v, mask, align, window_left, window_right, dropout_p, scale, sparsity,
                block_q, block_k, factors, layout_id, with_lse=True, rng=None, positions=(0, 0),
                variants=None, exprs=None, heads_first=False, call_key=None):
    """out (B, Sq, Hq, Dv) (Dv v's head dim), lse (B, Hq, Sq) (None unless
    with_lse: the kernel then skips it) and the dropout (seed, offset): rng,
    or drawn from PyTorch's generator. positions: see _call; variants:
    (softcap, alibi_slopes, sinks) or None; exprs: (score_mod, mask_mod,
    aux_names, aux) or None. heads_first: q, k, v are (B, H, S, D), and so
    is out, over (B, Sq, Hq, Dv) memory as the kernels write it (a kept
    call then takes no transposes). call_key: the entry point's key of the
    call's checks, which holds all the kept struct depends on (None: built
    here)."""
    B, Sq, Hq, D = _bshd(q.shape, heads_first)
    keys, Dv = k.shape[2 if heads_first else 1], v.shape[3]
    index = q.get_device()
    key = None
    if not dropout_p and not sparsity and positions == (0, 0) and variants is None and \
            exprs is None:
        key = call_key if call_key is not None else (
            "forward", q.shape, q.stride(), k.shape, k.stride(), v.shape, v.stride(), q.dtype,
            index, mask, align, window_left, window_right, scale, block_q, block_k, factors,
            heads_first)
        ctx = _native.device_context(index)
        kept = ctx.kept.get(key)
        if kept is not None:
            addresses = q.data_ptr(), k.data_ptr(), v.data_ptr()
            if not _misaligned(D, Dv, addresses):
                spec, held, like_q = kept
                out = torch.empty_like(q) if like_q else _new_out(q, B, Sq, Hq, Dv, heads_first)
                lse = q.new_empty((B, Hq, Sq), dtype=torch.float32) if with_lse else None
                ctx.forward(spec, _DENSE.written(held, addresses + (
                    out.data_ptr(), 0 if lse is None else lse.data_ptr(), _stream(index))))
                seed, offset = rng or (0, 0)
                return out, lse, seed, offset
    out = _new_out(q, B, Sq, Hq, Dv, heads_first)
    lse = q.new_empty((B, Hq, Sq), dtype=torch.float32) if with_lse else None
    seed, offset = rng or (_philox(q.device, dropout_p) if dropout_p > 0 else (0, 0))
    if out.numel() == 0:
        return out, lse, seed, offset
    if keys == 0:  # no keys: an empty sum
        sinks = variants[2] if variants is not None else None
        return out.zero_(), _no_key_lse(lse, sinks) if with_lse else None, seed, offset
    given = q
    if heads_first:
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    # Copies made for the kernel stay referenced until it is queued.
    qv, kv, vv = _viewed(q), _viewed(k), _viewed(v)
    ov = out, (out.data_ptr(), Sq * Hq * Dv if B > 1 else 0, Hq * Dv if Sq > 1 else 0,
               Dv if Hq > 1 else 0)  # fresh, (B, Sq, Hq, Dv) in memory
    flags, values, _keep = _variants(variants)
    _keep_aux, aux = _aux_fields(exprs)
    spec = _spec(q.dtype, D, mask, dropout_p > 0, sparsity, block_q, block_k, factors,
                 flags=flags, exprs=_spec_exprs(exprs), head_dim_v=Dv)
    args = _call(qv, kv, vv, ov, lse, mask, align, window_left, window_right, dropout_p, scale,
                 sparsity, block_q, block_k, factors, layout_id, seed, offset, positions, values,
                 aux)
    ctx = _native.device_context(index)
    ctx.forward(spec, args)
    if key is not None and qv[0] is q and kv[0] is k and vv[0] is v:  # each read in place
        ctx.keep(key, (spec, _DENSE.kept(args), _like(given, out)))
    return out, lse, seed, offset


def _like(q, out):
    """Whether torch.empty_like(q) makes a tensor of out's shape and strides
    (q then dense, so its strides are copied): a kept call allocates its
    output so, a cheaper call than new_empty's."""
    return q.shape == out.shape and q.stride() == out.stride()


# A call like an earlier one (shapes, strides, dtype, device and options; no
# dropout, sparsity, variants or expressions; every tensor read in place)
# starts from a copy of that call's argument struct, kept by its device's
# context, and writes only its addresses and stream: dense calls, packed
# ones (run_varlen_forward) and decoding steps.
_ARGS = _native.ForwardArgs
assert _native.Tensor.data.offset == 0


class _Addresses:
    """Where a kept call writes its addresses: fields of fg_forward_args, in
    the struct's order. A copy of the kept struct gets them in one pack that
    writes the bytes between them back as they were."""

    def __init__(self, *names):
        offsets = [getattr(_ARGS, name).offset for name in names]
        assert offsets == sorted(offsets)
        self._start = offsets[0]
        self._gaps = tuple(zip([at + 8 for at in offsets], offsets[1:]))
        self._pack_into = struct.Struct(
            "=Q" + "".join(f"{end - at}sQ" for at, end in self._gaps)).pack_into

    def kept(self, args):
        """What a later call starts from: args' bytes, and the pack's values
        (the bytes between the addresses; 0 in the addresses' places)."""
        template = bytes(args)
        values = [0]
        for at, end in self._gaps:
            values += (template[at:end], 0)
        return template, values

    def written(self, kept, addresses):
        """A copy of a kept struct with addresses (one per name) written."""
        template, values = kept
        args = _ARGS.from_buffer_copy(template)
        values = values.copy()
        values[::2] = addresses
        self._pack_into(args, self._start, *values)
        return args


# a dense call's addresses: q, k, v and o's data, lse, stream
_DENSE = _Addresses("q", "k", "v", "o", "lse", "stream")
# a decoding step's: those, then cache_seqlens, block_table, k_new's and
# v_new's data, workspace, split_counters
_STEP = _Addresses("q", "k", "v", "o", "lse", "stream", "cache_seqlens", "block_table", "k_new",
                   "v_new", "workspace", "split_counters")
# a packed call's: those of a dense call, then cu_seqlens_q, cu_seqlens_k
# and seqused_k
_PACKED = _Addresses("q", "k", "v", "o", "lse", "stream", "cu_seqlens_q", "cu_seqlens_k",
                     "seqused_k")


def _misaligned(head_dim, head_dim_v, addresses):
    """Whether q's, k's or v's address breaks the 16-byte rows that head
    dims of multiples of 8 are read in (_view): such a call copies."""
    q, k, v = addresses
    return (head_dim % 8 == 0 and (q % 16 or k % 16)) or (head_dim_v % 8 == 0 and v % 16)


def run_backward(d_out, q, k, v, out, lse, seed, offset, mask, align, window_left, window_right,
                 dropout_p, scale, sparsity, block_q, block_k, factors, layout_id,
                 deterministic, positions=(0, 0), variants=None, exprs=None, aux_grads=0):
    """dq, dk, dv (of q's, k's and v's shapes; d_out and out are (B, Sq, Hq,
    Dv)) of the forward call with these arguments and (seed, offset), and
    the sinks' gradient (Hq,) fp32 (None without sinks); with
    exprs (as run_forward's) also the aux tensors' gradients: a list, an
    fp32 tensor of the aux tensor's shape for each bit of aux_grads (a
    float tensor the score modifier reads), else None."""
    dq = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    dk = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    dv = torch.empty(v.shape, dtype=v.dtype, device=v.device)
    d_sinks = _d_sinks(variants, q.device)
    d_aux = _d_aux(exprs, aux_grads)
    more = (d_aux,) if exprs is not None else ()
    if dq.numel() == 0 or dk.numel() == 0:  # nothing attends, or nothing to attend to
        # (rows that see no key have O = 0: their sink gets no gradient)
        return (dq.zero_(), dk.zero_(), dv.zero_(),
                d_sinks.zero_() if d_sinks is not None else None) + \
            ((_zeroed(d_aux),) if more else ())
    # Copies made for the kernels stay referenced until they are queued.
    viewed = [_viewed(t) for t in (q, k, v, out, d_out, dq, dk, dv)]
    lse = lse.contiguous()
    flags, values, _keep = _variants(variants)
    _keep_aux, aux = _aux_fields(exprs)
    spec = _spec(q.dtype, q.shape[3], mask, dropout_p > 0, sparsity, block_q, block_k, factors,
                 flags=flags, exprs=_spec_exprs(exprs), head_dim_v=v.shape[3])
    fwd = _call(*viewed[:4], lse, mask, align, window_left, window_right, dropout_p, scale,
                sparsity, block_q, block_k, factors, layout_id, seed, offset, positions, values,
                aux)
    grads = [view for _, view in viewed[4:]]
    _backward_call(q.device, spec, fwd, grads, deterministic, d_sinks, d_aux)
    return (dq, dk, dv, d_sinks) + more


def _backward_call(device, spec, fwd, grads, deterministic, d_sinks=None, d_aux=()):
    """fg_backward of forward arguments fwd into the gradients' views (and
    d_sinks, an fp32 tensor the library writes, unless None; d_aux, the aux
    tensors' fp32 gradients, None where not asked for)."""
    ctx = _native.device_context(device.index)
    # The workspace comes from PyTorch's allocator: stream-ordered, and no
    # allocation of the library's own inside a CUDA graph capture.
    sinks_ptr = d_sinks.data_ptr() if d_sinks is not None else 0
    for t in d_aux:  # the library zeroes what it writes; an empty one it never sees
        if t is not None and t.numel() == 0:
            t.zero_()
    aux_ptrs = _d_aux_ptrs(d_aux)
    nbytes = ctx.backward_workspace_size(spec, _native.backward_args(fwd, *grads, deterministic,
                                                                     0, 0, sinks_ptr, aux_ptrs))
    workspace = torch.empty(nbytes, dtype=torch.uint8, device=device)
    ctx.backward(spec, _native.backward_args(fwd, *grads, deterministic, workspace.data_ptr(),
                                             nbytes, sinks_ptr, aux_ptrs))


def _no_sinks_grad(q):
    """What the backward operators return for d_sinks without sinks."""
    return q.new_empty((0,), dtype=torch.float32)


def _rng_tensor(seed, offset):
    return torch.tensor([seed - (1 << 64) if seed >= 1 << 63 else seed, offset],
                        dtype=torch.int64)


def _rng_values(rng):
    seed, offset = rng.tolist()
    return seed & _UINT64, offset


# ---- the custom operators (torch.compile, export, graphs, modes) -------------

def _custom_op(name, mutates_args=()):
    """torch.library.custom_op with the schema inferred from the annotations,
    the aux list made optional ("Tensor[]? aux=None"), which the inference of
    older PyTorch releases does not write itself."""
    def register(fn):
        annotations = dict(fn.__annotations__)
        fn.__annotations__["aux"] = list[torch.Tensor]
        try:
            schema = torch.library.infer_schema(fn, mutates_args=mutates_args)
        finally:
            fn.__annotations__ = annotations
        schema = schema.replace("Tensor[] aux=None", "Tensor[]? aux=None")
        return torch.library.custom_op(name, fn, mutates_args=mutates_args, device_types="cuda",
                                       schema=schema)
    return register


def _op_exprs(score_mod, mask_mod, aux_names, aux):
    """The operators' expression arguments as run_forward takes them."""
    if not score_mod and not mask_mod and not aux:
        return None
    return score_mod, mask_mod, aux_names, aux


@_custom_op("flashgen::forward")
def forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: int, align: int,
            window_left: int, window_right: int, dropout_p: float, scale: float, sparsity: int,
            block_q: int, block_k: int, factors: int, layout_id: int, deterministic: bool,
            softcap: float = 0.0, alibi_slopes: Optional[torch.Tensor] = None,
            sinks: Optional[torch.Tensor] = None, score_mod: str = "", mask_mod: str = "",
            aux_names: str = "", aux: Optional[list[torch.Tensor]] = None
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    out, lse, seed, offset = run_forward(q, k, v, mask, align, window_left, window_right,
                                         dropout_p, scale, sparsity, block_q, block_k, factors,
                                         layout_id, variants=(softcap, alibi_slopes, sinks),
                                         exprs=_op_exprs(score_mod, mask_mod, aux_names, aux))
    return out, lse, _rng_tensor(seed, offset)


def _fake_check(score_mod, mask_mod, aux_names, aux):
    """What the fake implementations check of the expressions (the library
    parses them with no GPU): a traced program fails where the call is."""
    exprs = _spec_exprs(_op_exprs(score_mod, mask_mod, aux_names, aux))
    if exprs is not None:
        _native.check_expressions(*exprs)


@forward.register_fake
def _(q, k, v, mask, align, window_left, window_right, dropout_p, scale, sparsity, block_q,
      block_k, factors, layout_id, deterministic, softcap=0.0, alibi_slopes=None, sinks=None,
      score_mod="", mask_mod="", aux_names="", aux=None):
    _fake_check(score_mod, mask_mod, aux_names, aux)
    B, Sq, Hq, _ = q.shape
    Dv = v.shape[3]  # the output takes v's head dim
    return (q.new_empty((B, Sq, Hq, Dv)), q.new_empty((B, Hq, Sq), dtype=torch.float32),
            torch.empty(2, dtype=torch.int64))


def _d_aux_out(q, aux, d_aux):
    """The backward operators' list of aux gradients: each asked-for one, an
    empty fp32 tensor for the rest."""
    return [g if g is not None else q.new_empty((0,), dtype=torch.float32)
            for g in (d_aux if d_aux is not None else [None] * len(aux or ()))]


@_custom_op("flashgen::backward")
def backward(d_out: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
             out: torch.Tensor, lse: torch.Tensor, rng: torch.Tensor, mask: int, align: int,
             window_left: int, window_right: int, dropout_p: float, scale: float, sparsity: int,
             block_q: int, block_k: int, factors: int, layout_id: int, deterministic: bool,
             softcap: float = 0.0, alibi_slopes: Optional[torch.Tensor] = None,
             sinks: Optional[torch.Tensor] = None, score_mod: str = "", mask_mod: str = "",
             aux_names: str = "", aux: Optional[list[torch.Tensor]] = None, aux_grads: int = 0
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                        list[torch.Tensor]]:
    exprs = _op_exprs(score_mod, mask_mod, aux_names, aux)
    dq, dk, dv, d_sinks, *d_aux = run_backward(
        d_out, q, k, v, out, lse, *_rng_values(rng), mask, align, window_left, window_right,
        dropout_p, scale, sparsity, block_q, block_k, factors, layout_id, deterministic,
        variants=(softcap, alibi_slopes, sinks), exprs=exprs, aux_grads=aux_grads)
    return (dq, dk, dv, d_sinks if d_sinks is not None else _no_sinks_grad(q),
            _d_aux_out(q, aux, d_aux[0] if d_aux else None))


def _fake_d_sinks(q, sinks):
    shape = sinks.shape if sinks is not None else (0,)
    return q.new_empty(shape, dtype=torch.float32)


def _fake_d_aux(q, score_mod, aux, aux_grads):
    return [q.new_empty(t.shape if score_mod and aux_grads >> i & 1 and
                        t.dtype == torch.float32 else (0,), dtype=torch.float32)
            for i, t in enumerate(aux or ())]


@backward.register_fake
def _(d_out, q, k, v, out, lse, rng, mask, align, window_left, window_right, dropout_p, scale,
      sparsity, block_q, block_k, factors, layout_id, deterministic, softcap=0.0,
      alibi_slopes=None, sinks=None, score_mod="", mask_mod="", aux_names="", aux=None,
      aux_grads=0):
    _fake_check(score_mod, mask_mod, aux_names, aux)
    return (q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape),
            _fake_d_sinks(q, sinks), _fake_d_aux(q, score_mod, aux, aux_grads))


# The operators' last arguments: softcap, alibi_slopes, sinks, then score_mod,
# mask_mod, aux_names, aux.
_VARIANTS = 3
_EXPRS = 4
_TAIL = _VARIANTS + _EXPRS
_TAIL_DEFAULTS = (0.0, None, None, "", "", "", None)


def _with_defaults(options, base):
    """The options after the tensors with the trailing arguments a call left
    out as their defaults (as PyTorch versions may or may not give them to
    setup_context); base: the options before the trailing ones. The backward
    returns a gradient for each argument the call passed."""
    return list(options) + list(_TAIL_DEFAULTS[len(options) - base:])


def _save_exprs(ctx, exprs):
    """Keeps a call's expressions on the autograd context (the tensors are
    saved with the rest) and which aux gradients the backward computes."""
    score_mod, mask_mod, aux_names, aux = exprs
    ctx.exprs = (score_mod, mask_mod, aux_names)
    ctx.aux_none = aux is None
    ctx.aux_grads = _aux_grads((score_mod, mask_mod, aux_names, aux))
    return tuple(aux or ())


def _aux_grad_list(ctx, d_aux):
    """The gradient of the aux list input."""
    if ctx.aux_none:
        return None
    return [g if ctx.aux_grads >> i & 1 else None for i, g in enumerate(d_aux)]


def _setup_context(ctx, inputs, output):
    q, k, v, *options = inputs
    options = _with_defaults(options, 12)
    out, lse, rng = output
    variants, exprs = options[-_TAIL:-_EXPRS], options[-_EXPRS:]
    aux = _save_exprs(ctx, exprs)
    ctx.save_for_backward(q, k, v, out, lse, rng, variants[1], variants[2], *aux)
    ctx.sinks_grad = variants[2] is not None and variants[2].requires_grad
    ctx.options = options[:-_TAIL]
    ctx.softcap = variants[0]
    ctx.mark_non_differentiable(lse, rng)


def _backward(ctx, d_out, _d_lse, _d_rng):
    q, k, v, out, lse, rng, alibi_slopes, sinks, *aux = ctx.saved_tensors
    dq, dk, dv, d_sinks, d_aux = backward(d_out, q, k, v, out, lse, rng, *ctx.options,
                                          ctx.softcap, alibi_slopes, sinks, *ctx.exprs,
                                          None if ctx.aux_none else aux, ctx.aux_grads)
    d_sinks = d_sinks if ctx.sinks_grad else None
    grads = (dq, dk, dv) + (None,) * (len(ctx.options) + 2) + (d_sinks, None, None, None,
                                                                _aux_grad_list(ctx, d_aux))
    return grads[:len(ctx.needs_input_grad)]  # one for each argument the call passed


forward.register_autograd(_backward, setup_context=_setup_context)


# ---- eager calls on plain tensors: the same work without the dispatcher -------

class Attention(torch.autograd.Function):
    """flashgen::forward's autograd for plain tensors outside torch.compile,
    which skips the operator dispatch (about a hundred microseconds a call).
    variants: (softcap, alibi_slopes) and sinks, the one differentiable;
    exprs: (score_mod, mask_mod, aux_names) and the aux tensors after them,
    the float ones that a score modifier reads differentiable."""

    @staticmethod
    def forward(ctx, q, k, v, sinks, options, softcap, alibi_slopes, exprs, *aux):
        variants = (softcap, alibi_slopes, sinks)
        call_exprs = None if exprs is None else exprs + (list(aux),)
        out, lse, seed, offset = run_forward(q, k, v, *options[:-1], variants=variants,
                                             exprs=call_exprs)
        ctx.save_for_backward(q, k, v, out, lse, alibi_slopes, sinks, *aux)
        ctx.options, ctx.rng, ctx.softcap, ctx.exprs = options, (seed, offset), softcap, exprs
        ctx.aux_grads = _aux_grads(call_exprs)
        ctx.mark_non_differentiable(lse)
        ctx.set_materialize_grads(False)  # lse's gradient stays None, not a zero tensor a call
        return out, lse

    @staticmethod
    def backward(ctx, d_out, _d_lse):
        if d_out is None:  # the output took no part in what is differentiated
            return (None,) * len(ctx.needs_input_grad)
        q, k, v, out, lse, alibi_slopes, sinks, *aux = ctx.saved_tensors
        call_exprs = None if ctx.exprs is None else ctx.exprs + (aux,)
        dq, dk, dv, d_sinks, *d_aux = run_backward(
            d_out, q, k, v, out, lse, *ctx.rng, *ctx.options,
            variants=(ctx.softcap, alibi_slopes, sinks), exprs=call_exprs,
            aux_grads=ctx.aux_grads)
        d_aux = d_aux[0] if d_aux else []
        return (dq, dk, dv, d_sinks if ctx.needs_input_grad[3] else None, None, None, None,
                None) + tuple(d_aux)


def eager_ok(q, k, v, *others):
    """Plain tensors (others: tensors or None; a parameter counts as plain),
    no tracing, no mode, no functorch transform: the operator would only add
    its overhead."""
    return (type(q) is torch.Tensor and type(k) is torch.Tensor and type(v) is torch.Tensor
            and _PLAIN.issuperset(map(type, others)) and not torch.compiler.is_compiling()
            and not _modes())


_PLAIN = frozenset((torch.Tensor, torch.nn.Parameter, type(None)))


def _modes():
    C = torch._C
    return (C._len_torch_dispatch_stack() > 0 or C._is_torch_function_mode_enabled()
            or C._functorch.peek_interpreter_stack() is not None)


def _exprs_args(exprs):
    """The operators' trailing expression arguments: () for none."""
    if exprs is None:
        return ()
    score_mod, mask_mod, aux_names, aux = exprs
    return score_mod or "", mask_mod or "", aux_names, list(aux) if aux else None


def attention(q, k, v, options, with_lse, variants=None, exprs=None, heads_first=False,
              call_key=None):
    """(out, lse) for the (B, S, H, D) views q, k, v, or with heads_first
    (B, H, S, D) ones (out then too), and the operator's options (mask ...
    layout_id, deterministic); lse may be None when with_lse is false.
    variants: (softcap, alibi_slopes, sinks) (0.0 and None: off) or None;
    exprs: (score_mod, mask_mod, aux_names, aux) or None; call_key: as
    run_forward's."""
    softcap, alibi_slopes, sinks = variants if variants is not None else (0.0, None, None)
    aux = tuple(exprs[3] or ()) if exprs is not None else ()
    eager = eager_ok(q, k, v, alibi_slopes, sinks, *aux)
    grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad or
                                        (sinks is not None and sinks.requires_grad) or
                                        _aux_grads(exprs))
    if eager and not grad:
        out, lse, _, _ = run_forward(q, k, v, *options[:-1], with_lse=with_lse,
                                     variants=variants, exprs=exprs, heads_first=heads_first,
                                     call_key=call_key)
        return out, lse
    if heads_first:
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    if eager:
        out, lse = Attention.apply(q, k, v, sinks, options, softcap, alibi_slopes,
                                   None if exprs is None else tuple(exprs[:3]), *aux)
    elif variants is None and exprs is None:
        out, lse, _ = forward(q, k, v, *options)
    else:
        out, lse, _ = forward(q, k, v, *options, softcap, alibi_slopes, sinks,
                              *_exprs_args(exprs))
    return (out.transpose(1, 2) if heads_first else out), lse


# ---- packed sequences (flashgen.attention_varlen) ------------------------------
# q (total_q, Hq, D), k (total_k, Hkv, D), v (total_k, Hkv, Dv), out
# (total_q, Hq, Dv), lse (Hq, total_q); the C library sees them as one batch
# of total rows, (1, total, H, D or Dv).

def _packed_call(q, k, v, o, lse, cu_q, cu_k, used, max_q, max_k, mask, align, window_left,
                 window_right, dropout_p, scale, seed, offset, values=_NO_VALUES, aux=()):
    """fg_forward_args of a packed call; q, k, v, o are (tensor, view) pairs
    of the (1, total, H, D) views; values: the variants' (_variants); aux:
    the aux tensors' fields (_aux_fields); lse None skips it."""
    index = q[0].get_device()
    packed = (cu_q.data_ptr(), cu_k.data_ptr(), used.data_ptr() if used is not None else 0,
              q[0].shape[1], k[0].shape[1])
    lse_data = lse.data_ptr() if lse is not None else 0
    return _native.forward_args(q[1], k[1], v[1], o[1], lse_data, cu_q.shape[0] - 1,
                                q[0].shape[2], k[0].shape[2], max_q, max_k, scale, align,
                                window_left, window_right, dropout_p, seed, offset, 0,
                                _stream(index), packed, variants=values, aux=aux)


def _packed_viewed(t):
    return _viewed(t.unsqueeze(0))


def run_varlen_forward(q, k, v, cu_q, cu_k, used, max_q, max_k, mask, align, window_left,
                       window_right, dropout_p, scale, rng=None, variants=None, exprs=None,
                       with_lse=True, call_key=None):
    """out (total_q, Hq, Dv) (Dv v's head dim), lse (Hq, total_q) (None
    unless with_lse: the kernel then skips it) and the dropout (seed,
    offset): rng, or drawn from PyTorch's generator. out's rows outside the
    sequences are not written. variants: (softcap, alibi_slopes (Hq,) or
    (batch, Hq), sinks) or None; exprs: (score_mod, mask_mod, aux_names,
    aux) or None. call_key: the entry point's key of the call's checks,
    which holds all the kept struct depends on (None: built here)."""
    Tq, Hq, D = q.shape
    Dv = v.shape[2]
    index = q.get_device()
    lengths = cu_q, cu_k, used
    key = None
    if not dropout_p and variants is None and exprs is None:
        key = call_key if call_key is not None else (
            "varlen", q.shape, q.stride(), k.shape, k.stride(), v.shape, v.stride(), q.dtype,
            index, cu_q.shape, cu_k.shape, used is None, max_q, max_k, mask, align,
            window_left, window_right, scale)
        ctx = _native.device_context(index)
        kept = ctx.kept.get(key)
        addresses = q.data_ptr(), k.data_ptr(), v.data_ptr()
        # (the entry point's key holds the arrays' strides: read in place)
        if kept is not None and not _misaligned(D, Dv, addresses) and (
                call_key is not None or all(t is None or t.is_contiguous() for t in lengths)):
            spec, held, like_q = kept
            out = torch.empty_like(q) if like_q else q.new_empty((Tq, Hq, Dv))
            lse = q.new_empty((Hq, Tq), dtype=torch.float32) if with_lse else None
            ctx.forward(spec, _PACKED.written(held, addresses + (
                out.data_ptr(), 0 if lse is None else lse.data_ptr(), _stream(index),
                cu_q.data_ptr(), cu_k.data_ptr(), 0 if used is None else used.data_ptr())))
            seed, offset = rng or (0, 0)
            return out, lse, seed, offset
    out = q.new_empty((Tq, Hq, Dv))
    lse = q.new_empty((Hq, Tq), dtype=torch.float32) if with_lse else None
    seed, offset = rng or (_philox(q.device, dropout_p) if dropout_p > 0 else (0, 0))
    if out.numel() == 0:
        return out, lse, seed, offset
    if k.shape[0] == 0:  # no sequence has keys: empty sums
        sinks = variants[2] if variants is not None else None
        return out.zero_(), _no_key_lse(lse, sinks) if with_lse else None, seed, offset
    qv, kv, vv = _packed_viewed(q), _packed_viewed(k), _packed_viewed(v)
    ov = _packed_viewed(out)
    cu_q, cu_k = cu_q.contiguous(), cu_k.contiguous()
    used = used.contiguous() if used is not None else None
    flags, values, _keep = _variants(variants)
    _keep_aux, aux = _aux_fields(exprs)
    spec = _spec(q.dtype, D, mask, dropout_p > 0, 0, 0, 0, 0, varlen=True, flags=flags,
                 exprs=_spec_exprs(exprs), head_dim_v=Dv)
    args = _packed_call(qv, kv, vv, ov, lse, cu_q, cu_k, used, max_q, max_k, mask, align,
                        window_left, window_right, dropout_p, scale, seed, offset, values, aux)
    ctx = _native.device_context(index)
    ctx.forward(spec, args)
    if key is not None and [t.data_ptr() for t in (qv[0], kv[0], vv[0])] == list(addresses) \
            and all(a is b for a, b in zip((cu_q, cu_k, used), lengths)):  # each read in place
        ctx.keep(key, (spec, _PACKED.kept(args), _like(q, out)))
    return out, lse, seed, offset


def run_varlen_backward(d_out, q, k, v, out, lse, cu_q, cu_k, used, max_q, max_k, seed, offset,
                        mask, align, window_left, window_right, dropout_p, scale, deterministic,
                        variants=None, exprs=None, aux_grads=0):
    """dq, dk, dv of a packed forward call (rows that no sequence sees get
    zeros), and the sinks' gradient (Hq,) fp32 (None without sinks); with
    exprs also the aux tensors' gradients (as run_backward's)."""
    dq, dk, dv = (torch.empty(t.shape, dtype=t.dtype, device=t.device) for t in (q, k, v))
    d_sinks = _d_sinks(variants, q.device)
    d_aux = _d_aux(exprs, aux_grads)
    more = (d_aux,) if exprs is not None else ()
    if dq.numel() == 0 or dk.numel() == 0:
        return (dq.zero_(), dk.zero_(), dv.zero_(),
                d_sinks.zero_() if d_sinks is not None else None) + \
            ((_zeroed(d_aux),) if more else ())
    viewed = [_packed_viewed(t) for t in (q, k, v, out, d_out, dq, dk, dv)]
    cu_q, cu_k = cu_q.contiguous(), cu_k.contiguous()
    used = used.contiguous() if used is not None else None
    flags, values, _keep = _variants(variants)
    _keep_aux, aux = _aux_fields(exprs)
    spec = _spec(q.dtype, q.shape[2], mask, dropout_p > 0, 0, 0, 0, 0, varlen=True, flags=flags,
                 exprs=_spec_exprs(exprs), head_dim_v=v.shape[2])
    fwd = _packed_call(*viewed[:4], lse.contiguous(), cu_q, cu_k, used, max_q, max_k, mask, align,
                       window_left, window_right, dropout_p, scale, seed, offset, values, aux)
    grads = [view for _, view in viewed[4:]]
    _backward_call(q.device, spec, fwd, grads, deterministic, d_sinks, d_aux)
    return (dq, dk, dv, d_sinks) + more


@_custom_op("flashgen::varlen_forward")
def varlen_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
                   cu_seqlens_k: torch.Tensor, seqused_k: Optional[torch.Tensor],
                   max_seqlen_q: int, max_seqlen_k: int, mask: int, align: int, window_left: int,
                   window_right: int, dropout_p: float, scale: float, deterministic: bool,
                   softcap: float = 0.0, alibi_slopes: Optional[torch.Tensor] = None,
                   sinks: Optional[torch.Tensor] = None, score_mod: str = "",
                   mask_mod: str = "", aux_names: str = "",
                   aux: Optional[list[torch.Tensor]] = None
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    out, lse, seed, offset = run_varlen_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k,
                                                max_seqlen_q, max_seqlen_k, mask, align,
                                                window_left, window_right, dropout_p, scale,
                                                variants=(softcap, alibi_slopes, sinks),
                                                exprs=_op_exprs(score_mod, mask_mod, aux_names,
                                                                aux))
    return out, lse, _rng_tensor(seed, offset)


@varlen_forward.register_fake
def _(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k, mask, align,
      window_left, window_right, dropout_p, scale, deterministic, softcap=0.0, alibi_slopes=None,
      sinks=None, score_mod="", mask_mod="", aux_names="", aux=None):
    _fake_check(score_mod, mask_mod, aux_names, aux)
    Tq, Hq, _ = q.shape
    return (q.new_empty((Tq, Hq, v.shape[2])), q.new_empty((Hq, Tq), dtype=torch.float32),
            torch.empty(2, dtype=torch.int64))


def varlen(q, k, v, cu_q, cu_k, used, max_q, max_k, options, deterministic, variants=None,
           exprs=None, with_lse=True, call_key=None):
    """(out, lse) of a packed call: called directly where no gradient is
    wanted and the operator would only add its overhead, else the operator
    (autograd, tracing); lse may be None when with_lse is false. options:
    (mask, align, window_left, window_right, dropout_p, scale); variants
    and exprs as attention()'s; call_key: as run_varlen_forward's."""
    softcap, alibi_slopes, sinks = variants if variants is not None else (0.0, None, None)
    aux = tuple(exprs[3] or ()) if exprs is not None else ()
    grads = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad
                                         or (sinks is not None and sinks.requires_grad)
                                         or _aux_grads(exprs))
    if not grads and eager_ok(q, k, v, cu_q, cu_k, used, alibi_slopes, sinks, *aux):
        out, lse, _, _ = run_varlen_forward(q, k, v, cu_q, cu_k, used, max_q, max_k, *options,
                                            variants=variants, exprs=exprs, with_lse=with_lse,
                                            call_key=call_key)
        return out, lse
    tail = ()
    if exprs is not None:
        tail = (softcap, alibi_slopes, sinks) + _exprs_args(exprs)
    elif variants is not None:
        tail = variants
    out, lse, _ = varlen_forward(q, k, v, cu_q, cu_k, used, max_q, max_k, *options,
                                 bool(deterministic), *tail)
    return out, lse


@_custom_op("flashgen::varlen_backward")
def varlen_backward(d_out: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    out: torch.Tensor, lse: torch.Tensor, rng: torch.Tensor,
                    cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor,
                    seqused_k: Optional[torch.Tensor], max_seqlen_q: int, max_seqlen_k: int,
                    mask: int, align: int, window_left: int, window_right: int, dropout_p: float,
                    scale: float, deterministic: bool, softcap: float = 0.0,
                    alibi_slopes: Optional[torch.Tensor] = None,
                    sinks: Optional[torch.Tensor] = None, score_mod: str = "",
                    mask_mod: str = "", aux_names: str = "",
                    aux: Optional[list[torch.Tensor]] = None, aux_grads: int = 0
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                               list[torch.Tensor]]:
    seed, offset = _rng_values(rng)
    dq, dk, dv, d_sinks, *d_aux = run_varlen_backward(
        d_out, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q,
        max_seqlen_k, seed, offset, mask, align, window_left, window_right, dropout_p, scale,
        deterministic, variants=(softcap, alibi_slopes, sinks),
        exprs=_op_exprs(score_mod, mask_mod, aux_names, aux), aux_grads=aux_grads)
    return (dq, dk, dv, d_sinks if d_sinks is not None else _no_sinks_grad(q),
            _d_aux_out(q, aux, d_aux[0] if d_aux else None))


@varlen_backward.register_fake
def _(d_out, q, k, v, out, lse, rng, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q,
      max_seqlen_k, mask, align, window_left, window_right, dropout_p, scale, deterministic,
      softcap=0.0, alibi_slopes=None, sinks=None, score_mod="", mask_mod="", aux_names="",
      aux=None, aux_grads=0):
    _fake_check(score_mod, mask_mod, aux_names, aux)
    return (q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape),
            _fake_d_sinks(q, sinks), _fake_d_aux(q, score_mod, aux, aux_grads))


def _varlen_setup_context(ctx, inputs, output):
    q, k, v, cu_q, cu_k, used, *options = inputs
    options = _with_defaults(options, 9)
    out, lse, rng = output
    variants, exprs = options[-_TAIL:-_EXPRS], options[-_EXPRS:]
    aux = _save_exprs(ctx, exprs)
    ctx.save_for_backward(q, k, v, out, lse, rng, cu_q, cu_k, used, variants[1], variants[2],
                          *aux)
    ctx.sinks_grad = variants[2] is not None and variants[2].requires_grad
    ctx.options = options[:-_TAIL]
    ctx.softcap = variants[0]
    ctx.mark_non_differentiable(lse, rng)


def _varlen_backward(ctx, d_out, _d_lse, _d_rng):
    q, k, v, out, lse, rng, cu_q, cu_k, used, alibi_slopes, sinks, *aux = ctx.saved_tensors
    dq, dk, dv, d_sinks, d_aux = varlen_backward(d_out.contiguous(), q, k, v, out, lse, rng,
                                                 cu_q, cu_k, used, *ctx.options, ctx.softcap,
                                                 alibi_slopes, sinks, *ctx.exprs,
                                                 None if ctx.aux_none else aux, ctx.aux_grads)
    d_sinks = d_sinks if ctx.sinks_grad else None
    grads = (dq, dk, dv) + (None,) * (3 + len(ctx.options) + 2) + (
        d_sinks, None, None, None, _aux_grad_list(ctx, d_aux))
    return grads[:len(ctx.needs_input_grad)]  # one for each argument the call passed


varlen_forward.register_autograd(_varlen_backward, setup_context=_varlen_setup_context)


# ---- decoding steps over a KV cache (flashgen.attention_with_kvcache) ---------
# q (B, Sq, Hq, D); the cache k_cache, v_cache (B, S_cache, Hkv, D), or pages
# (num_pages, page_size, Hkv, D) with block_table (B, max_pages); k_new,
# v_new (B, S_new, Hkv, D) are written into the cache first. No backward.

def _cache_view(name, t):
    """The cache's view: it is written in place and large, so never copied."""
    view = _view(t)
    if view is None:
        raise ValueError(f"{name}: strides {tuple(t.stride())} at {t.data_ptr():#x}; the cache "
                         "is read and written in place: its head dim must be contiguous and, "
                         "for head dims that are multiples of 8, its rows 16-byte aligned")
    return view


def run_kvcache_forward(q, k_cache, v_cache, k_new, v_new, cache_seqlens, block_table, mask,
                        align, window_left, window_right, scale, num_splits, variants=None,
                        exprs=None, with_lse=True, latent_dv=None, call_key=None,
                        heads_first=False):
    """out (B, Sq, Hq, Dv) and lse (B, Hq, Sq) of one decoding step (None
    unless with_lse: the kernel then skips it); variants: (softcap,
    alibi_slopes, sinks) or None; exprs: (score_mod, mask_mod, aux_names,
    aux) or None. latent_dv: a latent cache (k_cache alone, V its first
    latent_dv columns; v_cache and v_new None). call_key: the entry point's
    key of the call's checks, which holds all the kept struct depends on
    (None: built here). heads_first: q, the caches, k_new and v_new with
    their dimensions 1 and 2 swapped, and so is out (as run_forward's)."""
    B, Sq, Hq, D = _bshd(q.shape, heads_first)
    Hkv, Dv = k_cache.shape[1 if heads_first else 2], latent_dv or v_cache.shape[3]
    index = q.get_device()
    key = None
    if variants is None and exprs is None:  # a step like an earlier one: _STEP
        key = call_key if call_key is not None else (
            "step", q.shape, q.stride(), k_cache.shape, k_cache.stride(), _layout(v_cache),
            latent_dv, _layout(k_new), _layout(v_new), _layout(cache_seqlens),
            _layout(block_table), q.dtype, index, mask, align, window_left, window_right,
            scale, num_splits, heads_first)
        ctx = _native.device_context(index)
        kept = ctx.kept.get(key)
        if kept is not None:
            addresses = (q.data_ptr(), k_cache.data_ptr(),
                         0 if v_cache is None else v_cache.data_ptr(),
                         0 if k_new is None else k_new.data_ptr(),
                         0 if v_new is None else v_new.data_ptr())
            # (any of them off 16 bytes, with rows of 16-byte pieces: the full road copies)
            if D % 8 or not (addresses[0] | addresses[1] | addresses[2] | addresses[3] |
                             addresses[4]) % 16:
                spec, held, need, like_q = kept
                out = torch.empty_like(q) if like_q else _new_out(q, B, Sq, Hq, Dv, heads_first)
                lse = q.new_empty((B, Hq, Sq), dtype=torch.float32) if with_lse else None
                stream = _stream(index)
                workspace, counters = _step_workspace(q, index, stream, need, B * Hq * Sq)
                ctx.forward(spec, _STEP.written(held, addresses[:3] + (
                    out.data_ptr(), 0 if lse is None else lse.data_ptr(), stream,
                    0 if cache_seqlens is None else cache_seqlens.data_ptr(),
                    0 if block_table is None else block_table.data_ptr(), *addresses[3:],
                    0 if workspace is None else workspace.data_ptr(),
                    0 if counters is None else counters.data_ptr())))
                return out, lse
    out = _new_out(q, B, Sq, Hq, Dv, heads_first)
    lse = q.new_empty((B, Hq, Sq), dtype=torch.float32) if with_lse else None
    if out.numel() == 0:
        return out, lse
    lse_data = lse.data_ptr() if with_lse else 0
    given = q
    if heads_first:
        q, k_cache, v_cache, k_new, v_new = (None if t is None else t.transpose(1, 2)
                                             for t in (q, k_cache, v_cache, k_new, v_new))
    inputs = q, k_new, v_new, cache_seqlens, block_table
    qv = _viewed(q)
    ov = out, (out.data_ptr(), Sq * Hq * Dv if B > 1 else 0, Hq * Dv if Sq > 1 else 0,
               Dv if Hq > 1 else 0)
    kc = _cache_view("k_cache", k_cache)
    vc = (0, 0, 0, 0) if latent_dv else _cache_view("v_cache", v_cache)
    if block_table is not None:
        block_table = block_table.contiguous()
        page_size, pages = k_cache.shape[1], block_table.shape[1]
        table = (block_table.data_ptr(), pages, page_size, k_cache.shape[0])
        seqlen_k = pages * page_size
    else:
        table, seqlen_k = (0, 0, 0, 0), k_cache.shape[1]
    new = (0, 0, 0, 0), (0, 0, 0, 0), 0
    if k_new is not None:
        k_new, kn = _viewed(k_new)
        v_new, vn = _viewed(v_new) if v_new is not None else (None, (0, 0, 0, 0))
        new = kn, vn, k_new.shape[1]
    used = cache_seqlens.contiguous() if cache_seqlens is not None else None
    cache = (used.data_ptr() if used is not None else 0, *table, *new, num_splits, 0, 0, 0)
    flags, values, _keep = _variants(variants)
    _keep_aux, aux = _aux_fields(exprs)
    spec = _spec(q.dtype, D, mask, False, 0, 0, 0, 0, kv_cache=_KV_LATENT if latent_dv else 1,
                 flags=flags, exprs=_spec_exprs(exprs), head_dim_v=Dv)
    stream = _stream(index)
    args = _native.forward_args(qv[1], kc, vc, ov[1], lse_data, B, Hq, Hkv, Sq, seqlen_k, scale,
                                align, window_left, window_right, 0.0, 0, 0, 0, stream,
                                cache=cache, variants=values, aux=aux)
    ctx = _native.device_context(index)
    # the split-KV workspace: a function of the kernel and the call's sizes
    need = ctx.forward_workspace_size(spec, args, (B, Hq, Hkv, Sq, seqlen_k, new[2], num_splits,
                                                   block_table is not None))
    workspace, counters = _step_workspace(q, index, stream, need, B * Hq * Sq)
    if need:
        args.workspace, args.workspace_bytes = workspace.data_ptr(), need
    if counters is not None:
        args.split_counters = counters.data_ptr()
    ctx.forward(spec, args)
    in_place = all(a is b for a, b in zip(inputs, (qv[0], k_new, v_new, used, block_table)))
    if key is not None and in_place:
        ctx.keep(key, (spec, _STEP.kept(args), need, _like(given, out)))
    return out, lse


def _layout(t):
    """What an optional tensor's struct fields depend on."""
    return None if t is None else (t.shape, t.stride(), t.dtype)


def kvcache(q, k_cache, v_cache, k_new, v_new, cache_seqlens, block_table, mask, align,
            window_left, window_right, scale, num_splits, variants=None, exprs=None,
            with_lse=True, call_key=None, heads_first=False):
    """(out, lse) of one decoding step: called directly where the operator
    would only add its overhead (there is no gradient), else the operator;
    lse may be None when with_lse is false. call_key: as run_kvcache_forward's;
    heads_first: q, the caches, k_new and v_new (and out) with their
    dimensions 1 and 2 swapped."""
    args = (q, k_cache, v_cache, k_new, v_new, cache_seqlens, block_table, mask, align,
            window_left, window_right, scale, num_splits)
    values = variants if variants is not None else (0.0, None, None)
    aux = tuple(exprs[3] or ()) if exprs is not None else ()
    if eager_ok(q, k_cache, v_cache, values[1], values[2], *aux):
        return run_kvcache_forward(*args, variants=variants, exprs=exprs, with_lse=with_lse,
                                   call_key=call_key, heads_first=heads_first)
    if heads_first:
        args = tuple(None if t is None else t.transpose(1, 2) for t in args[:5]) + args[5:]
    if variants is None and exprs is None:
        out, lse = kvcache_forward(*args)
    else:
        out, lse = kvcache_forward(*args, *values, *_exprs_args(exprs))
    return (out.transpose(1, 2) if heads_first else out), lse


@_custom_op("flashgen::kvcache_forward", mutates_args=("k_cache", "v_cache"))
def kvcache_forward(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                    k_new: Optional[torch.Tensor], v_new: Optional[torch.Tensor],
                    cache_seqlens: Optional[torch.Tensor], block_table: Optional[torch.Tensor],
                    mask: int, align: int, window_left: int, window_right: int, scale: float,
                    num_splits: int, softcap: float = 0.0,
                    alibi_slopes: Optional[torch.Tensor] = None,
                    sinks: Optional[torch.Tensor] = None, score_mod: str = "",
                    mask_mod: str = "", aux_names: str = "",
                    aux: Optional[list[torch.Tensor]] = None
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    return run_kvcache_forward(q, k_cache, v_cache, k_new, v_new, cache_seqlens, block_table,
                               mask, align, window_left, window_right, scale, num_splits,
                               variants=(softcap, alibi_slopes, sinks),
                               exprs=_op_exprs(score_mod, mask_mod, aux_names, aux))


@kvcache_forward.register_fake
def _(q, k_cache, v_cache, k_new, v_new, cache_seqlens, block_table, mask, align, window_left,
      window_right, scale, num_splits, softcap=0.0, alibi_slopes=None, sinks=None, score_mod="",
      mask_mod="", aux_names="", aux=None):
    _fake_check(score_mod, mask_mod, aux_names, aux)
    B, Sq, Hq, _ = q.shape
    return (q.new_empty((B, Sq, Hq, v_cache.shape[3])),
            q.new_empty((B, Hq, Sq), dtype=torch.float32))


def mla(q, kv_cache, cache_seqlens, block_table, mask, align, window_left, window_right, scale,
        num_splits, head_dim_v, with_lse=True):
    """(out, lse) of one decoding step over a latent cache (V the cache's
    first head_dim_v columns): called directly where the operator would only
    add its overhead, else the operator; lse may be None when with_lse is
    false."""
    args = (q, kv_cache, cache_seqlens, block_table, mask, align, window_left, window_right,
            scale, num_splits, head_dim_v)
    if eager_ok(q, kv_cache, kv_cache, cache_seqlens, block_table):
        return run_kvcache_forward(q, kv_cache, None, None, None, *args[2:-1], with_lse=with_lse,
                                   latent_dv=head_dim_v)
    return mla_forward(*args)


@_custom_op("flashgen::mla_forward")
def mla_forward(q: torch.Tensor, kv_cache: torch.Tensor, cache_seqlens: Optional[torch.Tensor],
                block_table: Optional[torch.Tensor], mask: int, align: int, window_left: int,
                window_right: int, scale: float, num_splits: int, head_dim_v: int
                ) -> tuple[torch.Tensor, torch.Tensor]:
    return run_kvcache_forward(q, kv_cache, None, None, None, cache_seqlens, block_table, mask,
                               align, window_left, window_right, scale, num_splits,
                               latent_dv=head_dim_v)


@mla_forward.register_fake
def _(q, kv_cache, cache_seqlens, block_table, mask, align, window_left, window_right, scale,
      num_splits, head_dim_v):
    B, Sq, Hq, _ = q.shape
    return (q.new_empty((B, Sq, Hq, head_dim_v)),
            q.new_empty((B, Hq, Sq), dtype=torch.float32))

"""The C library through ctypes: its structs, its calls, and contexts.

The library is found at $FLASHGEN_LIBRARY when set (a build tree's
libflashgen.so), else lib/libflashgen.so inside this package (the wheel's
copy, next to the Lua library it needs). Nothing here imports torch: plans,
sources and compiles for a named target work on a machine with no GPU.

ctypes rather than a compiled extension: the only binary is the C library,
whose ABI is C's, so one wheel serves every Python 3 and every PyTorch."""
import ctypes
import glob
import logging
import os
import struct
import sys
import threading
from ctypes import (POINTER, byref, c_char, c_char_p, c_double, c_float, c_int, c_int64,
                    c_size_t, c_uint8, c_uint64, c_void_p)

log = logging.getLogger("flashgen")

_HERE = os.path.dirname(os.path.abspath(__file__))


def library_path():
    return os.environ.get("FLASHGEN_LIBRARY") or os.path.join(_HERE, "lib", "libflashgen.so")


def nvrtc_dirs():
    """Folders of the NVIDIA pip packages' NVRTC on sys.path: CUDA 13's
    nvidia-cuda-nvrtc (nvidia/cu13/lib), CUDA 12's nvidia-cuda-nvrtc-cu12
    (nvidia/cuda_nvrtc/lib)."""
    found = []
    for entry in sys.path:
        for sub in ("nvidia/cu13/lib", "nvidia/cuda_nvrtc/lib"):
            d = os.path.join(entry or ".", sub)
            if glob.glob(os.path.join(d, "libnvrtc.so.*")) and d not in found:
                found.append(os.path.abspath(d))
    return found


def _extend_nvrtc_path():
    # The C library reads FLASHGEN_NVRTC_PATH when it first loads NVRTC; the
    # pip folders go after whatever the user put there.
    dirs = [d for d in os.environ.get("FLASHGEN_NVRTC_PATH", "").split(":") if d]
    dirs += [d for d in nvrtc_dirs() if d not in dirs]
    if dirs:
        os.environ["FLASHGEN_NVRTC_PATH"] = ":".join(dirs)


_extend_nvrtc_path()
_lib = ctypes.CDLL(library_path())

# ---- enums (include/flashgen.h) ----------------------------------------------

STATUS_NAMES = ["ok", "invalid argument", "unsupported", "no device", "cuda", "compile",
                "template", "cache", "out of memory", "internal"]
DTYPES = {"fp16": 0, "bf16": 1}
MASKS = {"none": 0, "causal": 1, "window": 2}
SPARSITIES = {"none": 0, "layout": 1, "butterfly": 2}
ALIGNS = {"bottom-right": 0, "top-left": 1}
PASSES = {"forward": 0, "backward": 1, "block_mask": 2}
AUX_TYPES = {"float32": 0, "int32": 1}
MAX_AUX = 8  # FG_MAX_AUX


class Error(RuntimeError):
    """A call of the C library failed; .status names why (STATUS_NAMES)."""

    def __init__(self, status, message):
        self.status = STATUS_NAMES[status] if 0 <= status < len(STATUS_NAMES) else str(status)
        super().__init__(message or self.status)


class InvalidArgument(Error, ValueError):
    pass


class Unsupported(Error, NotImplementedError):
    pass


class NoDevice(Error):
    pass


def error(status, message):
    cls = {1: InvalidArgument, 2: Unsupported, 3: NoDevice}.get(status, Error)
    return cls(status, message)


# ---- structs (include/flashgen.h; tests compare their layout with C's) ------

class AuxDecl(ctypes.Structure):
    _fields_ = [("name", c_char_p), ("type", c_int), ("rank", c_int)]


class Spec(ctypes.Structure):
    _fields_ = [("dtype", c_int), ("head_dim", c_int), ("mask", c_int), ("dropout", c_int),
                ("sparsity", c_int), ("sparse_block_q", c_int), ("sparse_block_k", c_int),
                ("butterfly_factors", c_int), ("varlen", c_int), ("kv_cache", c_int),
                ("softcap", c_int), ("alibi", c_int), ("sinks", c_int), ("head_dim_v", c_int),
                ("score_mod", c_char_p), ("mask_mod", c_char_p), ("aux_count", c_int),
                ("aux", AuxDecl * MAX_AUX)]


class Tensor(ctypes.Structure):
    _fields_ = [("data", c_void_p), ("stride_batch", c_int64), ("stride_seq", c_int64),
                ("stride_head", c_int64), ("stride_dim", c_int64)]


class AuxTensor(ctypes.Structure):
    _fields_ = [("data", c_void_p), ("size", c_int64 * 3), ("stride", c_int64 * 3)]


class ForwardArgs(ctypes.Structure):
    _fields_ = [("q", Tensor), ("k", Tensor), ("v", Tensor), ("o", Tensor), ("lse", c_void_p),
                ("batch", c_int), ("heads_q", c_int), ("heads_kv", c_int), ("seqlen_q", c_int),
                ("seqlen_k", c_int), ("softmax_scale", c_float), ("align", c_int),
                ("window_left", c_int), ("window_right", c_int), ("dropout_p", c_float),
                ("seed", c_uint64), ("offset", c_uint64), ("layout", c_void_p),
                ("stream", c_void_p), ("cu_seqlens_q", c_void_p), ("cu_seqlens_k", c_void_p),
                ("seqused_k", c_void_p), ("total_q", c_int), ("total_k", c_int),
                ("cache_seqlens", c_void_p), ("block_table", c_void_p),
                ("block_table_stride", c_int), ("page_size", c_int), ("num_pages", c_int),
                ("k_new", Tensor), ("v_new", Tensor), ("seqlen_new", c_int),
                ("num_splits", c_int), ("workspace", c_void_p), ("workspace_bytes", c_size_t),
                ("split_counters", c_void_p), ("position_q", c_int64), ("position_k", c_int64),
                ("softcap", c_float), ("alibi_slopes", c_void_p), ("alibi_stride_batch", c_int64), ("sinks", c_void_p),
                ("aux", AuxTensor * MAX_AUX)]


class BackwardArgs(ctypes.Structure):
    _fields_ = [("forward", ForwardArgs), ("d_o", Tensor), ("d_q", Tensor), ("d_k", Tensor),
                ("d_v", Tensor), ("deterministic", c_int), ("workspace", c_void_p),
                ("workspace_bytes", c_size_t), ("d_sinks", c_void_p),
                ("d_aux", c_void_p * MAX_AUX)]


class PlanInfo(ctypes.Structure):
    _fields_ = [("block_m", c_int), ("block_n", c_int), ("warps", c_int), ("stages", c_int),
                ("head_dim_padded", c_int), ("smem_bytes", c_int), ("threads", c_int),
                ("kernel_name", c_char * 128), ("why", c_char * 1024)]


class KernelInfo(ctypes.Structure):
    _fields_ = [("plan", PlanInfo), ("registers", c_int), ("spill_bytes", c_int),
                ("stack_bytes", c_int), ("smem_static", c_int), ("compile_ms", c_double),
                ("from_cache", c_int), ("cache_path", c_char * 512)]


class TuneReport(ctypes.Structure):
    _fields_ = [("seqlen_bucket", c_int), ("candidates", c_int), ("chosen_is_derived", c_int),
                ("derived", PlanInfo), ("chosen", PlanInfo), ("derived_ms", c_double),
                ("chosen_ms", c_double), ("spread", c_double), ("persisted", c_int)]


# The argument structs packed in one call (struct.pack_into) rather than field
# by field: a call's host time is mostly spent building them. A tensor is
# (data, stride_batch, stride_seq, stride_head) with stride_dim 1.
_TENSOR = "Qqqqq"
_AUX = "Q3q3q"  # data, size[3], stride[3]
_FORWARD = struct.Struct("=" + _TENSOR * 4 + "Q5if3ifQQQQQQQii" + "QQ3i4x" + _TENSOR * 2 +
                         "iiQQQqq" + "f4xQqQ" + _AUX * MAX_AUX)
_BACKWARD_TAIL = struct.Struct("=" + _TENSOR * 4 + "i4xQQQ" + "Q" * MAX_AUX)  # after the forward's
assert _FORWARD.size == ctypes.sizeof(ForwardArgs) == BackwardArgs.d_o.offset
assert _FORWARD.size + _BACKWARD_TAIL.size == ctypes.sizeof(BackwardArgs)


_NO_TENSOR = (0, 0, 0, 0)
_NO_CACHE = (0, 0, 0, 0, 0, _NO_TENSOR, _NO_TENSOR, 0, 0, 0, 0, 0)
_NO_VARIANTS = (0.0, 0, 0, 0)
_NO_AUX = (0, 0, 0, 0, 0, 0, 0)


def _aux_fields(aux):
    """The aux tensors' fields, flat: (data, (size...), (stride...)) each,
    sizes and strides up to 3 (the rest 0), padded to MAX_AUX."""
    if len(aux) > MAX_AUX:
        raise ValueError(f"aux: {len(aux)} tensors; at most {MAX_AUX}")
    flat = []
    for data, size, stride in aux:
        flat.append(data)
        flat.extend(size)
        flat.extend((0,) * (3 - len(size)))
        flat.extend(stride)
        flat.extend((0,) * (3 - len(stride)))
    flat.extend(_NO_AUX * (MAX_AUX - len(aux)))
    return flat


def forward_args(q, k, v, o, lse, batch, heads_q, heads_kv, seqlen_q, seqlen_k, scale, align,
                 window_left, window_right, dropout_p, seed, offset, layout, stream,
                 packed=(0, 0, 0, 0, 0), cache=_NO_CACHE, positions=(0, 0),
                 variants=_NO_VARIANTS, aux=()):
    """ForwardArgs; q, k, v, o are (data, stride_batch, stride_seq,
    stride_head) tuples, lse, layout and stream addresses (0 for none);
    packed: (cu_seqlens_q, cu_seqlens_k, seqused_k, total_q, total_k), the
    arrays' addresses; cache: (cache_seqlens, block_table,
    block_table_stride, page_size, num_pages, k_new, v_new, seqlen_new,
    num_splits, workspace, workspace_bytes, split_counters), k_new and
    v_new tuples as q;
    positions: (position_q, position_k); variants: (softcap,
    alibi_slopes, alibi_stride_batch, sinks), the arrays' addresses (0.0
    and 0s: none); aux: the expressions' tensors in the spec's order,
    (data, sizes, strides) each, sizes and strides in elements."""
    args = ForwardArgs()
    (cache_seqlens, table, table_stride, page_size, num_pages, k_new, v_new, seqlen_new,
     splits, workspace, workspace_bytes, split_counters) = cache
    _FORWARD.pack_into(args, 0, *q, 1, *k, 1, *v, 1, *o, 1, lse, batch, heads_q, heads_kv,
                       seqlen_q, seqlen_k, scale, align, window_left, window_right, dropout_p,
                       seed, offset, layout or 0, stream or 0, *packed, cache_seqlens, table,
                       table_stride, page_size, num_pages, *k_new, int(k_new[0] != 0), *v_new,
                       int(v_new[0] != 0), seqlen_new, splits, workspace, workspace_bytes,
                       split_counters,
                       *positions, *variants, *_aux_fields(aux))
    return args


def backward_args(forward, d_o, d_q, d_k, d_v, deterministic, workspace, workspace_bytes,
                  d_sinks=0, d_aux=()):
    """BackwardArgs around a ForwardArgs; tensors as in forward_args; d_sinks
    the address of the sinks' gradient (0: not computed); d_aux the
    addresses of the aux tensors' gradients, in the spec's order (0: not
    computed)."""
    args = BackwardArgs()
    args.forward = forward
    d_aux = tuple(d_aux) + (0,) * (MAX_AUX - len(d_aux))
    _BACKWARD_TAIL.pack_into(args, _FORWARD.size, *d_o, 1, *d_q, 1, *d_k, 1, *d_v, 1,
                             int(deterministic), workspace or 0, workspace_bytes, d_sinks, *d_aux)
    return args


COMPILE_LOG_FN = ctypes.CFUNCTYPE(None, c_char_p, c_void_p)

_SIGNATURES = {
    "fg_status_name": (c_char_p, [c_int]),
    "fg_version": (c_char_p, []),
    "fg_context_create": (c_int, [POINTER(c_void_p), c_char_p]),
    "fg_context_destroy": (None, [c_void_p]),
    "fg_context_message": (c_char_p, [c_void_p]),
    "fg_last_message": (c_char_p, []),
    "fg_context_target": (c_char_p, [c_void_p]),
    "fg_context_arch": (c_int, [c_void_p]),
    "fg_context_set_compile_log": (None, [c_void_p, COMPILE_LOG_FN, c_void_p]),
    "fg_context_add_bundle": (c_int, [c_void_p, c_char_p]),
    "fg_context_set_tuning": (None, [c_void_p, c_int]),
    "fg_layout_create": (c_int, [c_void_p, POINTER(c_uint8), c_int, c_int, c_int,
                                 POINTER(c_void_p)]),
    "fg_layout_destroy": (None, [c_void_p]),
    "fg_block_mask_create": (c_int, [c_void_p, POINTER(Spec), POINTER(ForwardArgs),
                                     POINTER(c_void_p)]),
    "fg_forward": (c_int, [c_void_p, POINTER(Spec), POINTER(ForwardArgs)]),
    "fg_forward_workspace_size": (c_int, [c_void_p, POINTER(Spec), POINTER(ForwardArgs),
                                          POINTER(c_size_t)]),
    "fg_backward_workspace_size": (c_int, [c_void_p, POINTER(Spec), POINTER(BackwardArgs),
                                           POINTER(c_size_t)]),
    "fg_backward": (c_int, [c_void_p, POINTER(Spec), POINTER(BackwardArgs)]),
    "fg_plan": (c_int, [c_void_p, POINTER(Spec), c_int, POINTER(PlanInfo)]),
    "fg_source": (c_int, [c_void_p, POINTER(Spec), c_int, POINTER(c_char_p)]),
    "fg_compile": (c_int, [c_void_p, POINTER(Spec), c_int, POINTER(KernelInfo)]),
    "fg_tune": (c_int, [c_void_p, POINTER(Spec), c_int, c_int, POINTER(TuneReport)]),
    "fg_tuned": (c_int, [c_void_p, POINTER(Spec), c_int, c_int, POINTER(TuneReport),
                         POINTER(c_int)]),
}
for _name, (_res, _args) in _SIGNATURES.items():
    _fn = getattr(_lib, _name)
    _fn.restype, _fn.argtypes = _res, _args


def _text(b):
    return b.decode("utf-8", "replace") if b else ""


def version():
    return _text(_lib.fg_version())


def make_spec(head_dim, dtype="fp16", mask="none", dropout=False, sparsity="none",
              sparse_block=(0, 0), butterfly_factors=0, varlen=False, kv_cache=False,
              softcap=False, alibi=False, sinks=False, score_mod=None, mask_mod=None, aux=(),
              head_dim_v=None):
    """A kernel spec from names: dtype fp16|bf16, mask none|causal|window,
    sparsity none|layout|butterfly with its (query, key) block size; varlen
    for packed sequences, kv_cache for decoding steps; softcap, alibi and
    sinks compile those variants of the scores in (their values are launch
    arguments). score_mod and mask_mod: expression texts
    (docs/expressions.md), None for none; aux: the tensors they read, as
    (name, "float32" or "int32", rank) each. head_dim_v: the value head
    dim (V, O, dO and dV rows), None for head_dim's."""
    def pick(table, what, value):
        if value not in table:
            raise ValueError(f"{what}: {value!r}; valid: {', '.join(table)}")
        return table[value]
    decls = [(name, pick(AUX_TYPES, f"aux {name!r} type", kind), rank)
             for name, kind, rank in aux]
    return expression_spec(
        Spec(pick(DTYPES, "dtype", dtype), int(head_dim), pick(MASKS, "mask", mask),
             int(bool(dropout)), pick(SPARSITIES, "sparsity", sparsity),
             int(sparse_block[0]), int(sparse_block[1]), int(butterfly_factors),
             int(bool(varlen)), int(bool(kv_cache)), int(bool(softcap)), int(bool(alibi)),
             int(bool(sinks)), 0 if head_dim_v is None else int(head_dim_v)),
        score_mod, mask_mod, decls)


def expression_spec(spec, score_mod, mask_mod, decls):
    """spec with its expressions set: texts (None or "" for none) and the aux
    declarations, (name, type id, rank) each. The struct keeps the encoded
    texts alive."""
    if len(decls) > MAX_AUX:
        raise ValueError(f"aux: {len(decls)} tensors; at most {MAX_AUX}")
    spec.score_mod = score_mod.encode() if score_mod else None
    spec.mask_mod = mask_mod.encode() if mask_mod else None
    spec.aux_count = len(decls)
    for i, (name, kind, rank) in enumerate(decls):
        spec.aux[i] = AuxDecl(name.encode(), int(kind), int(rank))
    return spec


def _pass(name):
    if name not in PASSES:
        raise ValueError(f"pass: {name!r}; valid: {', '.join(PASSES)}")
    return PASSES[name]


def _plan_dict(p):
    return {"block_m": p.block_m, "block_n": p.block_n, "warps": p.warps, "stages": p.stages,
            "head_dim_padded": p.head_dim_padded, "smem_bytes": p.smem_bytes,
            "threads": p.threads, "kernel_name": _text(p.kernel_name), "why": _text(p.why)}


def _compile_log(line, _user):
    # the logger is named flashgen already: its records do not say so twice
    text = _text(line)
    log.info("%s", text[len("flashgen: "):] if text.startswith("flashgen: ") else text)


_compile_log_fn = COMPILE_LOG_FN(_compile_log)  # kept alive for the library's lifetime


class Context:
    """One fg_context: a CUDA device ("cuda:N", or None for FLASHGEN_DEVICE's)
    or a named target for offline work ("t4", "a100", "rtx3090", "l4",
    "h100"). Calls are serialized: a context keeps one message and one
    source buffer. Compile lines go to the "flashgen" logger at INFO."""

    def __init__(self, target=None):
        ptr = c_void_p()
        st = _lib.fg_context_create(byref(ptr), target.encode() if target else None)
        if st:
            raise error(st, _text(_lib.fg_last_message()))
        self._ptr = ptr
        self.lock = threading.Lock()
        _lib.fg_context_set_compile_log(ptr, _compile_log_fn, None)
        self.target = _text(_lib.fg_context_target(ptr))
        self.arch = _lib.fg_context_arch(ptr)
        # What a call's shape settles (workspace sizes, argument structs),
        # kept by the callers' keys: the kernel a call takes changes only
        # with tuning and bundles, which clear it
        self.kept = {}

    def __del__(self, destroy=_lib.fg_context_destroy):  # bound now: at exit _lib may be gone
        if getattr(self, "_ptr", None):
            destroy(self._ptr)
            self._ptr = None

    def __repr__(self):
        return f"flashgen.Context({self.target})"

    @property
    def handle(self):
        return self._ptr

    def check(self, status):
        if status:
            raise error(status, _text(_lib.fg_context_message(self._ptr)))

    def plan(self, spec, pass_="forward"):
        info = PlanInfo()
        with self.lock:
            self.check(_lib.fg_plan(self._ptr, byref(spec), _pass(pass_), byref(info)))
        return _plan_dict(info)

    def source(self, spec, pass_="forward"):
        text = c_char_p()
        with self.lock:
            self.check(_lib.fg_source(self._ptr, byref(spec), _pass(pass_), byref(text)))
            return _text(text.value)

    def compile(self, spec, pass_="forward"):
        info = KernelInfo()
        with self.lock:
            self.check(_lib.fg_compile(self._ptr, byref(spec), _pass(pass_), byref(info)))
        return {"plan": _plan_dict(info.plan), "registers": info.registers,
                "spill_bytes": info.spill_bytes, "stack_bytes": info.stack_bytes,
                "smem_static": info.smem_static, "compile_ms": info.compile_ms,
                "from_cache": ["compiled", "disk", "memory", "bundle"][info.from_cache],
                "cache_path": _text(info.cache_path)}

    def add_bundle(self, path):
        with self.lock:
            self.kept.clear()
            self.check(_lib.fg_context_add_bundle(self._ptr, os.fsencode(path)))

    def set_tuning(self, on):
        with self.lock:
            self.kept.clear()
            _lib.fg_context_set_tuning(self._ptr, int(bool(on)))

    def tune(self, spec, pass_, seqlen):
        report = TuneReport()
        with self.lock:
            self.kept.clear()
            self.check(_lib.fg_tune(self._ptr, byref(spec), _pass(pass_), int(seqlen),
                                    byref(report)))
        return _report_dict(report)

    def tuned(self, spec, pass_, seqlen):
        report, found = TuneReport(), c_int()
        with self.lock:
            self.check(_lib.fg_tuned(self._ptr, byref(spec), _pass(pass_), int(seqlen),
                                     byref(report), byref(found)))
        return _report_dict(report) if found.value else None

    def layout(self, mask_bytes, heads, blocks_q, blocks_k):
        """An fg_layout from a (heads, blocks_q, blocks_k) 0/1 byte string."""
        buf = (c_uint8 * len(mask_bytes)).from_buffer_copy(mask_bytes)
        out = c_void_p()
        with self.lock:
            self.check(_lib.fg_layout_create(self._ptr, buf, heads, blocks_q, blocks_k,
                                             byref(out)))
        return out

    def block_mask(self, spec, args):
        """An fg_layout built on the device from spec's mask predicate, for
        calls shaped as args (fg_block_mask_create)."""
        out = c_void_p()
        with self.lock:
            self.check(_lib.fg_block_mask_create(self._ptr, byref(spec), byref(args), byref(out)))
        return out

    def forward(self, spec, args):
        with self.lock:  # ctypes passes the structs by reference (argtypes)
            status = _lib.fg_forward(self._ptr, spec, args)
            if status:
                self.check(status)

    def keep(self, key, value):
        if len(self.kept) > 4096:
            self.kept.clear()
        self.kept[key] = value

    def forward_workspace_size(self, spec, args, sizes=None):
        """sizes: what the size depends on besides spec (the call's sizes),
        to remember it by; None: asked every time."""
        if sizes is not None:  # (a spec is no dict key: by identity, kept alive)
            hit = self.kept.get(("workspace", id(spec), sizes))
            if hit is not None and hit[0] is spec:
                return hit[1]
        n = c_size_t()
        with self.lock:
            self.check(_lib.fg_forward_workspace_size(self._ptr, byref(spec), byref(args),
                                                      byref(n)))
            if sizes is not None:
                self.keep(("workspace", id(spec), sizes), (spec, n.value))
        return n.value

    def backward_workspace_size(self, spec, args):
        n = c_size_t()
        with self.lock:
            self.check(_lib.fg_backward_workspace_size(self._ptr, byref(spec), byref(args),
                                                       byref(n)))
        return n.value

    def backward(self, spec, args):
        with self.lock:
            self.check(_lib.fg_backward(self._ptr, byref(spec), byref(args)))


def _report_dict(r):
    return {"seqlen_bucket": r.seqlen_bucket, "candidates": r.candidates,
            "chosen_is_derived": bool(r.chosen_is_derived), "derived": _plan_dict(r.derived),
            "chosen": _plan_dict(r.chosen), "derived_ms": r.derived_ms, "chosen_ms": r.chosen_ms,
            "spread": r.spread, "persisted": bool(r.persisted)}


def destroy_layout(handle):
    _lib.fg_layout_destroy(handle)


_devices = {}
_bundles = []
_devices_lock = threading.Lock()


def device_context(index):
    """The context of CUDA device `index`, created on first use and kept,
    with every bundle added so far."""
    ctx = _devices.get(index)
    if ctx is None:
        with _devices_lock:
            ctx = _devices.get(index)
            if ctx is None:
                ctx = Context(f"cuda:{index}")
                for path in _bundles:
                    ctx.add_bundle(path)
                _devices[index] = ctx
    return ctx


def add_bundle(path):
    """Add a bundle of precompiled kernels (`flashgen bundle build`) to every
    device context, now and later. Bundles are searched in the order added,
    after those of FLASHGEN_BUNDLE_PATH, before the kernel cache."""
    path = os.fspath(path)
    if not os.path.isfile(os.path.join(path, "manifest.tsv")):
        raise ValueError(f"add_bundle: {path!r} is not a bundle (no manifest.tsv in it)")
    with _devices_lock:
        for ctx in _devices.values():
            ctx.add_bundle(path)
        _bundles.append(path)


_expressions_context = None
_expressions_checked = {}


def check_expressions(score_mod, mask_mod, decls):
    """Parse and type-check expression texts (None or "" for none) against
    their aux declarations ((name, type id, rank) each) through the
    library, with no GPU: an offline context plans a kernel of them. Raises
    InvalidArgument (a ValueError) with the library's message, column
    numbers included. Each distinct set is checked once."""
    global _expressions_context
    key = (score_mod or "", mask_mod or "", tuple(decls))
    if key in _expressions_checked:
        return
    with _devices_lock:
        if _expressions_context is None:
            _expressions_context = Context("a100")
    spec = expression_spec(Spec(DTYPES["fp16"], 64), score_mod, mask_mod, decls)
    try:
        _expressions_context.plan(spec, "forward")
    except InvalidArgument as e:
        message = str(e)
        if message.startswith("spec."):
            message = message[len("spec."):]
        raise InvalidArgument(1, message) from None
    if len(_expressions_checked) > 4096:
        _expressions_checked.clear()
    _expressions_checked[key] = True

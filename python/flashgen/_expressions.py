"""Score and mask modifiers from Python: expression strings, aux tensors and
functions with FlexAttention's signatures, translated into flashgen's
expression language (docs/expressions.md) by tracing.

A function is called once with symbolic stand-ins for its arguments
(score, b, h, q_idx, kv_idx); what it does to them is recorded as text:
arithmetic, comparisons, & | ~ on conditions, torch.where, the math
functions the language has, and reads of the tensors it captures
(bias[h, q_idx - kv_idx]), which become aux tensors named t0, t1, ...
Anything else (Python control flow on the stand-ins, a torch function the
language lacks, a capture of another type, a tensor it makes or reaches
through an attribute) is refused with a ValueError naming it: a
translation is exact or there is none.

Translations are kept per function code and captures (tensors by identity,
shape, strides, dtype and device; numbers by value), so a closure made
anew with the same captures is not traced again."""
import builtins
import collections
import dis
import functools
import inspect
import math
import numbers
import struct
import threading
import types
import weakref
from typing import NamedTuple, Optional

import torch
from torch.overrides import TorchFunctionMode


# ---- the text: precedence levels of the grammar (gen/expr.h) ------------------

_OR, _AND, _CMP, _ADD, _MUL, _UNARY, _ATOM = range(1, 8)
_INT32 = (-(1 << 31), (1 << 31) - 1)


class Untranslatable(ValueError):
    """A score or mask modifier that has no exact translation."""


class Sym:
    """A traced value: its text, its type in the language ("int", "float",
    "bool"), its precedence level, and its Python value when a constant."""

    __slots__ = ("text", "kind", "prec", "const")

    def __init__(self, text, kind, prec=_ATOM, const=None):
        self.text, self.kind, self.prec, self.const = text, kind, prec, const

    def __repr__(self):
        return f"<traced {self.kind}: {self.text}>"

    # -- Python operators
    def __add__(self, o): return _arith("+", self, o)
    def __radd__(self, o): return _arith("+", o, self)
    def __sub__(self, o): return _arith("-", self, o)
    def __rsub__(self, o): return _arith("-", o, self)
    def __mul__(self, o): return _arith("*", self, o)
    def __rmul__(self, o): return _arith("*", o, self)
    def __truediv__(self, o): return _arith("/", self, o)
    def __rtruediv__(self, o): return _arith("/", o, self)
    def __floordiv__(self, o): return _floordiv(self, o)
    def __rfloordiv__(self, o): return _floordiv(o, self)
    def __mod__(self, o): return _mod(self, o)
    def __rmod__(self, o): return _mod(o, self)
    def __pow__(self, o): return _pow(self, o)

    def __rpow__(self, o):
        raise Untranslatable("a number raised to a traced power (x ** score): only integer and "
                             "0.5 powers of a traced value are translated; use torch.exp")

    def __neg__(self): return _neg(self)
    def __pos__(self): return self
    def __abs__(self): return _fn1("abs", self)
    def __lt__(self, o): return _cmp("<", self, o)
    def __le__(self, o): return _cmp("<=", self, o)
    def __gt__(self, o): return _cmp(">", self, o)
    def __ge__(self, o): return _cmp(">=", self, o)
    def __eq__(self, o): return _cmp("==", self, o)  # noqa: E704
    def __ne__(self, o): return _cmp("!=", self, o)
    def __and__(self, o): return _logic("&&", self, o)
    def __rand__(self, o): return _logic("&&", o, self)
    def __or__(self, o): return _logic("||", self, o)
    def __ror__(self, o): return _logic("||", o, self)
    def __xor__(self, o): return _xor(self, o)
    def __rxor__(self, o): return _xor(o, self)
    def __invert__(self): return _not(self)

    __hash__ = object.__hash__

    # -- what has no translation
    def __bool__(self):
        raise Untranslatable(
            f"Python control flow on a traced value ({self.text}): `if`, `and`, `or`, `not`, "
            "min()/max() and bool() need its value, which depends on the query and key; use "
            "torch.where(cond, a, b), & | ~, torch.minimum/torch.maximum")

    def _number(self, what):
        raise Untranslatable(f"{what} of a traced value ({self.text}) needs its value, which "
                             "depends on the query and key (math.* functions take numbers: use "
                             "the torch ones)")

    def __float__(self): self._number("float()")
    def __int__(self): self._number("int()")
    def __index__(self): self._number("using it as a Python index or size (__index__)")
    def __complex__(self): self._number("complex()")
    def __round__(self, n=None): self._number("round()")

    def __len__(self):
        raise Untranslatable(f"len() of a traced value ({self.text}): it is a scalar")

    def __iter__(self):
        raise Untranslatable(f"iterating over a traced value ({self.text}): it is a scalar")

    def __getitem__(self, index):
        raise Untranslatable(f"indexing a traced value ({self.text}): it is a scalar; index the "
                             "captured tensor with it instead")

    def __setitem__(self, index, value):
        raise Untranslatable("assigning into a traced value: modifiers are pure functions")

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        raise Untranslatable(f"{name!r} of a traced value is not translated; {SUPPORTED}")

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        return _torch_call(func, args, kwargs or {})

    # -- what a scalar tensor answers without a value
    @property
    def dtype(self):
        return {"int": torch.int32, "float": torch.float32, "bool": torch.bool}[self.kind]

    @property
    def shape(self):
        return torch.Size([])

    @property
    def device(self):
        return _state().device

    ndim = 0
    requires_grad = False

    def dim(self):
        return 0

    def size(self, dim=None):
        if dim is not None:
            raise Untranslatable("size(dim) of a traced value: it is a scalar")
        return torch.Size([])

    def numel(self):
        return 1

    def is_floating_point(self):
        return self.kind == "float"


class Partial:
    """A captured tensor indexed in fewer dimensions than it has: bias[h] of
    a 2-D bias, waiting for its next index."""

    __slots__ = ("tensor", "indices")

    def __init__(self, tensor, indices):
        self.tensor, self.indices = tensor, indices

    def __getitem__(self, index):
        return _read(self.tensor, self.indices, index)

    def __repr__(self):
        return f"<partial read of a {self.tensor.dim()}-D tensor, {len(self.indices)} indices>"

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        return _torch_call(func, args, kwargs or {})


def _partial_refusal(p):
    return Untranslatable(f"a {p.tensor.dim()}-D captured tensor of shape "
                          f"{tuple(p.tensor.shape)} read with {len(p.indices)} "
                          f"ind{'ex' if len(p.indices) == 1 else 'ices'}: a read takes one index "
                          "per dimension")


def _refuse_partial(self, *args, **kwargs):
    raise _partial_refusal(self)


for _name in ("add", "radd", "sub", "rsub", "mul", "rmul", "truediv", "rtruediv", "floordiv",
              "rfloordiv", "mod", "rmod", "pow", "neg", "abs", "lt", "le", "gt", "ge", "eq",
              "ne", "and", "rand", "or", "ror", "xor", "invert", "bool", "float", "int",
              "index"):
    setattr(Partial, f"__{_name}__", _refuse_partial)
Partial.__hash__ = object.__hash__


# ---- the state of a trace --------------------------------------------------------

class _Trace:
    def __init__(self, captured, reserved, device):
        self.captured = captured  # id -> tensor: what the functions capture
        self.reserved = reserved  # names the caller's aux dict takes
        self.device = device
        self.aux = {}             # id -> (name, tensor), in the order first read
        self.next = 0

    def name_of(self, tensor):
        entry = self.aux.get(id(tensor))
        if entry is None:
            while f"t{self.next}" in self.reserved:
                self.next += 1
            entry = self.aux[id(tensor)] = (f"t{self.next}", tensor)
            self.next += 1
        return entry[0]


_local = threading.local()


def _state():
    trace = getattr(_local, "trace", None)
    if trace is None:
        raise Untranslatable("a traced value used after its trace ended (kept in a global or a "
                             "closure?)")
    return trace


# ---- constants and lifting ---------------------------------------------------------

def _float_text(v):
    if math.isnan(v):
        raise Untranslatable("a NaN constant: the language has none")
    if math.isinf(v):
        return ("inf", _ATOM) if v > 0 else ("-inf", _UNARY)
    try:
        f32 = struct.unpack("f", struct.pack("f", v))[0]
    except OverflowError:
        f32 = math.inf
    if math.isinf(f32):
        raise Untranslatable(f"the constant {v!r} is outside float32's range (kernels compute "
                             "in float32)")
    if v != 0.0 and f32 == 0.0:
        raise Untranslatable(f"the constant {v!r} is 0 in float32 (kernels compute in float32)")
    text = repr(abs(v))
    if "e" in text:
        mant, exp = text.split("e")
        text = f"{mant}e{int(exp)}"
    elif "." not in text:
        text += ".0"
    return ("-" + text, _UNARY) if v < 0 else (text, _ATOM)


def const(v):
    """A Python bool, int or float as a constant."""
    if isinstance(v, bool):
        return Sym("0 == 0" if v else "0 != 0", "bool", _CMP, const=v)
    if isinstance(v, numbers.Integral):
        v = int(v)
        if not _INT32[0] <= v <= _INT32[1]:
            raise Untranslatable(f"the integer constant {v} is outside int32 (the language's ints "
                                 "are 32-bit)")
        return Sym(str(v), "int", _UNARY if v < 0 else _ATOM, const=v)
    if isinstance(v, numbers.Real):
        text, prec = _float_text(float(v))
        return Sym(text, "float", prec, const=float(v))
    raise Untranslatable(f"a constant of type {type(v).__name__} ({v!r}): the language has ints, "
                         "floats and conditions")


def lift(x):
    """x as a Sym: Syms as they are, Python numbers as constants, a captured
    0-D tensor as a read of it."""
    if isinstance(x, Sym):
        return x
    if isinstance(x, Partial):
        raise _partial_refusal(x)
    if isinstance(x, torch.Tensor):
        if x.dim() != 0:
            raise Untranslatable(f"a tensor of shape {tuple(x.shape)} used as a value: index it "
                                 "(bias[h, q_idx - kv_idx]) to read one element")
        if id(x) not in _state().captured:
            # Made in the trace by a factory that torch does not let modes see
            # (torch.tensor(-inf)): every computation on data is refused by the
            # trace's mode, so this is a constant.
            if x.requires_grad:
                raise Untranslatable("a 0-D tensor that requires grad, made in the modifier or "
                                     "reached through an attribute: capture it directly (its "
                                     "gradient is computed only for captures)")
            with torch._C.DisableTorchFunction():
                value = x.item()
            return _literal(value, x.dtype)
        return _read(x, [], ())
    if isinstance(x, (bool, numbers.Real)):
        return const(x)
    raise Untranslatable(f"a value of type {type(x).__name__} ({x!r:.60}) in a modifier")


def _wrap(x, prec):
    return f"({x.text})" if x.prec < prec else x.text


def _as_number(x):
    """A bool used as a number is 0 or 1 (as torch computes it)."""
    if x.kind == "bool":
        if x.const is not None:
            return const(int(x.const))
        return Sym(f"where({x.text}, 1, 0)", "int")
    return x


def _number_kind(*xs):
    return "int" if all(x.kind == "int" for x in xs) else "float"


# ---- operations ------------------------------------------------------------------------

_PREC = {"+": _ADD, "-": _ADD, "*": _MUL, "/": _MUL, "%": _MUL}


def _binary(op, a, b, kind):
    prec = _PREC[op]
    return Sym(f"{_wrap(a, prec)} {op} {_wrap(b, prec + 1)}", kind, prec)


def _arith(op, a, b):
    a, b = _as_number(lift(a)), _as_number(lift(b))
    return _binary(op, a, b, "float" if op == "/" else _number_kind(a, b))


def _neg(x):
    x = _as_number(lift(x))
    if x.const is not None:
        return const(-x.const)
    inner = x.text if x.prec > _UNARY else f"({x.text})"
    return Sym(f"-{inner}", x.kind, _UNARY)


def _mod(a, b):
    """Python's (and torch's) remainder, with the divisor's sign, from the
    language's C remainder; x % 0 is 0 in the language (torch: undefined)."""
    a, b = _as_number(lift(a)), _as_number(lift(b))
    if a.kind != "int" or b.kind != "int":
        raise Untranslatable(f"% of a float ({a.text} % {b.text}): the language's % takes ints; "
                             "for floats write a - torch.floor(a / b) * b")
    r = _binary("%", a, b, "int")
    if b.const is not None and b.const > 0:
        if a.const is not None and a.const >= 0:
            return r
        return _binary("%", _binary("+", r, b, "int"), b, "int")
    return where(_logic("||", _logic("&&", _cmp("<", r, 0), _cmp(">", b, 0)),
                        _logic("&&", _cmp(">", r, 0), _cmp("<", b, 0))), r + b, r)


def _floordiv(a, b):
    a, b = _as_number(lift(a)), _as_number(lift(b))
    if a.kind == "int" and b.kind == "int":  # an int, as PyTorch's (x // 0: 0)
        if a.const is not None and b.const is not None:
            return const(a.const // b.const if b.const else 0)
        return _fn2("floordiv", a, b)
    # of floats PyTorch rounds the exact quotient down, which a rounded
    # division need not give (6 // 1.2 is 4, floor(6 / 1.2) 5): exact only
    # where the division is, by a power of two
    if b.const is None or b.const == 0 or math.frexp(abs(b.const))[0] != 0.5:
        raise Untranslatable(f"{a.text} // {b.text} of floats: PyTorch rounds the exact quotient "
                             "down, a float division may round past it (6 // 1.2 is 4, floor(6 / "
                             "1.2) 5); write torch.floor(x / y), or divide by a power of two")
    return _fn1("floor", _arith("/", a, b))


def _truncdiv(a, b):
    """Ints divided toward zero (rounding_mode="trunc"): floordiv, one up
    where the quotient is negative and not whole."""
    a, b = _as_number(lift(a)), _as_number(lift(b))
    if a.kind != "int" or b.kind != "int":
        _refuse_rounding("trunc")
    down = _floordiv(a, b)
    up = _logic("&&", _cmp("!=", _binary("%", a, b, "int"), 0),
                _cmp("!=", _cmp("<", a, 0), _cmp("<", b, 0)))
    return where(up, _arith("+", down, 1), down)


def _fmod(a, b):
    """torch.fmod: the remainder with the dividend's sign, the language's %
    (ints; x % 0 is 0)."""
    a, b = _as_number(lift(a)), _as_number(lift(b))
    if a.kind != "int" or b.kind != "int":
        raise Untranslatable(f"fmod of a float ({a.text}, {b.text}): the language's % takes ints")
    return _binary("%", a, b, "int")


def _pow(a, e):
    a = _as_number(lift(a))
    if isinstance(e, Sym) or isinstance(e, torch.Tensor):
        raise Untranslatable("a traced exponent (x ** y): only constant integer and 0.5 powers "
                             "are translated; use torch.exp(y * torch.log(x))")
    if isinstance(e, numbers.Integral) and 1 <= int(e) <= 4:
        out = a
        for _ in range(int(e) - 1):
            out = _binary("*", out, a, a.kind)
        return out
    if isinstance(e, numbers.Integral) and int(e) == 0:
        return const(1 if a.kind == "int" else 1.0)
    if isinstance(e, numbers.Integral) and int(e) == -1:
        return _arith("/", 1.0, a)
    if isinstance(e, numbers.Real) and float(e) == 0.5:
        return _fn1("sqrt", a)
    raise Untranslatable(f"x ** {e!r}: only the powers 0..4, -1 and 0.5 are translated")


_CMP_TORCH = {"<": "<", "<=": "<=", ">": ">", ">=": ">=", "==": "==", "!=": "!="}


def _cmp(op, a, b):
    a, b = lift(a), lift(b)
    if a.kind == "bool" and b.kind == "bool" and op in ("==", "!="):
        for x, y in ((a, b), (b, a)):  # against a constant: x itself, or !x
            if y.const is not None:
                return x if (op == "==") == bool(y.const) else _not(x)
        # as ints: each side written once (a && b || !a && !b writes both
        # twice, and nested, past the language's 256 nodes)
        return _cmp(op, where(a, 1, 0), where(b, 1, 0))
    a, b = _as_number(a), _as_number(b)
    if a.const is not None and b.const is not None:
        return const(bool({"<": a.const < b.const, "<=": a.const <= b.const,
                           ">": a.const > b.const, ">=": a.const >= b.const,
                           "==": a.const == b.const, "!=": a.const != b.const}[op]))
    return Sym(f"{_wrap(a, _CMP + 1)} {op} {_wrap(b, _CMP + 1)}", "bool", _CMP)


def _as_bool(x, what):
    x = lift(x)
    if x.kind != "bool":
        raise Untranslatable(f"{what} of a {x.kind} ({x.text}): & | ~ ^ are translated on "
                             "conditions only (the language has no bitwise operations); compare "
                             "first, as (x != 0)")
    return x


def _logic(op, a, b):
    a, b = _as_bool(a, op), _as_bool(b, op)
    absorbing, neutral = (False, True) if op == "&&" else (True, False)
    for x, y in ((a, b), (b, a)):
        if x.const is not None:
            return const(absorbing) if x.const == absorbing else y
    prec = _AND if op == "&&" else _OR
    return Sym(f"{_wrap(a, prec)} {op} {_wrap(b, prec + 1)}", "bool", prec)


def _not(x):
    x = _as_bool(x, "~")
    if x.const is not None:
        return const(not x.const)
    return Sym(f"!{_wrap(x, _UNARY)}", "bool", _UNARY)


def _xor(a, b):
    return _cmp("!=", _as_bool(a, "^"), _as_bool(b, "^"))


def where(cond, a, b):
    cond = lift(cond)
    if cond.kind != "bool":
        raise Untranslatable(f"torch.where's condition is a {cond.kind} ({cond.text}): compare "
                             "first, as (x != 0)")
    a, b = lift(a), lift(b)
    if cond.const is not None:
        return a if cond.const else b
    if a.kind == "bool" and b.kind == "bool":
        return _logic("||", _logic("&&", cond, a), _logic("&&", _not(cond), b))
    a, b = _as_number(a), _as_number(b)
    return Sym(f"where({cond.text}, {a.text}, {b.text})", _number_kind(a, b))


def _fn1(name, x):
    x = _as_number(lift(x))
    kind = x.kind if name == "abs" else "float"
    return Sym(f"{name}({x.text})", kind)


def _fn2(name, a, b):
    a, b = _as_number(lift(a)), _as_number(lift(b))
    return Sym(f"{name}({a.text}, {b.text})", _number_kind(a, b))


def clamp(x, min=None, max=None):
    out = lift(x)
    if min is not None:
        out = _fn2("max", out, min)
    if max is not None:
        out = _fn2("min", out, max)
    return out


def _sigmoid(x):
    return _arith("/", 1.0, _arith("+", 1.0, _fn1("exp", _neg(x))))


def _to_kind(x, kind):
    """x converted to a dtype's kind: float from int (exactly), int from
    float toward zero (int(): PyTorch's conversion, NaN 0 and values past
    int32 at its ends), bool as nonzero."""
    x = lift(x)
    if kind == x.kind:
        return x
    if kind == "float":
        x = _as_number(x)
        return x if x.kind == "float" else _binary("*", x, const(1.0), "float")
    if kind == "bool":
        return _cmp("!=", x, 0)
    if x.kind == "bool":
        return _as_number(x)
    if x.const is not None and math.isfinite(x.const):
        return const(int(x.const))
    return Sym(f"int({x.text})", "int")


_DTYPE_KIND = {torch.bool: "bool", torch.int8: "int", torch.int16: "int", torch.int32: "int",
               torch.int64: "int", torch.uint8: "int", torch.float16: "float",
               torch.bfloat16: "float", torch.float32: "float", torch.float64: "float"}


def _kind_of_dtype(dtype):
    if dtype not in _DTYPE_KIND:
        raise Untranslatable(f"dtype {dtype}: the language has ints, floats and conditions")
    return _DTYPE_KIND[dtype]


def _to(x, *args, **kwargs):
    dtype = kwargs.get("dtype")
    for a in args:
        if isinstance(a, torch.dtype):
            dtype = a
        elif isinstance(a, (Sym, torch.Tensor)):
            dtype = a.dtype
    return x if dtype is None else _to_kind(x, _kind_of_dtype(dtype))


def _literal(value, dtype=None):
    """A constant made with torch.tensor, new_tensor, full, new_full, ...: a
    Python number (or a 0-D tensor of one made in the trace)."""
    if isinstance(value, Sym):
        return value if dtype is None else _to_kind(value, _kind_of_dtype(dtype))
    if isinstance(value, torch.Tensor) or not isinstance(value, (bool, numbers.Real)):
        raise Untranslatable(f"a tensor made from {type(value).__name__} in a modifier: only "
                             "scalar constants (torch.tensor(-float('inf'))) are translated")
    if dtype is not None:
        kind = _kind_of_dtype(dtype)
        value = {"bool": bool, "int": int, "float": float}[kind](value)
    return const(value)


def _scalar_shape(size, what):
    if size is None:
        return
    if isinstance(size, numbers.Integral) or tuple(size) not in ((), (1,)):
        raise Untranslatable(f"{what} of shape {size!r}: a modifier computes one scalar; only "
                             "shape () constants are translated")


def _new_full(x, size, value, dtype=None, **_):
    _scalar_shape(size, "new_full")
    return _literal(value, dtype if dtype is not None else lift(x).dtype)


def _new_filled(value):
    def make(x, size=(), *rest, dtype=None, **_):
        if rest:
            raise Untranslatable("new_zeros/new_ones with a shape: only shape () is translated")
        _scalar_shape(size, "new_zeros/new_ones")
        return _literal(value, dtype if dtype is not None else lift(x).dtype)
    return make


def _like(value):
    def make(x, *args, dtype=None, **_):
        return _literal(value if value is not None else args[0],
                        dtype if dtype is not None else lift(x).dtype)
    return make


def _full(size, value, dtype=None, **_):
    _scalar_shape(size, "torch.full")
    return _literal(value, dtype)


def _tensor(value, dtype=None, **_):
    return _literal(value, dtype)


# ---- reads of captured tensors --------------------------------------------------------------

_AUX_DTYPES = {torch.float32: "float", torch.int32: "int"}


def _index_list(index):
    if isinstance(index, tuple):
        return list(index)
    return [index]


def _read(tensor, done, index):
    """tensor[done..., index...]: a Sym once every dimension has an index,
    else a Partial."""
    trace = _state()
    if id(tensor) not in trace.captured:
        raise Untranslatable(
            f"a tensor of shape {tuple(tensor.shape)} that the modifier does not capture "
            "directly (made in it, a slice of a capture, or reached through an attribute): "
            "bind the tensor itself to a name the function closes over")
    if tensor.dtype not in _AUX_DTYPES:
        hint = {torch.int64: " (convert it once: t.int())", torch.bool: " (convert it once: "
                "t.int(), and compare != 0)"}.get(tensor.dtype, " (convert it once: t.float())")
        raise Untranslatable(f"a captured tensor of dtype {tensor.dtype}, shape "
                             f"{tuple(tensor.shape)}: aux tensors are float32 or int32{hint}")
    if tensor.dim() > 3:
        raise Untranslatable(f"a captured tensor of rank {tensor.dim()}, shape "
                             f"{tuple(tensor.shape)}: aux tensors have 1 to 3 dimensions")
    indices = list(done)
    for i in _index_list(index) if not (isinstance(index, tuple) and not index) else []:
        if i is None or i is Ellipsis or isinstance(i, slice):
            raise Untranslatable(f"indexing a captured tensor with {i!r}: a read takes one int "
                                 "index per dimension")
        if isinstance(i, torch.Tensor) and not (i.dim() == 0 and not i.is_floating_point()):
            raise Untranslatable(f"indexing a captured tensor with a tensor of shape "
                                 f"{tuple(i.shape)}: a read takes one int index per dimension")
        s = lift(i)
        if s.kind != "int":
            raise Untranslatable(f"a captured tensor indexed with a {s.kind} ({s.text}): "
                                 "indices are ints")
        indices.append(s)
    rank = max(tensor.dim(), 1)
    if len(indices) > rank:
        raise Untranslatable(f"a captured tensor of shape {tuple(tensor.shape)} read with "
                             f"{len(indices)} indices")
    if len(indices) < rank:
        if tensor.dim() == 0:
            indices = [const(0)]
        else:
            return Partial(tensor, indices)
    name = trace.name_of(tensor)
    return Sym(f"{name}[{', '.join(i.text for i in indices)}]", _AUX_DTYPES[tensor.dtype])


# ---- torch functions and tensor methods -------------------------------------------------------

def _method_to_bool(x):
    return _to_kind(x, "bool")


_METHODS = {
    "add": lambda x, o, alpha=1: _arith("+", x, o if alpha == 1 else _arith("*", o, alpha)),
    "sub": lambda x, o, alpha=1: _arith("-", x, o if alpha == 1 else _arith("*", o, alpha)),
    "mul": lambda x, o: _arith("*", x, o), "multiply": lambda x, o: _arith("*", x, o),
    "div": lambda x, o, rounding_mode=None: (
        _arith("/", x, o) if rounding_mode is None else
        _floordiv(x, o) if rounding_mode == "floor" else
        _truncdiv(x, o) if rounding_mode == "trunc" else _refuse_rounding(rounding_mode)),
    "true_divide": lambda x, o: _arith("/", x, o), "divide": lambda x, o: _arith("/", x, o),
    "floor_divide": _floordiv, "remainder": _mod, "fmod": _fmod, "neg": _neg, "negative": _neg,
    "pow": _pow, "square": lambda x: _pow(x, 2),
    "exp": lambda x: _fn1("exp", x), "log": lambda x: _fn1("log", x),
    "tanh": lambda x: _fn1("tanh", x), "sqrt": lambda x: _fn1("sqrt", x),
    "floor": lambda x: _fn1("floor", x), "abs": lambda x: _fn1("abs", x),
    "ceil": lambda x: _neg(_fn1("floor", _neg(x))),
    "rsqrt": lambda x: _arith("/", 1.0, _fn1("sqrt", x)),
    "exp2": lambda x: _fn1("exp", _arith("*", x, math.log(2.0))),
    "log2": lambda x: _arith("*", _fn1("log", x), 1.0 / math.log(2.0)),
    "sigmoid": _sigmoid,
    "minimum": lambda x, o: _fn2("min", x, o), "maximum": lambda x, o: _fn2("max", x, o),
    "clamp": clamp, "clip": clamp, "clamp_min": lambda x, m: clamp(x, min=m),
    "clamp_max": lambda x, m: clamp(x, max=m),
    "where": lambda x, cond, other: where(cond, x, other),
    "lt": lambda x, o: _cmp("<", x, o), "le": lambda x, o: _cmp("<=", x, o),
    "gt": lambda x, o: _cmp(">", x, o), "ge": lambda x, o: _cmp(">=", x, o),
    "eq": lambda x, o: _cmp("==", x, o), "ne": lambda x, o: _cmp("!=", x, o),
    "less": lambda x, o: _cmp("<", x, o), "less_equal": lambda x, o: _cmp("<=", x, o),
    "greater": lambda x, o: _cmp(">", x, o), "greater_equal": lambda x, o: _cmp(">=", x, o),
    "not_equal": lambda x, o: _cmp("!=", x, o),
    "logical_and": lambda x, o: _logic("&&", x, o), "logical_or": lambda x, o: _logic("||", x, o),
    "logical_not": _not, "logical_xor": _xor,
    "bitwise_and": lambda x, o: _logic("&&", x, o), "bitwise_or": lambda x, o: _logic("||", x, o),
    "bitwise_not": _not, "bitwise_xor": _xor,
    "float": lambda x: _to_kind(x, "float"), "double": lambda x: _to_kind(x, "float"),
    "half": lambda x: _to_kind(x, "float"), "bfloat16": lambda x: _to_kind(x, "float"),
    "int": lambda x: _to_kind(x, "int"), "long": lambda x: _to_kind(x, "int"),
    "bool": _method_to_bool, "to": _to,
    "type_as": lambda x, o: _to_kind(x, lift(o).kind),
    "clone": lambda x, **_: lift(x), "detach": lift, "contiguous": lambda x, **_: lift(x),
    "new_tensor": lambda x, value, dtype=None, **_: _literal(
        value, dtype if dtype is not None else lift(x).dtype),
    "new_full": _new_full, "new_zeros": _new_filled(0), "new_ones": _new_filled(1),
}

for _op, _sym in (("__add__", "+"), ("__sub__", "-"), ("__mul__", "*"), ("__truediv__", "/"),
                  ("__div__", "/")):
    _METHODS[_op] = (lambda s: lambda x, o: _arith(s, x, o))(_sym)
for _op, _sym in (("__radd__", "+"), ("__rsub__", "-"), ("__rmul__", "*"),
                  ("__rtruediv__", "/"), ("__rdiv__", "/")):
    _METHODS[_op] = (lambda s: lambda x, o: _arith(s, o, x))(_sym)
_METHODS.update({
    "__floordiv__": _floordiv, "__rfloordiv__": lambda x, o: _floordiv(o, x),
    "__mod__": _mod, "__rmod__": lambda x, o: _mod(o, x), "__pow__": _pow,
    "__neg__": _neg, "__abs__": lambda x: _fn1("abs", x), "__invert__": _not,
    "__and__": lambda x, o: _logic("&&", x, o), "__rand__": lambda x, o: _logic("&&", o, x),
    "__or__": lambda x, o: _logic("||", x, o), "__ror__": lambda x, o: _logic("||", o, x),
    "__xor__": _xor, "__rxor__": lambda x, o: _xor(o, x),
    "__lt__": _METHODS["lt"], "__le__": _METHODS["le"], "__gt__": _METHODS["gt"],
    "__ge__": _METHODS["ge"], "__eq__": _METHODS["eq"], "__ne__": _METHODS["ne"],
})


def _refuse_rounding(mode):
    raise Untranslatable(f"division with rounding_mode={mode!r}: translated for ints only "
                         "(rounding_mode='floor', torch.floor and int() of floats are)")


for _name, _fn in list(_METHODS.items()):
    if not _name.startswith("_") and not hasattr(Sym, _name):
        setattr(Sym, _name, _fn)


def _functions():
    table = {}
    for name in ("add", "sub", "mul", "multiply", "div", "true_divide", "divide", "floor_divide",
                 "remainder", "fmod", "neg", "negative", "pow", "square", "exp", "log", "tanh",
                 "sqrt", "floor", "abs", "ceil", "rsqrt", "exp2", "log2", "sigmoid", "minimum",
                 "maximum", "clamp", "clip", "clamp_min", "clamp_max", "lt", "le", "gt", "ge",
                 "eq", "ne", "less", "less_equal", "greater", "greater_equal", "not_equal",
                 "logical_and", "logical_or", "logical_not", "logical_xor", "bitwise_and",
                 "bitwise_or", "bitwise_not", "bitwise_xor"):
        fn = getattr(torch, name, None)
        if fn is not None:
            table[fn] = _METHODS[name]
    table[torch.where] = where
    table[torch.tensor] = _tensor
    table[torch.as_tensor] = _tensor
    table[torch.scalar_tensor] = _tensor
    table[torch.full] = _full
    table[torch.full_like] = _like(None)
    table[torch.zeros_like] = _like(0)
    table[torch.ones_like] = _like(1)
    table[torch.special.expit] = _sigmoid
    table[torch.nn.functional.relu] = lambda x, inplace=False: _fn2("max", x, 0)
    return table


_FUNCTIONS = _functions()

# Tensor attributes that read metadata only: passed through on real tensors.
_METADATA = {"shape", "dtype", "device", "ndim", "size", "dim", "numel", "stride",
             "is_floating_point", "requires_grad", "is_cuda", "layout", "__len__", "nelement",
             "element_size", "storage_offset", "is_contiguous", "data_ptr", "__repr__",
             "__format__", "__hash__", "name", "names", "grad_fn", "is_leaf", "_version"}


# torch.Tensor's methods written in Python, by the name they are stored
# under: some wrap a C method and carry its name (Tensor.__pow__ is named
# "pow"), which their name would look up in the wrong place
_TENSOR_FUNCTIONS = {f: n for n, f in vars(torch.Tensor).items() if inspect.isfunction(f)}


def _tensor_method(func):
    """The name of a torch.Tensor method or attribute func is (a property's
    getter: the property's name), or None."""
    name = getattr(func, "__name__", None)
    if name is None:
        return None
    if inspect.isfunction(func) and func in _TENSOR_FUNCTIONS:
        return _TENSOR_FUNCTIONS[func]
    if name == "__get__":
        desc = getattr(func, "__self__", None)
        owner = getattr(desc, "__objclass__", None)
        if owner is None and isinstance(desc, property):
            owner = torch.Tensor
        if owner in (torch.Tensor, torch._C.TensorBase):
            return getattr(desc, "__name__", None) or getattr(getattr(desc, "fget", None),
                                                              "__name__", None)
        return None
    for cls in (torch.Tensor, torch._C.TensorBase):
        attr = cls.__dict__.get(name)
        if attr is func or getattr(attr, "__get__", None) is func or \
                getattr(attr, "fget", None) is func:
            return name
    owner = getattr(func, "__objclass__", None)
    if owner in (torch.Tensor, torch._C.TensorBase):
        return name
    return None


def _traced(x):
    return isinstance(x, (Sym, Partial))


def _on_data(args, kwargs):
    """A call on real tensors of one element or more dimensions and no traced
    value: a computation on a tensor's data, which has no translation."""
    values = list(args) + list(kwargs.values())
    return not any(_traced(a) for a in values) and \
        any(isinstance(a, torch.Tensor) and a.dim() > 0 for a in values)


def _torch_call(func, args, kwargs):
    """A torch function or Tensor method called during a trace (on a Sym, or
    on anything under the trace's mode)."""
    name = _tensor_method(func)
    if name != "__getitem__" and name not in _METADATA and _on_data(args, kwargs):
        raise Untranslatable(f"{_public_name(func, name)} on a tensor in a modifier: only reads "
                             "of captured tensors (bias[h, q_idx - kv_idx]) are translated, not "
                             "computations on their data (do those before, outside)")
    handler = _FUNCTIONS.get(func)
    if handler is not None:
        return handler(*args, **kwargs)
    if name == "__getitem__" and isinstance(args[0], torch.Tensor):
        return _read(args[0], [], args[1])
    if name is not None:
        if name in _METADATA and not any(_traced(a) for a in args):
            with torch._C.DisableTorchFunction():
                return func(*args, **kwargs)
        handler = _METHODS.get(name)
        if handler is not None:
            return handler(*args, **kwargs)
    raise Untranslatable(f"{_public_name(func, name)} is not translated; {SUPPORTED}")


SUPPORTED = ("supported: + - * / // % ** (constant powers), comparisons, & | ~ ^ on conditions, "
             "torch.where, exp, log, tanh, sqrt, floor, ceil, abs, minimum, maximum, clamp, "
             "sigmoid, rsqrt, exp2, log2, square, logical_and/or/not/xor, casts (float, int, "
             "to), constants (torch.tensor, torch.full, new_tensor, new_full, new_zeros, "
             "new_ones) and reads of captured tensors")


def _public_name(func, method):
    if method is not None:
        return f"torch.Tensor.{method}"
    name = getattr(func, "__name__", None)
    if name is not None and getattr(torch, name, None) is func:
        return f"torch.{name}"
    module = getattr(func, "__module__", None)
    qualname = getattr(func, "__qualname__", name)
    return f"{module}.{qualname}" if module else repr(func)


class _Mode(TorchFunctionMode):
    """Every torch call of a trace: constants made with torch.tensor and
    friends become Syms; computations on real tensors are refused."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = _tensor_method(func)
        if name is not None and name in _METADATA and not any(_traced(a) for a in args):
            return func(*args, **kwargs)
        return _torch_call(func, args, kwargs)


# ---- captures: what a function reads besides its arguments ------------------------------------

_globals_of_code = {}


def _global_names(code):
    names = _globals_of_code.get(code)
    if names is None:
        found = []
        stack = [code]
        while stack:
            c = stack.pop()
            for ins in dis.get_instructions(c):
                if ins.opname in ("LOAD_GLOBAL", "LOAD_NAME") and ins.argval not in found:
                    found.append(ins.argval)
            stack.extend(x for x in c.co_consts if isinstance(x, types.CodeType))
        names = _globals_of_code[code] = tuple(found)
    return names


_STABLE_MODULES = ("torch", "math", "builtins", "functools", "operator", "numpy")
_SCALARS = (int, float, bool, str, bytes, type(None), complex, torch.dtype, torch.device)


def capture_key(fn, what, tensors):
    """A hashable key of fn's code and of everything it captures (closure
    cells, the globals it loads, defaults, a partial's arguments); the
    tensors found go into `tensors` (id -> tensor). Refuses captures of
    other types, naming them."""
    if not isinstance(fn, (types.FunctionType, functools.partial, types.MethodType,
                           types.BuiltinFunctionType)):
        raise Untranslatable(f"{what} is a {type(fn).__name__} object: pass a function (an "
                             "object's attributes could change without the translation "
                             "knowing)")
    return _key(fn, what, "the function", tensors, set(), 0)


def _key(v, what, where, tensors, active, depth):
    if isinstance(v, torch.Tensor):
        tensors[id(v)] = v
        stride = v.stride() if v.layout == torch.strided else None
        return ("T", id(v), tuple(v.shape), stride, v.dtype, v.device)
    if type(v) in _SCALARS:
        return (type(v), v)
    if isinstance(v, numbers.Number) and not isinstance(v, torch.Tensor):
        try:
            hash(v)
            return (type(v), v)
        except TypeError:
            pass
    if depth > 8:
        raise Untranslatable(f"{what}: captures nested more than 8 deep ({where})")
    if isinstance(v, (tuple, list)):
        return (type(v).__name__,) + tuple(
            _key(x, what, f"{where}[{i}]", tensors, active, depth + 1) for i, x in enumerate(v))
    if isinstance(v, types.ModuleType):
        return ("module", v.__name__)
    if isinstance(v, (types.BuiltinFunctionType, types.BuiltinMethodType, type,
                      types.MethodDescriptorType, types.WrapperDescriptorType,
                      types.MethodWrapperType, types.GetSetDescriptorType)):
        owner = getattr(v, "__self__", None)
        if owner is not None and not isinstance(owner, (types.ModuleType, type)):
            return ("bound", getattr(v, "__name__", ""),
                    _key(owner, what, f"{where}.__self__", tensors, active, depth + 1))
        return ("id", id(v))
    if isinstance(v, functools.partial):
        return ("partial", _key(v.func, what, f"{where}.func", tensors, active, depth + 1),
                tuple(_key(a, what, f"{where} argument {i}", tensors, active, depth + 1)
                      for i, a in enumerate(v.args)),
                tuple((n, _key(a, what, f"{where} argument {n}", tensors, active, depth + 1))
                      for n, a in sorted(v.keywords.items())))
    if isinstance(v, types.FunctionType):
        module = (v.__module__ or "").split(".")[0]
        if module in _STABLE_MODULES and v.__closure__ is None:
            return ("id", id(v))
        if id(v) in active:
            return ("recursive", v.__code__)
        active.add(id(v))
        try:
            code = v.__code__
            cells = []
            for name, cell in zip(code.co_freevars, v.__closure__ or ()):
                try:
                    value = cell.cell_contents
                except ValueError:  # not assigned yet
                    cells.append(("empty",))
                    continue
                cells.append(_key(value, what, f"{name!r}", tensors, active, depth + 1))
            glob = []
            for name in _global_names(code):
                if name in v.__globals__:
                    value = v.__globals__[name]
                elif hasattr(builtins, name):
                    value = getattr(builtins, name)
                else:
                    continue
                glob.append((name, _key(value, what, f"global {name!r}", tensors, active,
                                        depth + 1)))
            defaults = tuple(_key(d, what, f"a default of {code.co_name}", tensors, active,
                                  depth + 1) for d in v.__defaults__ or ())
            kwdefaults = tuple((n, _key(d, what, f"a default of {code.co_name}", tensors, active,
                                        depth + 1))
                               for n, d in sorted((v.__kwdefaults__ or {}).items()))
            return ("fn", code, tuple(cells), tuple(glob), defaults, kwdefaults)
        finally:
            active.discard(id(v))
    if isinstance(v, types.MethodType):
        raise Untranslatable(f"{what} is a bound method of a {type(v.__self__).__name__}: its "
                             "attributes are not captures flashgen can follow; write a function "
                             "that closes over the tensors it reads")
    raise Untranslatable(f"{what} captures {where}, a {type(v).__name__}: only tensors, numbers, "
                         "functions and modules are followed; bind the tensor or number it "
                         "holds to a local name the function closes over")


# ---- the translation -------------------------------------------------------------------------

class Translation(NamedTuple):
    """score_mod and mask_mod as expression texts (None: none) and the aux
    tensors they read, name -> tensor (insertion order is the spec's)."""
    score_mod: Optional[str]
    mask_mod: Optional[str]
    aux: dict


_cache = collections.OrderedDict()
_cache_lock = threading.Lock()
_CACHE_SIZE = 256
_arity = {}


def _positional_count(fn, flex, extra):
    """How many arguments fn takes: flex (FlexAttention's) or flex + 2
    (seqlen_q, seqlen_k after them)."""
    key = getattr(fn, "__code__", None) or fn
    try:
        found = _arity.get(key)
    except TypeError:
        found = None
    if found is not None:
        return found
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return flex
    for n in (flex, flex + extra):
        try:
            sig.bind(*range(n))
        except TypeError:
            continue
        try:
            _arity[key] = n
        except TypeError:
            pass
        return n
    args = "(score, b, h, q_idx, kv_idx)" if flex == 5 else "(b, h, q_idx, kv_idx)"
    raise Untranslatable(f"a {'score' if flex == 5 else 'mask'} modifier takes {args} (and "
                         f"optionally seqlen_q, seqlen_k after them); {sig} does not")


def _trace_one(fn, kind, trace):
    flex = 5 if kind == "score_mod" else 4
    n = _positional_count(fn, flex, 2)
    args = [Sym("b", "int"), Sym("h", "int"), Sym("q", "int"), Sym("k", "int")]
    if kind == "score_mod":
        args.insert(0, Sym("s", "float"))
    if n > flex:
        args += [Sym("seqlen_q", "int"), Sym("seqlen_k", "int")]
    try:
        result = fn(*args)
    except Untranslatable as e:
        raise Untranslatable(f"{kind} {_describe(fn)}: {e}") from None
    try:
        out = lift(result)
    except Untranslatable as e:
        raise Untranslatable(f"{kind} {_describe(fn)} returned {e}") from None
    if kind == "score_mod":
        if out.kind == "bool":
            raise Untranslatable(f"score_mod {_describe(fn)} returned a condition ({out.text}); "
                                 "a score modifier returns the new score (a mask_mod returns "
                                 "conditions)")
        return None if out.text == "s" else out.text
    if out.kind != "bool":
        raise Untranslatable(f"mask_mod {_describe(fn)} returned a {out.kind} ({out.text}); a "
                             "mask returns a condition (True: the key is visible)")
    if out.const is True:
        return None
    return out.text


def _describe(fn):
    name = getattr(fn, "__qualname__", None) or getattr(getattr(fn, "func", None), "__qualname__",
                                                        None) or type(fn).__name__
    return f"({name})"


def translate(score_mod=None, mask_mod=None, aux=None, device=None):
    """score_mod and mask_mod, each None, an expression text or a function
    (FlexAttention's score_mod(score, b, h, q_idx, kv_idx) and
    mask_mod(b, h, q_idx, kv_idx)), as a Translation: the texts and every aux
    tensor, the caller's (aux: name -> tensor) first, then those the
    functions capture (t0, t1, ...; a captured 0-D tensor is passed as a
    1-element view). Raises ValueError for what has no exact translation."""
    if aux is not None and not isinstance(aux, dict):
        raise TypeError(f"aux: {type(aux).__name__}; expected a dict of name -> tensor")
    given = dict(aux or {})
    fns = {}
    texts = {}
    for kind, mod in (("score_mod", score_mod), ("mask_mod", mask_mod)):
        if mod is None or isinstance(mod, str):
            texts[kind] = mod or None
        elif callable(mod):
            fns[kind] = mod
        else:
            raise TypeError(f"{kind}: {type(mod).__name__}; expected an expression string or a "
                            "function")
    if not fns:
        return Translation(texts["score_mod"], texts["mask_mod"], given)
    tensors = {}
    key = (tuple((kind, capture_key(fn, kind, tensors)) for kind, fn in fns.items()),
           tuple(sorted(given)))
    with _cache_lock:
        hit = _cache.get(key)
        if hit is not None:
            _cache.move_to_end(key)
    # The key holds the captured tensors' ids, the entry weak references to
    # them (a strong one would keep a step's tensors and autograd graph
    # alive): a hit is one whose tensors are the very ones captured now.
    if hit is not None and not all(ref() is tensors.get(i) for i, ref in hit[2]):
        hit = None
    if hit is None:
        trace = _Trace(tensors, set(given), device if device is not None else
                       torch.device("cpu"))
        traced = {}
        _local.trace = trace
        try:
            with _Mode():
                for kind, fn in fns.items():
                    traced[kind] = _trace_one(fn, kind, trace)
        finally:
            _local.trace = None
        captured = tuple((name, id(t)) for name, t in trace.aux.values())
        hit = (traced, captured, tuple((i, weakref.ref(t)) for i, t in tensors.items()))
        with _cache_lock:
            _cache[key] = hit
            if len(_cache) > _CACHE_SIZE:
                for k in [k for k, entry in _cache.items()
                          if any(ref() is None for _, ref in entry[2])]:
                    del _cache[k]
            while len(_cache) > _CACHE_SIZE:
                _cache.popitem(last=False)
    traced, captured, _ = hit
    for kind, text in traced.items():
        texts[kind] = text
    out = dict(given)
    for name, i in captured:
        tensor = tensors[i]
        out[name] = tensor.view(1) if tensor.dim() == 0 else tensor
    return Translation(texts["score_mod"], texts["mask_mod"], out)


def cache_clear():
    with _cache_lock:
        _cache.clear()

"""Random FlexAttention functions translated into the expression language,
without a GPU: each function, written from a grammar of what users write
(index arithmetic with Python's `%` and `//`, constants, casts, captured
float and int tensors, torch's functions and their Tensor methods, where,
clamp, powers, masks combined with & | ~ ^), is either refused with a
ValueError or translated into text that the library accepts and that means
what the function computes: the text run by an interpreter of the language
as docs/expressions.md defines it (32-bit ints, float division, C's
remainder, reads outside a tensor giving 0), on every (b, h, q, k) of a
small problem, against the function run by PyTorch in float32. Needs
PyTorch (on the CPU)."""
import random
import re

import pytest

from flashgen import _native

torch = pytest.importorskip("torch", reason="PyTorch is not installed")

import flashgen  # noqa: E402

B, H, SQ, SK = 2, 3, 7, 11


# ---- an interpreter of the expression language ------------------------------

TOKEN = re.compile(r"\s*(?:(\d+\.\d*(?:[eE][-+]?\d+)?|\.\d+(?:[eE][-+]?\d+)?|\d+[eE][-+]?\d+)"
                   r"|(\d+)|([A-Za-z_][A-Za-z0-9_]*)|(&&|\|\||==|!=|<=|>=|[-+*/%<>!?:()\[\],]))")
BINARY = [("?",), ("||",), ("&&",), ("==", "!="), ("<", "<=", ">", ">="), ("+", "-"),
          ("*", "/", "%")]


def tokens(text):
    out, at = [], 0
    while at < len(text.rstrip()):
        m = TOKEN.match(text, at)
        assert m, f"no token at {at} of {text!r}"
        out.append(("float", float(m.group(1))) if m.group(1) else ("int", int(m.group(2)))
                   if m.group(2) else ("name", m.group(3)) if m.group(3) else ("op", m.group(4)))
        at = m.end()
    return out + [("end", None)]


class Interpreter:
    """Values are tensors: int32 (ints, wrapping), float32, bool."""

    def __init__(self, text, names):
        self.t, self.i, self.names = tokens(text), 0, names

    def peek(self):
        return self.t[self.i]

    def take(self, op=None):
        tok = self.t[self.i]
        assert op is None or tok == ("op", op), f"expected {op}, got {tok}"
        self.i += 1
        return tok

    def run(self):
        v = self.expr(0)
        assert self.peek()[0] == "end"
        return v

    def expr(self, level):
        if level == len(BINARY):
            return self.unary()
        left = self.expr(level + 1)
        while self.peek()[0] == "op" and self.peek()[1] in BINARY[level]:
            op = self.take()[1]
            if op == "?":  # c ? a : b, right-associative
                a = self.expr(0)
                self.take(":")
                return select(left, a, self.expr(0))
            left = binary(op, left, self.expr(level + 1))
        return left

    def unary(self):
        kind, v = self.peek()
        if (kind, v) in (("op", "-"), ("op", "!")):
            self.take()
            x = self.unary()
            return ~x if v == "!" else -x
        return self.primary()

    def primary(self):
        kind, v = self.take()
        if kind == "int":
            return torch.tensor(v, dtype=torch.int32)
        if kind == "float":
            return torch.tensor(v, dtype=torch.float32)
        if kind == "op":
            assert v == "("
            x = self.expr(0)
            self.take(")")
            return x
        if v == "inf":
            return torch.tensor(float("inf"))
        if self.peek() == ("op", "("):
            return call(v, self.items(")"))
        if self.peek() == ("op", "["):
            return read(self.names[v], self.items("]"))
        return self.names[v]

    def items(self, close):
        """A call's arguments or a read's indices, after their opening bracket."""
        self.take()
        out = [self.expr(0)]
        while self.peek() == ("op", ","):
            self.take(",")
            out.append(self.expr(0))
        self.take(close)
        return out


def floats(*xs):
    return [x.float() if x.dtype != torch.float32 else x for x in xs]


def binary(op, a, b):
    if op in ("&&", "||"):
        return a & b if op == "&&" else a | b
    ints = a.dtype == torch.int32 and b.dtype == torch.int32
    if op in ("==", "!=", "<", "<=", ">", ">="):
        a, b = (a, b) if ints else floats(a, b)
        return {"==": a == b, "!=": a != b, "<": a < b, "<=": a <= b, ">": a > b,
                ">=": a >= b}[op]
    if op == "/":
        a, b = floats(a, b)
        return a / b
    if not ints:
        a, b = floats(a, b)
    if op == "%":  # C's remainder; x % 0 is 0
        zero = b == 0
        r = torch.fmod(a, torch.where(zero, torch.ones_like(b), b))
        return torch.where(zero, torch.zeros_like(r), r)
    return {"+": a + b, "-": a - b, "*": a * b}[op]


def select(c, a, b):
    if a.dtype != b.dtype:
        a, b = floats(a, b)
    return torch.where(c, a, b)


def call(name, args):
    if name in ("where", "select"):
        return select(*args)
    if name in ("exp", "log", "tanh", "sqrt", "floor"):
        return getattr(torch, name)(floats(args[0])[0])
    if name == "abs":
        return args[0].abs()
    if name == "int":  # toward zero (the values here stay inside int32)
        return args[0].to(torch.int32) if args[0].dtype != torch.bool else args[0].int()
    if name == "floordiv":  # ints, rounded down; / 0 gives 0
        a, b = args
        zero = b == 0
        return torch.where(zero, 0, torch.div(a, torch.where(zero, 1, b), rounding_mode="floor"))
    a, b = args
    if a.dtype != b.dtype:
        a, b = floats(a, b)
    return torch.minimum(a, b) if name == "min" else torch.maximum(a, b)


def read(t, idx):
    """t[idx...], 0 outside it."""
    idx = torch.broadcast_tensors(*idx)
    inside = torch.ones(idx[0].shape, dtype=torch.bool)
    clamped = []
    for i, n in zip(idx, t.shape):
        inside &= (i >= 0) & (i < n)
        clamped.append(i.clamp(0, n - 1).long())
    return torch.where(inside, t[tuple(clamped)], torch.zeros((), dtype=t.dtype))


# ---- random functions --------------------------------------------------------

class Grammar:
    """Random Python source of a score_mod or mask_mod; captured tensors in
    env (rel (H, SQ + SK - 1), heads (H,), scale (), docs (max(SQ, SK),)
    int32, keys (B, SK)). Every subexpression is a tensor (a Python number
    only as an operator's operand), as a function run by PyTorch needs."""

    def __init__(self, r, mask):
        self.r, self.mask = r, mask

    def const(self, lo, hi):
        return str(round(self.r.uniform(lo, hi), 3))

    def int_(self, d):
        r = self.r
        if d <= 0 or r.random() < 0.3:
            return r.choice(["b", "h", "q_idx", "kv_idx", "docs[q_idx]", "docs[kv_idx]",
                             "docs[kv_idx // 2]", "(q_idx // -3)"])
        a, b = self.int_(d - 1), self.int_(d - 1)
        c = r.choice([2, 3, 5, -3])
        return r.choice([f"({a} + {b})", f"({a} - {b})", f"({a} * {b})", f"({a} % {c})",
                         f"({a} + {c})", f"({c} - {a})", f"({a} * {c})", f"abs({a})",
                         f"({a}).abs()", f"torch.maximum({a}, {b})", f"torch.minimum({a}, {b})",
                         f"(-{a})", f"torch.where({self.cond(d - 1)}, {a}, {b})",
                         f"({a} // {c})", f"torch.remainder({a}, {c})", f"({a}).long()",
                         f"torch.div({a}, {c}, rounding_mode='trunc')", f"torch.fmod({a}, {c})"])

    def float_(self, d):
        r = self.r
        if d <= 0 or r.random() < 0.25:
            return r.choice(["heads[h]" if self.mask else "score",  # a mask has no score
                             f"rel[h, q_idx - kv_idx + {SK - 1}]", "heads[h]", "scale",
                             f"({self.int_(0)}).float()", "keys[b, kv_idx]"])
        a, b = self.float_(d - 1), self.float_(d - 1)
        i = self.int_(d - 1)
        c = self.const(0.5, 4.0)
        return r.choice([
            f"({a} + {b})", f"({a} - {b})", f"({a} * {b})", f"({a} / {c})", f"({a} + {i})",
            f"({c} - {a})", f"({i} / {c})", f"({i} // {r.choice([2, 3, -2])})",
            f"torch.exp({a} * 0.1)", f"torch.tanh({a})", f"torch.log(({a}).abs() + 1.0)",
            f"torch.sqrt(({a}).abs())", f"torch.floor({a})", f"({a}).abs()",
            f"torch.clamp({a}, min=-{c})", f"torch.clamp({a}, -{c}, {c})",
            f"torch.where({self.cond(d - 1)}, {a}, {b})", f"torch.sigmoid({a})", f"({a}) ** 2",
            f"(({a}).abs() + 1.0) ** 0.5", f"torch.maximum({a}, {b})", f"({a}).square()",
            f"torch.exp2({a} * 0.1)", f"({a}).clamp(max={c})", f"torch.mul({a}, {c})",
            f"({a}) * {i}", f"({a} + {c})", f"torch.where({self.cond(d - 1)}, {a}, {c})",
            f"rel[h, (({a}).abs() * 2.0).clamp(max=6.0).long() + kv_idx]",
            f"(({a}) * 3.0).int() * 0.5",
            f"({a}).to(torch.float32)", f"({a} + torch.full((), {c}))", f"({i}).float() / {c}",
            f"torch.nn.functional.relu({a})", f"torch.rsqrt(({a}).abs() + 1.0)",
            f"torch.log2(({a}).abs() + 1.0)", f"torch.ceil({a})", f"({a}).clamp_min(-{c})",
            f"torch.div({a}, {c}, rounding_mode='floor')", f"({a}).exp() * 0.5"])

    def cond(self, d):
        r = self.r
        if d <= 0 or r.random() < 0.4:
            op = r.choice(["<", "<=", ">", ">=", "==", "!="])
            if r.random() < 0.3:
                return f"({self.float_(0)} {op} {self.const(-2, 2)})"
            return f"({self.int_(min(d, 1))} {op} {self.int_(min(d, 1))})"
        a, b = self.cond(d - 1), self.cond(d - 1)
        return r.choice([f"({a} & {b})", f"({a} | {b})", f"(~{a})", f"({a} ^ {b})",
                         f"({a} == {b})", f"({a} != {b})", f"torch.logical_xor({a}, {b})",
                         f"torch.logical_and({a}, {b})", f"torch.logical_not({a})"])


def captured(r):
    g = torch.Generator().manual_seed(r.randrange(1 << 30))
    return {"torch": torch,
            "rel": torch.randn(H, SQ + SK - 1, generator=g),
            "heads": torch.rand(H, generator=g) + 0.5,
            "scale": torch.tensor(0.7),
            "docs": torch.tensor(sorted(r.randrange(3) for _ in range(max(SQ, SK))),
                                 dtype=torch.int32),
            "keys": torch.randn(B, SK, generator=g)}


def grids():
    b = torch.arange(B, dtype=torch.int32).view(B, 1, 1, 1)
    h = torch.arange(H, dtype=torch.int32).view(1, H, 1, 1)
    q = torch.arange(SQ, dtype=torch.int32).view(1, 1, SQ, 1)
    k = torch.arange(SK, dtype=torch.int32).view(1, 1, 1, SK)
    return b, h, q, k


def meaning(text, aux, score=None):
    """The translated text run by the interpreter on every (b, h, q, k)
    (None: nothing to do, the score as it is or every key seen)."""
    if text is None:
        return torch.tensor(True) if score is None else score
    b, h, q, k = grids()
    names = {"b": b, "h": h, "q": q, "k": k, "seqlen_q": torch.tensor(SQ, dtype=torch.int32),
             "seqlen_k": torch.tensor(SK, dtype=torch.int32), **aux}
    if score is not None:
        names["s"] = score
    return Interpreter(text, names).run()


def agree(got, want):
    got, want = torch.broadcast_tensors(got, want)
    if want.dtype == torch.bool or got.dtype == torch.bool:
        return torch.equal(got.bool(), want.bool())
    got, want = got.float(), want.float()
    same = torch.isclose(got, want, rtol=2e-5, atol=1e-5, equal_nan=True)
    return bool(same.all())


def test_random_functions_translate_to_what_they_compute():
    r = random.Random(7)
    translated = refused = 0
    for case in range(400):
        mask = r.random() < 0.35
        gram, env = Grammar(r, mask), captured(r)
        body = gram.cond(3) if mask else gram.float_(3)
        src = (f"def fn(b, h, q_idx, kv_idx):\n    return {body}\n" if mask else
               f"def fn(score, b, h, q_idx, kv_idx):\n    return {body}\n")
        exec(src, env)
        fn = env["fn"]
        try:
            tr = flashgen.translate(**{"mask_mod" if mask else "score_mod": fn})
        except ValueError as e:
            refused += 1
            assert str(e), src
            continue
        translated += 1
        text = tr.mask_mod if mask else tr.score_mod
        decls = [(n, 1 if t.dtype == torch.int32 else 0, max(t.dim(), 1)) for n, t in tr.aux.items()]
        _native.check_expressions(tr.score_mod, tr.mask_mod, decls)
        aux = {n: t.reshape(t.shape or (1,)) for n, t in tr.aux.items()}
        b, h, q, k = grids()
        if mask:
            want, got = fn(b, h, q, k), meaning(text, aux)
        else:
            score = torch.randn(B, H, SQ, SK, generator=torch.Generator().manual_seed(case)) * 3
            want, got = fn(score, b, h, q, k), meaning(text, aux, score)
        assert agree(got, want), f"case {case}:\n{src}translated: {text}\n"
    # the grammar writes mostly what translates
    assert translated > 300 and translated + refused == 400, (translated, refused)

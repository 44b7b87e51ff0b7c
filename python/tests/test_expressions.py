"""Score and mask modifiers from Python, without a GPU: FlexAttention-style
functions traced into expression text (the idioms, each translation parsed
by the library), what is refused and why, the translations kept per
function and captures, the expressions' argument checks, and the library's
parse errors as ValueErrors with their columns. Needs PyTorch for the
tracing; the checks run on stand-in tensors."""
import functools
import types

import pytest

import flashgen
from flashgen import _checks, _native
from test_checks import Device  # the stand-in device

torch = pytest.importorskip("torch", reason="PyTorch is not installed")

from flashgen import _expressions  # noqa: E402
from flashgen._expressions import translate  # noqa: E402


def accepted(tr):
    """The translation parses and type-checks in the library."""
    decls = [(name, 1 if t.dtype == torch.int32 else 0, max(t.dim(), 1))
             for name, t in tr.aux.items()]
    _native.check_expressions(tr.score_mod, tr.mask_mod, decls)
    return tr


def score_text(fn, **kw):
    return accepted(translate(score_mod=fn, **kw)).score_mod


def mask_text(fn, **kw):
    return accepted(translate(mask_mod=fn, **kw)).mask_mod


# ---- FlexAttention's idioms ------------------------------------------------------

def test_relative_bias():
    bias = torch.randn(4, 63)

    def rel(score, b, h, q_idx, kv_idx):
        return score + bias[h, q_idx - kv_idx + 31]

    tr = accepted(translate(score_mod=rel))
    assert tr.score_mod == "s + t0[h, q - k + 31]"
    assert list(tr.aux) == ["t0"] and tr.aux["t0"] is bias and tr.mask_mod is None
    # indexing one dimension at a time reads the same element
    assert score_text(lambda s, b, h, q, k: s + bias[h][q - k + 31]) == "s + t0[h, q - k + 31]"
    # a constant first index
    assert score_text(lambda s, b, h, q, k: s + bias[0][q - k]) == "s + t0[0, q - k]"


def test_alibi_and_softcap():
    slopes = torch.rand(8)

    def alibi(score, b, h, q_idx, kv_idx):
        return score - slopes[h] * (q_idx - kv_idx).abs()

    assert score_text(alibi) == "s - t0[h] * abs(q - k)"
    cap = 30.0

    def softcap(score, b, h, q_idx, kv_idx):
        return cap * torch.tanh(score / cap)

    assert score_text(softcap) == "30.0 * tanh(s / 30.0)"
    assert score_text(lambda s, b, h, q, k: torch.tanh(s / 50) * 50) == "tanh(s / 50) * 50"
    assert score_text(lambda s, b, h, q, k: s.tanh()) == "tanh(s)"


def test_masks():
    def causal(b, h, q_idx, kv_idx):
        return q_idx >= kv_idx

    assert mask_text(causal) == "q >= k"
    window = 128

    def sliding(b, h, q_idx, kv_idx):
        return (q_idx >= kv_idx) & (q_idx - kv_idx <= window)

    assert mask_text(sliding) == "q >= k && q - k <= 128"
    prefix = 5

    def prefix_lm(b, h, q_idx, kv_idx):
        return (kv_idx < prefix) | causal(b, h, q_idx, kv_idx)

    assert mask_text(prefix_lm) == "k < 5 || q >= k"
    assert mask_text(lambda b, h, q, k: ~(q < k)) == "!(q < k)"
    lengths = torch.tensor([10, 20], dtype=torch.int32)
    assert mask_text(lambda b, h, q, k: k < lengths[b]) == "k < t0[b]"


def test_document_mask_from_a_captured_int_tensor():
    doc = torch.tensor([0, 0, 0, 1, 1, 2], dtype=torch.int32)

    def document(b, h, q_idx, kv_idx):
        return (doc[q_idx] == doc[kv_idx]) & (q_idx >= kv_idx)

    tr = accepted(translate(mask_mod=document))
    assert tr.mask_mod == "t0[q] == t0[k] && q >= k" and tr.aux == {"t0": doc}


def test_minus_infinity_in_every_spelling():
    want = "where(q >= k, s, -inf)"
    for fn in (lambda s, b, h, q, k: torch.where(q >= k, s, -float("inf")),
               lambda s, b, h, q, k: torch.where(q >= k, s, float("-inf")),
               lambda s, b, h, q, k: torch.where(q >= k, s, s.new_tensor(float("-inf"))),
               lambda s, b, h, q, k: torch.where(q >= k, s, torch.tensor(float("-inf"))),
               lambda s, b, h, q, k: torch.where(q >= k, s, torch.full((), -torch.inf)),
               lambda s, b, h, q, k: s.where(q >= k, -torch.inf)):
        assert score_text(fn) == want
    assert score_text(lambda s, b, h, q, k: torch.where(q < k, -float("inf"), s)) == \
        "where(q < k, -inf, s)"


def test_closure_numbers_become_literals():
    def make(scale, shift):
        def fn(score, b, h, q_idx, kv_idx):
            return score * scale + shift
        return fn

    assert score_text(make(0.5, 3)) == "s * 0.5 + 3"
    assert score_text(make(-2, 1e-3)) == "s * -2 + 0.001"
    assert score_text(make(2.5e-10, 1e20)) == "s * 2.5e-10 + 1e20"
    assert score_text(make(True, 0)) == "s * 1 + 0"


def test_flex_helpers_and_noop():
    from torch.nn.attention.flex_attention import and_masks, noop_mask, or_masks

    doc = torch.zeros(8, dtype=torch.int32)

    def causal(b, h, q_idx, kv_idx):
        return q_idx >= kv_idx

    def same_doc(b, h, q_idx, kv_idx):
        return doc[q_idx] == doc[kv_idx]

    assert mask_text(and_masks(causal, same_doc)) == "q >= k && t0[q] == t0[k]"
    assert mask_text(or_masks(causal, same_doc)) == "q >= k || t0[q] == t0[k]"
    assert translate(mask_mod=noop_mask) == (None, None, {})
    assert translate(score_mod=lambda s, b, h, q, k: s) == (None, None, {})


def test_operations():
    cases = [
        (lambda s, b, h, q, k: s * s, "s * s"),
        (lambda s, b, h, q, k: s ** 2, "s * s"),
        (lambda s, b, h, q, k: s ** 0.5, "sqrt(s)"),
        (lambda s, b, h, q, k: (s + 1) * (s - 1), "(s + 1) * (s - 1)"),
        (lambda s, b, h, q, k: s - (q - k), "s - (q - k)"),
        (lambda s, b, h, q, k: s / (q + 1), "s / (q + 1)"),
        (lambda s, b, h, q, k: -(-s), "-(-s)"),
        (lambda s, b, h, q, k: 1 - s, "1 - s"),
        (lambda s, b, h, q, k: torch.exp(s) + torch.log(s.abs() + 1.0),
         "exp(s) + log(abs(s) + 1.0)"),
        (lambda s, b, h, q, k: torch.clamp(s, -5.0, 5.0), "min(max(s, -5.0), 5.0)"),
        (lambda s, b, h, q, k: torch.minimum(s, q * 1.0), "min(s, q * 1.0)"),
        (lambda s, b, h, q, k: torch.sigmoid(s), "1.0 / (1.0 + exp(-s))"),
        (lambda s, b, h, q, k: s + torch.floor(q / 64.0) * 0.5, "s + floor(q / 64.0) * 0.5"),
        (lambda s, b, h, q, k: s + (q // 64 == k // 64),
         "s + where(floordiv(q, 64) == floordiv(k, 64), 1, 0)"),
        (lambda s, b, h, q, k: s + (q // 16) % 2 + (q * 1.0) // 4,
         "s + (floordiv(q, 16) % 2 + 2) % 2 + floor(q * 1.0 / 4)"),
        (lambda s, b, h, q, k: s + torch.div(k, -3, rounding_mode="floor") + 7 // 2,
         "s + floordiv(k, -3) + 3"),
        (lambda s, b, h, q, k: s + (q - k) % 8, "s + ((q - k) % 8 + 8) % 8"),
        (lambda s, b, h, q, k: s + q % 8, "s + (q % 8 + 8) % 8"),
        (lambda s, b, h, q, k: s + q.float(), "s + q * 1.0"),
        (lambda s, b, h, q, k: s * (q >= k), "s * where(q >= k, 1, 0)"),
        (lambda s, b, h, q, k: torch.where(q >= k, s, 0), "where(q >= k, s, 0)"),
        (lambda s, b, h, q, k: s.masked_fill(q < k, 0) if False else s + 0, "s + 0"),
    ]
    for fn, want in cases:
        assert score_text(fn) == want
    masks = [
        (lambda b, h, q, k: (q >= k) ^ (k < 4), "where(q >= k, 1, 0) != where(k < 4, 1, 0)"),
        (lambda b, h, q, k: (q >= k) == (k < 4), "where(q >= k, 1, 0) == where(k < 4, 1, 0)"),
        (lambda b, h, q, k: torch.logical_and(q >= k, torch.logical_not(k > 9)),
         "q >= k && !(k > 9)"),
        (lambda b, h, q, k: (q - k).abs() <= 3, "abs(q - k) <= 3"),
        (lambda b, h, q, k: b.new_ones((), dtype=torch.bool) & (q >= k), "q >= k"),
        (lambda b, h, q, k: b.new_zeros((), dtype=torch.bool) | (q >= k), "q >= k"),
        (lambda b, h, q, k: torch.where(k < 4, q >= 0, q >= k),
         "k < 4 && q >= 0 || !(k < 4) && q >= k"),
    ]
    for fn, want in masks:
        assert mask_text(fn) == want


def test_captured_scalar_tensor_is_read_as_aux():
    temperature = torch.tensor(0.7, requires_grad=True)
    tr = accepted(translate(score_mod=lambda s, b, h, q, k: s / temperature))
    assert tr.score_mod == "s / t0[0]"
    assert tr.aux["t0"].shape == (1,) and tr.aux["t0"]._base is temperature
    # its powers as the score's (Tensor.__pow__ is a wrapper named "pow")
    for power, text in ((2, "(t0[0] * t0[0])"), (0.5, "sqrt(t0[0])"), (-1, "(1.0 / t0[0])")):
        assert translate(score_mod=lambda s, b, h, q, k: s * temperature ** power).score_mod == \
            f"s * {text}" == translate(
                score_mod=lambda s, b, h, q, k: s * temperature.pow(power)).score_mod


def test_captures_deduplicated_and_named_beside_the_callers():
    bias = torch.randn(4, 16)
    doc = torch.zeros(16, dtype=torch.int32)

    def score(s, b, h, q, k):
        return s + bias[h, q] + bias[h, k]

    def mask(b, h, q, k):
        return doc[q] == doc[k]

    tr = accepted(translate(score_mod=score, mask_mod=mask))
    assert tr.score_mod == "s + t0[h, q] + t0[h, k]" and tr.mask_mod == "t1[q] == t1[k]"
    assert tr.aux == {"t0": bias, "t1": doc}
    extra = torch.ones(3)
    tr = accepted(translate(score_mod=score, mask_mod="k < extra_len[0] && t2[q] == 0",
                            aux={"t0": extra, "extra_len": doc, "t2": doc}))
    # the caller's names come first and are never reused for captures
    assert list(tr.aux) == ["t0", "extra_len", "t2", "t1"]
    assert tr.score_mod == "s + t1[h, q] + t1[h, k]" and tr.aux["t1"] is bias


def test_functools_partial_and_seqlen_arguments():
    bias = torch.randn(2, 8)

    def with_bias(t, score, b, h, q_idx, kv_idx):
        return score + t[h, q_idx]

    assert score_text(functools.partial(with_bias, bias)) == "s + t0[h, q]"

    def bottom_right(b, h, q_idx, kv_idx, seqlen_q, seqlen_k):
        return kv_idx <= q_idx + seqlen_k - seqlen_q

    assert mask_text(bottom_right) == "k <= q + seqlen_k - seqlen_q"


# ---- refusals ------------------------------------------------------------------------

class Holder:
    def __init__(self):
        self.bias = torch.randn(4, 4)

    def score(self, s, b, h, q, k):
        return s + self.bias[h, q]


def refused(match, **kw):
    with pytest.raises(ValueError, match=match):
        translate(**kw)


def test_control_flow_on_a_traced_value_is_refused():
    refused("Python control flow on a traced value \\(s > 0\\)",
            score_mod=lambda s, b, h, q, k: s if s > 0 else -s)
    refused("Python control flow", mask_mod=lambda b, h, q, k: q >= k and k >= 0)
    refused("Python control flow", score_mod=lambda s, b, h, q, k: max(s, 0.0))
    refused("float\\(\\) of a traced value", score_mod=lambda s, b, h, q, k: s + __import__(
        "math").exp(s))
    refused("using it as a Python index", score_mod=lambda s, b, h, q, k: s + [1.0, 2.0][q])


def test_unsupported_functions_are_refused():
    refused("torch.sin is not translated", score_mod=lambda s, b, h, q, k: torch.sin(s))
    refused("'masked_fill' of a traced value is not translated",
            score_mod=lambda s, b, h, q, k: s.masked_fill(q < k, 0.0))
    refused("rounding_mode='trunc'",
            score_mod=lambda s, b, h, q, k: torch.div(s, 2.0, rounding_mode="trunc"))
    refused("x \\*\\* 3.5", score_mod=lambda s, b, h, q, k: s ** 3.5)
    refused("traced exponent", score_mod=lambda s, b, h, q, k: s ** q)
    refused("% of a float", score_mod=lambda s, b, h, q, k: s % 2.0)
    # // of floats: PyTorch rounds the exact quotient down; a float division
    # is exact only by a power of two
    refused("6 // 1.2 is 4", score_mod=lambda s, b, h, q, k: s // 1.2)
    refused("6 // 1.2 is 4", score_mod=lambda s, b, h, q, k: s + torch.div(
        q.float(), 3.0, rounding_mode="floor"))
    assert score_text(lambda s, b, h, q, k: s // 0.25 + s // -2.0) == \
        "floor(s / 0.25) + floor(s / -2.0)"
    refused("& \\| ~ \\^ are translated on conditions only",
            mask_mod=lambda b, h, q, k: (q & 1) == 0)
    # ints divided toward zero, and C's remainder (torch.fmod)
    assert score_text(lambda s, b, h, q, k: s + torch.div(q - k, 3, rounding_mode="trunc")) == \
        "s + where((q - k) % 3 != 0 && q - k < 0, floordiv(q - k, 3) + 1, floordiv(q - k, 3))"
    assert score_text(lambda s, b, h, q, k: s + torch.fmod(q - k, 3)) == "s + (q - k) % 3"
    # a float to an int: toward zero, as PyTorch's conversion (an int may index)
    assert score_text(lambda s, b, h, q, k: s.int()) == "int(s)"
    bias = torch.zeros(4, 40)
    assert translate(score_mod=lambda s, b, h, q, k: s + bias[h, (torch.log(
        (q - k).abs().float() + 1.0) * 4.0).long()]).score_mod == \
        "s + t0[h, int(log(abs(q - k) * 1.0 + 1.0) * 4.0)]"


def test_tensors_of_unsupported_kinds_are_refused():
    doc64 = torch.zeros(8, dtype=torch.int64)
    refused("dtype torch.int64.*float32 or int32 \\(convert it once: t.int\\(\\)\\)",
            mask_mod=lambda b, h, q, k: doc64[q] == doc64[k])
    wide = torch.zeros(8, dtype=torch.float64)
    refused("dtype torch.float64", score_mod=lambda s, b, h, q, k: s + wide[q])
    flags = torch.zeros(8, dtype=torch.bool)
    refused("dtype torch.bool", mask_mod=lambda b, h, q, k: flags[k])
    four = torch.zeros(2, 2, 2, 2)
    refused("rank 4, shape \\(2, 2, 2, 2\\): aux tensors have 1 to 3 dimensions",
            score_mod=lambda s, b, h, q, k: s + four[b, h, q, k])
    bias = torch.zeros(4, 8)
    refused("read with 1 index", score_mod=lambda s, b, h, q, k: s + bias[h])
    refused("read with 3 indices", score_mod=lambda s, b, h, q, k: s + bias[b, h, q])
    refused("used as a value", score_mod=lambda s, b, h, q, k: s + bias)
    refused("indexed with a float", score_mod=lambda s, b, h, q, k: s + bias[h, q / 2])
    assert translate(score_mod=lambda s, b, h, q, k: s + bias[h, q // 2]).score_mod == \
        "s + t0[h, floordiv(q, 2)]"  # // of ints is an int: an index
    refused("with slice", score_mod=lambda s, b, h, q, k: s + bias[h, :].sum())


def test_data_dependent_and_uncaptured_tensors_are_refused():
    bias = torch.zeros(4, 8)
    refused("torch.Tensor.max on a tensor", score_mod=lambda s, b, h, q, k: s + bias.max())
    refused("torch.arange is not translated",
            score_mod=lambda s, b, h, q, k: s + torch.arange(8.0)[q])
    refused("torch.Tensor.(__)?mul(__)? on a tensor",
            score_mod=lambda s, b, h, q, k: s + (bias * 2)[h, q])
    refused("torch.tanh on a tensor", score_mod=lambda s, b, h, q, k: s + torch.tanh(bias)[h, q])
    refused("new_full of shape \\(4, 8\\)",
            score_mod=lambda s, b, h, q, k: s.new_full((4, 8), 1.0))
    temperature = torch.tensor(2.0)  # a captured scalar may be computed with
    assert translate(score_mod=lambda s, b, h, q, k: s / (temperature * 2)).score_mod == \
        "s / (t0[0] * 2)"


def test_captures_of_unknown_types_are_refused():
    holder = Holder()
    refused("bound method of a Holder", score_mod=holder.score)
    refused("captures 'holder', a Holder", score_mod=lambda s, b, h, q, k: s + holder.bias[h, q])
    ns = types.SimpleNamespace(x=1)
    refused("captures 'ns', a SimpleNamespace", mask_mod=lambda b, h, q, k: q >= ns.x)


def test_callable_objects_are_refused():
    class Mod(torch.nn.Module):
        def forward(self, s, b, h, q, k):
            return s
    refused("score_mod is a Mod object: pass a function", score_mod=Mod())


def test_wrong_results_and_signatures_are_refused():
    refused("score_mod .* returned a condition", score_mod=lambda s, b, h, q, k: q >= k)
    refused("mask_mod .* returned a int", mask_mod=lambda b, h, q, k: q - k)
    refused("takes \\(score, b, h, q_idx, kv_idx\\)", score_mod=lambda s, b: s)
    refused("outside int32", score_mod=lambda s, b, h, q, k: s + (q + 2 ** 40))
    refused("NaN", score_mod=lambda s, b, h, q, k: s + float("nan"))
    refused("outside float32's range", score_mod=lambda s, b, h, q, k: s * 1e300)
    with pytest.raises(TypeError, match="score_mod: int"):
        translate(score_mod=3)
    with pytest.raises(TypeError, match="aux: list"):
        translate(score_mod="s", aux=[torch.zeros(2)])


# ---- what is kept ----------------------------------------------------------------------

counter = types.ModuleType("counter")
counter.traces = 0


def make_rel(bias, scale):
    def rel(score, b, h, q_idx, kv_idx):
        counter.traces += 1
        return score * scale + bias[h, q_idx - kv_idx]
    return rel


def test_translations_are_kept_per_code_and_captures():
    _expressions.cache_clear()
    bias = torch.randn(4, 8)
    before = counter.traces
    first = translate(score_mod=make_rel(bias, 0.5))
    again = translate(score_mod=make_rel(bias, 0.5))  # a new closure, the same captures
    assert counter.traces == before + 1
    assert again.score_mod == first.score_mod == "s * 0.5 + t0[h, q - k]"
    assert again.aux["t0"] is bias
    other = torch.randn(4, 8)  # another tensor of the same shape: traced again, same text
    third = translate(score_mod=make_rel(other, 0.5))
    assert counter.traces == before + 2
    assert third.score_mod == first.score_mod and third.aux["t0"] is other
    fourth = translate(score_mod=make_rel(bias, 0.25))  # another number: another text
    assert fourth.score_mod == "s * 0.25 + t0[h, q - k]" and counter.traces == before + 3
    fifth = translate(score_mod=make_rel(bias.double().float().reshape(2, 16).reshape(4, 8), 0.5))
    assert fifth.score_mod == first.score_mod
    assert translate(score_mod=make_rel(bias, 0.5)).aux["t0"] is bias


def test_kept_translations_do_not_keep_their_tensors_alive():
    import gc
    import weakref
    _expressions.cache_clear()
    bias = torch.randn(4, 8, requires_grad=True) * 2  # with an autograd graph behind it
    ref = weakref.ref(bias)
    assert translate(score_mod=make_rel(bias, 0.5)).score_mod == "s * 0.5 + t0[h, q - k]"
    del bias
    gc.collect()
    assert ref() is None
    before = counter.traces
    fresh = torch.randn(4, 8)  # may take the dead tensor's id: traced anew all the same
    assert translate(score_mod=make_rel(fresh, 0.5)).aux["t0"] is fresh
    assert counter.traces == before + 1


def test_canonical_form_makes_spellings_share_a_kernel():
    ctx = flashgen.Context("a100")
    names = set()
    for text in ("s + bias[h, q - k]", "(s+bias[h,(q-k)])", "s + (bias[h, q - k])"):
        spec = flashgen.make_spec(64, "fp16", score_mod=text, aux=[("bias", "float32", 2)])
        names.add(ctx.plan(spec, "forward")["kernel_name"])
    assert len(names) == 1 and "_s" in names.pop()
    spec = flashgen.make_spec(64, "fp16", score_mod="s + bias[h, k - q]",
                              aux=[("bias", "float32", 2)])
    other = ctx.plan(spec, "forward")["kernel_name"]
    spec = flashgen.make_spec(64, "fp16", mask_mod="doc[q] == doc[k]", aux=[("doc", "int32", 1)])
    assert "_m" in ctx.plan(spec, "backward")["kernel_name"]
    assert other not in names


# ---- the library's errors and the checks -----------------------------------------------------

def test_parse_errors_are_value_errors_with_the_column():
    with pytest.raises(ValueError, match="score_mod: column 15: unexpected character ';'"):
        _native.check_expressions("s + bias[h, q]; system(1)", None, [("bias", 0, 2)])
    with pytest.raises(ValueError, match="score_mod: column 13: index 2 of 'bias' must be int"):
        _native.check_expressions("s + bias[h, 1.5]", None, [("bias", 0, 2)])
    with pytest.raises(ValueError, match="mask_mod: column 1: a mask must give bool"):
        _native.check_expressions(None, "q - k", [])
    with pytest.raises(flashgen.InvalidArgument, match="unknown name 'nope'"):
        _native.check_expressions("s + nope", None, [])


class T:
    def __init__(self, *shape, dtype="float32", device="cuda:0"):
        self.shape, self.dtype, self.device = tuple(shape), dtype, Device(device)

    def dim(self):
        return len(self.shape)


class Strided(T):
    def __init__(self, shape, strides):
        super().__init__(*shape)
        self._strides = strides

    def stride(self):
        return self._strides


Q = T(2, 8, 4, 64, dtype="float16")


def test_expression_checks_pass_and_declare():
    decls = _checks.expressions("s + bias[h, q]", "doc[q] == doc[k]", ("bias", "doc"),
                                (T(4, 8), T(8, dtype="int32")), Q, "float32", "int32")
    assert decls == (("bias", 0, 2), ("doc", 1, 1))
    assert _checks.expressions(None, None, (), (), Q, "float32", "int32") == ()


@pytest.mark.parametrize("args, kw, exc, match", [
    (("s", None, (), ()), dict(softcap=30.0), ValueError, "replaces softcap"),
    (("s", None, (), ()), dict(alibi_slopes=T(4)), ValueError, "replaces alibi_slopes"),
    ((None, "q >= k", (), ()), dict(softcap=30.0), None, None),  # a mask keeps the cap
    ((None, None, ("bias",), (T(4),)), {}, ValueError, "aux: bias given, but no score_mod"),
    (("s", None, ("1x",), (T(4),)), {}, ValueError, "aux: name '1x'"),
    (("s", None, ("a" * 33,), (T(4),)), {}, ValueError, "at most 32 characters"),
    (("s", None, ("seqlen_q",), (T(4),)), {}, ValueError, "'seqlen_q' is the language's own"),
    (("s", None, ("bias",), ([1.0],)), {}, TypeError, "aux\\['bias'\\]: list"),
    (("s", None, ("bias",), (T(4, dtype="float16"),)), {}, TypeError,
     "aux\\['bias'\\]: float16; aux tensors are torch.float32 or torch.int32"),
    (("s", None, ("bias",), (T(1, 2, 3, 4),)), {}, ValueError, "4-D, shape \\(1, 2, 3, 4\\)"),
    (("s", None, ("bias",), (T(),)), {}, ValueError, "0-D"),
    (("s", None, ("bias",), (T(4, device="cpu"),)), {}, ValueError,
     "aux\\['bias'\\]: on cpu, but q is on cuda:0"),
    (("s", None, ("bias",), (T(1 << 31),)), {}, ValueError, "fewer than 2\\^31 elements"),
    (("s", None, ("bias",), (T(1 << 16, 1 << 15),)), {}, ValueError, "fewer than 2\\^31"),
    (("s", None, ("bias",), (Strided((4, 1 << 30), (1 << 30, 1)),)), {}, ValueError,
     "strides \\(1073741824, 1\\); the kernels read tensors of fewer than 2\\^31"),
    (("s", None, tuple(f"a{i}" for i in range(9)), (T(4),) * 9), {}, ValueError,
     "9 tensors .*; at most 8"),
    ((3, None, (), ()), {}, TypeError, "score_mod: int"),
])
def test_bad_expression_arguments(args, kw, exc, match):
    if exc is None:
        _checks.expressions(*args, Q, "float32", "int32", **kw)
        return
    with pytest.raises(exc, match=match):
        _checks.expressions(*args, Q, "float32", "int32", **kw)


def test_operators_take_the_expressions_last():
    from flashgen import _ops
    for name in ("forward", "backward", "varlen_forward", "varlen_backward", "kvcache_forward"):
        schema = str(getattr(_ops, name)._opoverload._schema)
        tail = 'str score_mod="", str mask_mod="", str aux_names="", Tensor[]? aux=None'
        assert tail in schema, schema
        assert schema.index("Tensor? sinks=None") < schema.index(tail)
    assert str(_ops.backward._opoverload._schema).endswith(
        "Tensor[]? aux=None, SymInt aux_grads=0) -> (Tensor, Tensor, Tensor, Tensor, Tensor[])")


def test_flex_attention_signature_is_torchs():
    import inspect
    flex = pytest.importorskip("torch.nn.attention.flex_attention")
    ours = inspect.signature(flashgen.flex_attention).parameters
    theirs = inspect.signature(flex.flex_attention).parameters
    assert list(ours) == list(theirs)
    assert all(ours[n].default == theirs[n].default and ours[n].kind == theirs[n].kind
               for n in ours)


def test_flex_attention_refuses_what_it_cannot_run():
    q = torch.zeros(1, 2, 8, 16, dtype=torch.float16)
    with pytest.raises(ValueError, match="query: on cpu"):
        flashgen.flex_attention(q, q, q)
    with pytest.raises(TypeError, match="query: torch.float32"):
        flashgen.flex_attention(q.float(), q.float(), q.float())
    with pytest.raises(ValueError, match="block_mask: made for seq_lengths \\(16, 16\\)"):
        flashgen._api._block_mask_mod(types.SimpleNamespace(seq_lengths=(16, 16),
                                                            mask_mod=None), 8, 16)
    with pytest.raises(TypeError, match="block_mask: int; expected a BlockMask"):
        flashgen._api._block_mask_mod(3, 8, 16)


def meta(*shape, dtype=torch.float16):
    return torch.empty(*shape, device="meta", dtype=dtype)


OPTIONS = (0, 0, -1, -1, 0.0, 0.0, 0, 0, 0, 0, 0, False)  # no mask, nothing else


def test_fake_operators_shape_the_aux_gradients_and_check_the_texts():
    """The operators' fake (meta) functions, as torch.compile traces them:
    the outputs' shapes, a gradient per aux tensor (empty where not asked
    for or not a float), and the library's check of the texts."""
    q, bias, doc = meta(2, 10, 4, 64), meta(4, 19, dtype=torch.float32), \
        meta(10, dtype=torch.int32)
    exprs = ("s + bias[h, q - k + 9]", "doc[q] == doc[k]", "bias,doc", [bias, doc])
    out, lse, rng = torch.ops.flashgen.forward(q, q, q, *OPTIONS, 0.0, None, None, *exprs)
    assert out.shape == q.shape and lse.shape == (2, 4, 10)
    *grads, d_aux = torch.ops.flashgen.backward(out, q, q, q, out, lse, rng, *OPTIONS, 0.0, None,
                                                None, *exprs, 0b11)
    assert [tuple(g.shape) for g in grads] == [q.shape] * 3 + [(0,)]
    assert [tuple(g.shape) for g in d_aux] == [(4, 19), (0,)]  # doc holds ints: none
    *_, d_aux = torch.ops.flashgen.backward(out, q, q, q, out, lse, rng, *OPTIONS, 0.0, None,
                                            None, *exprs, 0)
    assert [tuple(g.shape) for g in d_aux] == [(0,), (0,)]
    with pytest.raises(ValueError, match="score_mod: column 5: 'bias' has rank 1"):
        torch.ops.flashgen.forward(q, q, q, *OPTIONS, 0.0, None, None, "s + bias[h, q - k]", "",
                                   "bias", [doc.float()])
    packed = meta(30, 4, 64)
    cu = meta(3, dtype=torch.int32)
    out, lse, rng = torch.ops.flashgen.varlen_forward(packed, packed, packed, cu, cu, None, 20,
                                                      20, *OPTIONS[:5], 0.0, False, 0.0, None,
                                                      None, *exprs)
    assert out.shape == packed.shape and lse.shape == (4, 30)
    cache = meta(2, 50, 4, 64)
    out, lse = torch.ops.flashgen.kvcache_forward(q[:, :1], cache, cache, None, None, None, None,
                                                  0, 0, -1, -1, 0.0, 0, 0.0, None, None, *exprs)
    assert out.shape == (2, 1, 4, 64)


def test_a_block_masks_mask_mod_is_traced():
    from torch.nn.attention.flex_attention import create_block_mask

    doc = torch.arange(100, dtype=torch.int32) // 30

    def mask(b, h, q_idx, kv_idx):
        return (q_idx >= kv_idx) & (doc[q_idx] == doc[kv_idx])

    block_mask = create_block_mask(mask, None, None, 100, 100, device="cpu")
    mod = flashgen._api._block_mask_mod(block_mask, 100, 100)
    assert translate(mask_mod=mod) == (None, "q >= k && t0[q] == t0[k]", {"t0": doc})
    with pytest.raises(ValueError, match="made for seq_lengths \\(100, 100\\), but query has "
                                         "64 rows and key 100"):
        flashgen._api._block_mask_mod(block_mask, 64, 100)

"""Argument checks of attention() and scaled_dot_product_attention(), on
stand-in tensors (shape, dtype, device), so they run without PyTorch."""
import pytest

from flashgen import _checks


class Device:
    def __init__(self, name):
        self.type, _, index = name.partition(":")
        self.index = int(index) if index else None

    def __eq__(self, other):
        return (self.type, self.index) == (other.type, other.index)

    def __str__(self):
        return self.type if self.index is None else f"{self.type}:{self.index}"


class Dtype:
    def __init__(self, name):
        self.name = name

    def __eq__(self, other):
        return self.name == other.name

    def __str__(self):
        return f"torch.{self.name}"


class T:
    def __init__(self, *shape, dtype="float16", device="cuda:0"):
        self.shape, self.dtype, self.device = tuple(shape), Dtype(dtype), Device(device)

    def dim(self):
        return len(self.shape)


NAMES = ("q", "k", "v")
HALF = (Dtype("float16"), Dtype("bfloat16"))


def test_good_tensors_pass():
    _checks.tensors(NAMES, (T(2, 5, 8, 64), T(2, 7, 2, 64), T(2, 7, 2, 64)), "bshd", HALF)
    _checks.bshd_shapes(NAMES, (2, 5, 8, 64), (2, 7, 2, 64), (2, 7, 2, 64))


@pytest.mark.parametrize("d, dv", [(192, 128), (128, 64), (64, 128), (96, 64), (256, 128),
                                   (1, 256), (256, 1), (72, 40)])
def test_a_value_head_dim_of_its_own_passes(d, dv):
    """v's head dim (the output's) need not be q's and k's: DeepSeek's
    192/128 and any other pair in 1..256 (the library plans them all)."""
    _checks.bshd_shapes(NAMES, (2, 5, 8, d), (2, 7, 2, d), (2, 7, 2, dv))
    _checks.packed_shapes((300, 8, d), (200, 2, d), (200, 2, dv))


@pytest.mark.parametrize("ts, exc, match", [
    ((T(2, 5, 8, 64), "k", T(2, 5, 8, 64)), TypeError, "k: str"),
    ((T(2, 5, 8, 64), T(5, 8, 64), T(2, 5, 8, 64)), ValueError, "k: 3-D; expected 4-D"),
    ((T(2, 5, 8, 64), T(2, 5, 8, 64, dtype="bfloat16"), T(2, 5, 8, 64)), TypeError,
     "k: torch.bfloat16, but q is torch.float16"),
    ((T(2, 5, 8, 64), T(2, 5, 8, 64), T(2, 5, 8, 64, device="cuda:1")), ValueError,
     "v: on cuda:1, but q is on cuda:0"),
    ((T(2, 5, 8, 64, dtype="float32"),) * 3, TypeError, "q: torch.float32"),
    ((T(2, 5, 8, 64, device="cpu"),) * 3, ValueError, "q: on cpu; flashgen runs on CUDA"),
])
def test_bad_tensors(ts, exc, match):
    with pytest.raises(exc, match=match):
        _checks.tensors(NAMES, ts, "bshd", HALF)


def test_shapes_are_checked_apart_from_dtypes_and_devices():
    """ranks, then the shapes, then kinds: tensors() split, so that a shape
    is named before a device (CPU tensors reach the shape checks)."""
    cpu = (T(2, 5, 8, 64, device="cpu"), T(2, 7, 2, 64, device="cpu"),
           T(2, 6, 2, 32, device="cpu"))
    _checks.ranks(NAMES, cpu, "bshd")
    with pytest.raises(ValueError, match="v: shape"):
        _checks.bshd_shapes(NAMES, *(t.shape for t in cpu))
    _checks.agree(NAMES, cpu)
    with pytest.raises(ValueError, match="q: on cpu; flashgen runs on CUDA"):
        _checks.kinds(NAMES, cpu, HALF)
    with pytest.raises(ValueError, match="k: 3-D; expected 4-D"):
        _checks.ranks(NAMES, (cpu[0], T(5, 8, 64), cpu[2]), "bshd")
    with pytest.raises(TypeError, match="k: torch.bfloat16, but q is torch.float16"):
        _checks.agree(NAMES, (cpu[0], T(2, 7, 2, 64, dtype="bfloat16", device="cpu")))


def test_padding_mask_and_position_ids():
    q = T(2, 8, 6, 64)  # (B, H, S, D), as the transformers integration passes it
    _checks.padding_mask(T(2, 6, dtype="int64"), 6, q)
    _checks.padding_mask(T(2, 9, dtype="bool"), 1, q)
    with pytest.raises(ValueError, match="attention_mask: on cpu, but q is on cuda:0"):
        _checks.padding_mask(T(2, 6, dtype="int64", device="cpu"), 6, q)
    with pytest.raises(ValueError, match="q: 7 rows, but attention_mask has 6 keys"):
        _checks.padding_mask(T(2, 6, dtype="int64"), 7, q)
    _checks.position_ids(T(2, 6, dtype="int64"), 2, 6, q)
    _checks.position_ids(T(1, 6, dtype="int64"), 2, 6, q)
    with pytest.raises(ValueError, match=r"position_ids: shape \(2, 5\); expected \(batch 2, 6\)"):
        _checks.position_ids(T(2, 5, dtype="int64"), 2, 6, q)
    with pytest.raises(ValueError, match="position_ids: on cuda:1, but q is on cuda:0"):
        _checks.position_ids(T(1, 6, dtype="int64", device="cuda:1"), 2, 6, q)


@pytest.mark.parametrize("q, k, v, match", [
    ((2, 5, 8, 64), (2, 7, 2, 64), (2, 6, 2, 64), "v: shape"),
    ((2, 5, 8, 64), (3, 7, 2, 64), (3, 7, 2, 64), "k: batch 3"),
    ((2, 5, 8, 64), (2, 7, 2, 32), (2, 7, 2, 32), "head dim 32"),
    ((2, 5, 8, 264), (2, 7, 2, 264), (2, 7, 2, 264), "head dim 264; flashgen supports 1..256"),
    # the value's own head dim: its range, and the rest of its shape against k's
    ((2, 5, 8, 64), (2, 7, 2, 64), (2, 7, 2, 300), "v: head dim 300; flashgen supports 1..256"),
    ((2, 5, 8, 64), (2, 7, 2, 64), (2, 7, 2, 0), "v: head dim 0; flashgen supports 1..256"),
    ((2, 5, 8, 64), (2, 7, 2, 64), (2, 7, 1, 32),
     r"v: shape \(2, 7, 1, 32\) differs from k's \(2, 7, 2, 64\) \(as B, S, H, D\)"),
    ((2, 5, 8, 64), (2, 7, 3, 64), (2, 7, 3, 64), "k: 3 heads; the query heads \\(8\\)"),
])
def test_bad_shapes(q, k, v, match):
    with pytest.raises(ValueError, match=match):
        _checks.bshd_shapes(NAMES, q, k, v)


def test_options():
    assert _checks.options(False, "bottom-right", None, 0.0, None) == (0, 0, -1, -1, 0.0, 0.0)
    assert _checks.options(True, "top-left", None, 0.1, 0.5) == (1, 1, -1, -1, 0.1, 0.5)
    assert _checks.options(False, "bottom-right", (4, 2), 0, None)[:4] == (2, 0, 4, 2)
    assert _checks.options(True, "bottom-right", (4, -1), 0, None)[:4] == (2, 0, 4, 0)
    # sides past int32 (wider than any call's keys) reach the library as its widest
    assert _checks.options(False, "bottom-right", (2**40, 2**31), 0, None)[:4] == \
        (2, 0, 2**31 - 1, 2**31 - 1)


@pytest.mark.parametrize("args, match", [
    ((False, "middle", None, 0.0, None), "align: 'middle'; valid: 'bottom-right', 'top-left'"),
    ((False, "bottom-right", 3, 0.0, None), "window: 3"),
    ((False, "bottom-right", (-2, 0), 0.0, None), "window: \\(-2, 0\\)"),
    ((True, "bottom-right", (4, 2), 0.0, None), "with causal=True it must be 0 or -1"),
    ((False, "bottom-right", None, 1.0, None), "dropout_p: 1.0; must be in \\[0, 1\\)"),
    ((False, "bottom-right", None, -0.1, None), "dropout_p"),
    ((False, "bottom-right", None, 0.0, 0.0), "softmax_scale: 0.0"),
    ((False, "bottom-right", None, 0.0, float("nan")), "softmax_scale: nan"),
])
def test_bad_options(args, match):
    with pytest.raises(ValueError, match=match):
        _checks.options(*args)


def cap(major, minor):
    return lambda device: (major, minor)


def test_sdpa_fallback_reasons():
    q = T(2, 8, 5, 64)
    assert _checks.sdpa_fallback(q, q, q, None, None, HALF, cap(9, 0)) is None
    cases = [
        ((q, q, q, T(5, 5), None, HALF, cap(9, 0)), "attn_mask"),
        ((T(8, 5, 64), q, q, None, None, HALF, cap(9, 0)), "4-D"),
        ((T(2, 8, 5, 64, device="cpu"),) * 3 + (None, None, HALF, cap(9, 0)), "cpu"),
        ((T(2, 8, 5, 64, dtype="float32"),) * 3 + (None, None, HALF, cap(9, 0)), "float32"),
        ((q, T(2, 8, 5, 32), q, None, None, HALF, cap(9, 0)), "key's head dim"),
        ((T(2, 8, 5, 512),) * 3 + (None, None, HALF, cap(9, 0)), "head dim 512"),
        ((q, q, T(2, 8, 5, 512), None, None, HALF, cap(9, 0)), "value head dim 512"),
        ((q, T(1, 8, 5, 64), T(1, 8, 5, 64), None, None, HALF, cap(9, 0)), "broadcast"),
        ((q, q, q, None, 0.0, HALF, cap(9, 0)), "scale=0.0"),
        ((T(2, 8, 5, 64, dtype="bfloat16"),) * 3 + (None, None, HALF, cap(7, 5)), "sm_75"),
        ((q, q, q, None, None, HALF, cap(7, 0)), "sm_70"),
    ]
    for args, match in cases:
        reason = _checks.sdpa_fallback(*args)
        assert reason is not None and match in reason, (match, reason)


@pytest.mark.parametrize("d, dv", [(192, 128), (128, 64), (64, 128), (32, 256)])
def test_sdpa_takes_a_value_head_dim_of_its_own(d, dv):
    q, k = T(2, 8, 5, d), T(2, 2, 7, d)
    assert _checks.sdpa_fallback(q, k, T(2, 2, 7, dv), None, None, HALF, cap(9, 0)) is None
    assert _checks.sdpa_fallback(q, k, T(2, 2, 7, dv), None, 0.1, HALF, cap(7, 5)) is None


def test_gqa_heads():
    _checks.gqa_heads(8, 8, False)
    _checks.gqa_heads(8, 2, True)
    with pytest.raises(ValueError, match="enable_gqa=True"):
        _checks.gqa_heads(8, 2, False)
    with pytest.raises(ValueError, match="multiple"):
        _checks.gqa_heads(8, 3, True)


# ---- attention_varlen --------------------------------------------------------

INT32 = Dtype("int32")


def test_packed_tensors_and_shapes():
    q, k = T(300, 4, 64), T(200, 2, 64)
    _checks.tensors(NAMES, (q, k, k), "(total, H, D)", HALF, rank=3)
    _checks.packed_shapes(q.shape, k.shape, k.shape)
    with pytest.raises(ValueError, match=r"q: 4-D; expected 3-D \(\(TOTAL, H, D\)\)"):
        _checks.tensors(NAMES, (T(1, 300, 4, 64), k, k), "(total, H, D)", HALF, rank=3)
    _checks.packed_shapes(q.shape, k.shape, (200, 2, 32))  # a value head dim of its own
    with pytest.raises(ValueError, match=r"v: shape \(200, 3, 32\) differs from k's \(200, 2, "
                                         r"64\) \(as total, H, D\)"):
        _checks.packed_shapes(q.shape, k.shape, (200, 3, 32))
    with pytest.raises(ValueError, match="v: shape"):
        _checks.packed_shapes(q.shape, k.shape, (100, 2, 64))
    with pytest.raises(ValueError, match="v: head dim 257; flashgen supports 1..256"):
        _checks.packed_shapes(q.shape, k.shape, (200, 2, 257))
    with pytest.raises(ValueError, match="k: head dim 32"):
        _checks.packed_shapes(q.shape, (200, 2, 32), (200, 2, 32))
    with pytest.raises(ValueError, match="k: 3 heads"):
        _checks.packed_shapes(q.shape, (200, 3, 64), (200, 3, 64))


def test_seqlens():
    q = T(300, 4, 64)
    _checks.seqlens("cu_seqlens_q", T(5, dtype="int32"), None, q, INT32)
    _checks.seqlens("seqused_k", T(4, dtype="int32"), 4, q, INT32)
    with pytest.raises(ValueError, match="cu_seqlens_q: on cpu, but q is on cuda:0"):
        _checks.seqlens("cu_seqlens_q", T(5, dtype="int32", device="cpu"), None, q, INT32)
    with pytest.raises(TypeError, match="cu_seqlens_k: torch.int64; expected torch.int32"):
        _checks.seqlens("cu_seqlens_k", T(5, dtype="int64"), 5, q, INT32)
    with pytest.raises(ValueError, match="cu_seqlens_k: 4 entries; expected 5"):
        _checks.seqlens("cu_seqlens_k", T(4, dtype="int32"), 5, q, INT32)
    with pytest.raises(ValueError, match="cu_seqlens_q: 1 entries; expected batch"):
        _checks.seqlens("cu_seqlens_q", T(1, dtype="int32"), None, q, INT32)
    with pytest.raises(ValueError, match="seqused_k: 2-D"):
        _checks.seqlens("seqused_k", T(4, 1, dtype="int32"), 4, q, INT32)
    with pytest.raises(TypeError, match="cu_seqlens_q: list"):
        _checks.seqlens("cu_seqlens_q", [0, 5], None, q, INT32)
    _checks.max_seqlen("max_seqlen_q", 0)
    for bad in (-1, 1.5, True, 1 << 31):
        with pytest.raises(ValueError, match="max_seqlen_k"):
            _checks.max_seqlen("max_seqlen_k", bad)


# ---- attention_with_kvcache: the rows a step needs against the cache's -----------

def test_kvcache_takes_a_value_head_dim_of_its_own():
    """v_cache and new v rows of a value head dim of their own (DeepSeek's
    192/128) pass; one off the decode family's multiples of 8, or new v rows
    unlike the cache's, are a ValueError naming the dims, before any
    kernel."""
    q, k_cache = T(2, 1, 8, 192), T(2, 64, 2, 192)
    _checks.kvcache_shapes(q, k_cache, T(2, 64, 2, 192), None, None, False)
    _checks.kvcache_shapes(q, k_cache, T(2, 64, 2, 128), None, None, False)
    _checks.kvcache_shapes(q, T(9, 16, 2, 192), T(9, 16, 2, 128), None, None, True)
    _checks.kvcache_shapes(q, k_cache, T(2, 64, 2, 64), T(2, 3, 2, 192), T(2, 3, 2, 64), False)
    with pytest.raises(ValueError, match=r"v_cache: value head dim 100; a decoding step takes "
                                         r"multiples of 8 up to 256"):
        _checks.kvcache_shapes(q, k_cache, T(2, 64, 2, 100), None, None, False)
    with pytest.raises(ValueError, match="v_cache: value head dim 264; a decoding step"):
        _checks.kvcache_shapes(q, T(9, 16, 2, 192), T(9, 16, 2, 264), None, None, True)
    with pytest.raises(ValueError, match="v: value head dim 64, but v_cache has 128"):
        _checks.kvcache_shapes(q, k_cache, T(2, 64, 2, 128), T(2, 3, 2, 192), T(2, 3, 2, 64),
                               False)
    # the rest of the shape first, with its message
    with pytest.raises(ValueError, match=r"v_cache: shape \(2, 60, 2, 128\) differs from "
                                         r"k_cache's \(2, 64, 2, 192\) \(only the head dims"):
        _checks.kvcache_shapes(q, k_cache, T(2, 60, 2, 128), None, None, False)
    with pytest.raises(ValueError, match=r"v: shape \(2, 2, 2, 64\) differs from k's"):
        _checks.kvcache_shapes(q, k_cache, k_cache, T(2, 3, 2, 192), T(2, 2, 2, 64), False)


def test_kvcache_room():
    _checks.kvcache_room((2, 100, 2, 64), None, 5, 95)  # a contiguous cache filled to the last row
    _checks.kvcache_room((40, 16, 2, 64), 4, 0, 64)     # 4 pages of 16 rows, all held
    _checks.kvcache_room((2, 100, 2, 64), None, 100)    # a tensor's lengths: only the new rows


@pytest.mark.parametrize("shape, pages, new, cached, match", [
    # 98 cached keys and 5 new rows in a 100-row cache
    ((2, 100, 2, 64), None, 5, 98,
     "cache_seqlens: 98 and 5 new rows make 103 keys; the cache holds 100 rows per sequence"),
    ((2, 100, 2, 64), None, 0, 101, "cache_seqlens: 101; the cache holds 100 rows"),
    ((2, 100, 2, 64), None, 101, None, "k: 101 new rows; the cache holds 100 rows"),
    ((2, 100, 2, 64), None, 101, 0, "k: 101 new rows"),
    ((40, 16, 2, 64), 4, 1, 64, r"cache_seqlens: 64 and 1 new rows make 65 keys; a sequence's "
                                r"4 pages \(block_table\) of 16 rows hold 64"),
    ((40, 16, 2, 64), 4, 65, None, "k: 65 new rows; a sequence's 4 pages"),
])
def test_kvcache_past_the_room(shape, pages, new, cached, match):
    with pytest.raises(ValueError, match=match):
        _checks.kvcache_room(shape, pages, new, cached)


# ---- the scores' variants: softcap, alibi_slopes, sinks ------------------------

FP32 = Dtype("float32")


def variants(softcap=None, alibi_slopes=None, sinks=None, q=None):
    q = q or T(2, 77, 4, 64)  # (B, S, Hq, D): batch 2, 4 query heads
    return _checks.variants(softcap, alibi_slopes, sinks, q, 2, 4, FP32)


def test_variants_pass():
    assert variants() == 0.0
    assert variants(softcap=30) == 30.0 and isinstance(variants(softcap=30), float)
    assert variants(softcap=0.5, alibi_slopes=T(4, dtype="float32"),
                    sinks=T(4, dtype="float32")) == 0.5
    assert variants(alibi_slopes=T(2, 4, dtype="float32")) == 0.0


@pytest.mark.parametrize("cap, exc, match", [
    (0, ValueError, "softcap: 0; must be finite and > 0 \\(None: no cap\\)"),
    (0.0, ValueError, "softcap: 0.0; must be finite and > 0"),
    (-5.0, ValueError, "softcap: -5.0"),
    (float("inf"), ValueError, "softcap: inf"),
    (float("nan"), ValueError, "softcap: nan"),
    ("30", TypeError, "softcap: '30'; expected a float > 0"),
    (True, TypeError, "softcap: True; expected a float"),
    ([30.0], TypeError, "softcap: \\[30.0\\]"),
])
def test_bad_softcap(cap, exc, match):
    with pytest.raises(exc, match=match):
        variants(softcap=cap)


@pytest.mark.parametrize("slopes, exc, match", [
    (T(4, dtype="float16"), TypeError, "alibi_slopes: torch.float16; expected torch.float32"),
    (T(4, dtype="float64"), TypeError, "alibi_slopes: torch.float64"),
    (T(5, dtype="float32"), ValueError,
     "alibi_slopes: shape \\(5,\\); expected \\(4,\\) or \\(batch 2, 4\\)"),
    (T(3, 4, dtype="float32"), ValueError, "alibi_slopes: shape \\(3, 4\\)"),
    (T(2, 4, 1, dtype="float32"), ValueError, "alibi_slopes: shape \\(2, 4, 1\\)"),
    (T(1, 4, dtype="float32"), ValueError, "alibi_slopes: shape \\(1, 4\\)"),
    (T(4, dtype="float32", device="cpu"), ValueError,
     "alibi_slopes: on cpu, but q is on cuda:0"),
    ([0.5, 0.25, 0.125, 0.0625], TypeError, "alibi_slopes: list; expected a torch.Tensor"),
])
def test_bad_alibi_slopes(slopes, exc, match):
    with pytest.raises(exc, match=match):
        variants(alibi_slopes=slopes)


@pytest.mark.parametrize("sinks, exc, match", [
    (T(4, dtype="bfloat16"), TypeError, "sinks: torch.bfloat16; expected torch.float32"),
    (T(2, 4, dtype="float32"), ValueError, "sinks: shape \\(2, 4\\); expected \\(4,\\)"),
    (T(8, dtype="float32"), ValueError, "sinks: shape \\(8,\\)"),
    (T(4, dtype="float32", device="cuda:1"), ValueError, "sinks: on cuda:1, but q is on cuda:0"),
    (1.5, TypeError, "sinks: float; expected a torch.Tensor"),
])
def test_bad_sinks(sinks, exc, match):
    with pytest.raises(exc, match=match):
        variants(sinks=sinks)


def test_variants_checked_in_the_order_given():
    """A bad cap is named before the tensors are looked at."""
    with pytest.raises(ValueError, match="softcap"):
        variants(softcap=-1.0, alibi_slopes="x", sinks="y")
    with pytest.raises(TypeError, match="alibi_slopes"):
        variants(alibi_slopes="x", sinks="y")

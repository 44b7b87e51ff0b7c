"""Which road calls take, with PyTorch and no GPU (the checks and the
library's side replaced by recorders). attention_varlen: a call like an
earlier one skips the checks, any change of shape, strides, dtype, lengths
or options runs them again; a call that wants no gradient goes straight to
the library, one that does through the operator (its autograd formula).
The dense and packed forwards and decoding steps: a call like an earlier one
hands the library the struct that call's full road would build, byte for
byte."""
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed")

import flashgen  # noqa: E402
from flashgen import _api, _native, _ops  # noqa: E402

OPTIONS = (1, 0, -1, -1, 0.0, 0.125)  # mask, align, window left/right, dropout_p, scale


@pytest.fixture
def roads(monkeypatch):
    """Counts of the checks, of direct calls and of operator calls."""
    seen = {"checks": 0, "direct": 0, "operator": 0}

    def checks(*args):
        seen["checks"] += 1
        return OPTIONS, 0.0

    def direct(q, k, v, *args, **kwargs):
        seen["direct"] += 1
        return q.new_zeros(q.shape[:2] + v.shape[2:]), None, 0, 0

    def operator(q, k, v, *args):
        seen["operator"] += 1
        return q.new_zeros(q.shape[:2] + v.shape[2:]), None, None

    monkeypatch.setattr(_api, "_check_varlen", checks)
    monkeypatch.setattr(_api, "_checked", {})
    monkeypatch.setattr(_ops, "run_varlen_forward", direct)
    monkeypatch.setattr(_ops, "varlen_forward", operator)
    return seen


def packed(total_q=60, total_k=90, d=64, dv=64, grad=False):
    q = torch.randn(total_q, 8, d, dtype=torch.float16, requires_grad=grad)
    k = torch.randn(total_k, 2, d, dtype=torch.float16, requires_grad=grad)
    v = torch.randn(total_k, 2, dv, dtype=torch.float16, requires_grad=grad)
    cu_q = torch.tensor([0, 33, total_q], dtype=torch.int32)
    cu_k = torch.tensor([0, 47, total_k], dtype=torch.int32)
    return q, k, v, cu_q, cu_k


def test_checks_once_per_call_shape(roads):
    q, k, v, cu_q, cu_k = packed()
    for _ in range(3):
        out = flashgen.attention_varlen(q, k, v, cu_q, cu_k, 33, 47, causal=True)
    assert out.shape == (60, 8, 64)
    assert roads["checks"] == 1
    changed = [
        lambda: flashgen.attention_varlen(*packed(total_q=61), 33, 47, causal=True),
        lambda: flashgen.attention_varlen(*packed(dv=32), 33, 47, causal=True),
        lambda: flashgen.attention_varlen(q, k, v, cu_q, cu_k, 34, 47, causal=True),
        lambda: flashgen.attention_varlen(q, k, v, cu_q, cu_k, 33, 47, causal=False),
        lambda: flashgen.attention_varlen(q, k, v, cu_q, cu_k, 33, 47, causal=True,
                                          window=(8, 0)),
        lambda: flashgen.attention_varlen(q[:, :, :32], k[:, :, :32], v, cu_q, cu_k, 33, 47,
                                          causal=True),  # other strides
        lambda: flashgen.attention_varlen(q, k, v, cu_q, cu_k, True, 47, causal=True),
        lambda: flashgen.attention_varlen(q.bfloat16(), k.bfloat16(), v.bfloat16(), cu_q, cu_k,
                                          33, 47, causal=True),
    ]
    for n, call in enumerate(changed, start=2):
        call()
        assert roads["checks"] == n, n


@pytest.fixture
def steps(monkeypatch):
    """Counts of a decoding step's checks (they and the library's side
    replaced)."""
    seen = {"checks": 0}

    def checks(*args):
        seen["checks"] += 1
        return 0, 0, -1, -1, 0.125, 0  # mask, align, window left/right, scale, num_splits

    monkeypatch.setattr(_api, "_check_kvcache", checks)
    monkeypatch.setattr(_api, "_checked", {})
    monkeypatch.setattr(_api, "_latest", {})
    monkeypatch.setattr(_ops, "kvcache", lambda q, *args, **kwargs: (q.new_zeros(q.shape), None))
    return seen


def test_a_step_changed_in_place_is_checked_again(steps):
    """A step like the latest takes its key unbuilt, by the tensors' shapes,
    strides, dtypes and devices, not by the objects: the same tensors, one
    of them reshaped in place since, are checked again."""
    q = torch.randn(2, 1, 8, 64, dtype=torch.float16)
    k_cache, v_cache = (torch.randn(2, 100, 2, 64, dtype=torch.float16) for _ in range(2))
    lengths = torch.tensor([50, 90], dtype=torch.int32)
    for _ in range(3):
        flashgen.attention_with_kvcache(q, k_cache, v_cache, cache_seqlens=lengths)
    assert steps["checks"] == 1
    assert list(_api._latest) == (["kvcache"] if _api._TensorGuards is not None else [])
    k_cache.resize_(2, 50, 2, 64)
    flashgen.attention_with_kvcache(q, k_cache, v_cache, cache_seqlens=lengths)
    assert steps["checks"] == 2
    lengths.unsqueeze_(0)
    flashgen.attention_with_kvcache(q, k_cache, v_cache, cache_seqlens=lengths)
    assert steps["checks"] == 3
    flashgen.attention_with_kvcache(q, k_cache, v_cache, cache_seqlens=lengths, causal=True)
    assert steps["checks"] == 4


def test_an_unhashable_option_is_checked_every_call(roads, monkeypatch):
    """A key that cannot be hashed (a window as a list) keeps nothing: the
    call is checked each time and hands no key down."""
    keys = []
    monkeypatch.setattr(_ops, "run_varlen_forward",
                        lambda q, k, v, *args, call_key=None, **kwargs:
                        keys.append(call_key) or (q.new_zeros(q.shape[:2] + v.shape[2:]), None,
                                                  0, 0))
    q, k, v, cu_q, cu_k = packed()
    for _ in range(3):
        flashgen.attention_varlen(q, k, v, cu_q, cu_k, 33, 47, causal=True, window=[8, 0])
    assert roads["checks"] == 3 and keys == [None] * 3
    flashgen.attention_varlen(q, k, v, cu_q, cu_k, 33, 47, causal=True, window=(8, 0))
    flashgen.attention_varlen(q, k, v, cu_q, cu_k, 33, 47, causal=True, window=(8, 0))
    assert roads["checks"] == 4 and keys[3] is not None and keys[4] == keys[3]


def test_no_gradient_goes_straight_to_the_library(roads):
    q, k, v, cu_q, cu_k = packed()
    flashgen.attention_varlen(q, k, v, cu_q, cu_k, 33, 47)
    with torch.no_grad():
        flashgen.attention_varlen(*packed(grad=True), 33, 47)
    assert (roads["direct"], roads["operator"]) == (2, 0)


def test_a_gradient_goes_through_the_operator(roads):
    flashgen.attention_varlen(*packed(grad=True), 33, 47)
    assert (roads["direct"], roads["operator"]) == (0, 1)


class Recorder:
    """A device context that keeps the argument structs it is given (and
    what calls keep, as a context does; split steps need 4 KiB)."""

    def __init__(self):
        self.calls = []
        self.kept = {}

    def keep(self, key, value):
        self.kept[key] = value

    def forward_workspace_size(self, spec, args, sizes=None):
        return 4096

    def forward(self, spec, args):
        self.calls.append((spec, bytes(args)))


@pytest.fixture
def recorder(monkeypatch):
    rec = Recorder()
    monkeypatch.setattr(_native, "device_context", lambda index: rec)
    streams = iter(range(0x1000, 0x2000, 0x10))
    monkeypatch.setattr(_ops, "_stream", lambda index: next(streams))
    # no CUDA here: the stand-in tensors' device (CPU), nothing captured
    monkeypatch.setattr(_ops, "_current_device", lambda: -1)
    monkeypatch.setattr(_ops, "_capturing", lambda: False)
    return rec


CALL = (1, 0, -1, -1, 0.0, 0.125, 0, 0, 0, 0, 0)  # run_forward's options: causal


def tensors(d=64, dv=64, bhsd=False):
    """q (2, 33, 8, d), k (2, 47, 2, d), v (2, 47, 2, dv), fresh; with bhsd
    (B, S, H, D) views of (B, H, S, D) storage."""
    def make(s, h, w):
        if bhsd:
            return torch.randn(2, h, s, w, dtype=torch.float16).transpose(1, 2)
        return torch.randn(2, s, h, w, dtype=torch.float16)
    return make(33, 8, d), make(47, 2, d), make(47, 2, dv)


@pytest.mark.parametrize("d, dv, bhsd, with_lse", [(64, 64, False, True), (192, 128, True, False),
                                                   (40, 72, False, True)])
def test_a_repeated_forward_hands_over_the_full_roads_struct(recorder, d, dv, bhsd, with_lse):
    _ops.run_forward(*tensors(d, dv, bhsd), *CALL, with_lse=with_lse)  # keeps the struct
    q, k, v = tensors(d, dv, bhsd)
    out, lse, _, _ = _ops.run_forward(q, k, v, *CALL, with_lse=with_lse)
    spec, kept = recorder.calls[-1]
    recorder.kept.clear()  # the full road, the same tensors: the struct as built
    out_full, _, _, _ = _ops.run_forward(q, k, v, *CALL, with_lse=with_lse)
    spec_full, full = recorder.calls[-1]
    assert spec is spec_full
    assert (out.shape, out.stride()) == (out_full.shape, out_full.stride())
    args = _native.ForwardArgs.from_buffer_copy(kept)
    assert (args.q.data, args.k.data, args.v.data) == (q.data_ptr(), k.data_ptr(), v.data_ptr())
    assert args.o.data == out.data_ptr() and args.lse == (lse.data_ptr() if with_lse else None)
    # the same struct but for o's data, lse and the stream, which are each call's own
    fresh = _native.ForwardArgs.from_buffer_copy(full)
    for a in (args, fresh):
        a.o.data, a.lse, a.stream = 0, 0, 0
    assert bytes(args) == bytes(fresh)


def test_a_repeated_forward_that_must_copy_takes_the_full_road(recorder):
    _ops.run_forward(*tensors(), *CALL)
    q, k, v = tensors()
    shifted = torch.randn(2 * 47 * 2 * 64 + 4, dtype=torch.float16)[4:].view(2, 47, 2, 64)
    assert shifted.data_ptr() % 16  # the same shape and strides, rows not 16-byte aligned
    _ops.run_forward(q, shifted, v, *CALL)
    args = _native.ForwardArgs.from_buffer_copy(recorder.calls[-1][1])
    assert args.k.data not in (None, shifted.data_ptr())  # read from an aligned copy
    assert args.q.data == q.data_ptr()


@pytest.mark.parametrize("d, dv", [(64, 64), (40, 72)])
def test_heads_first_tensors_are_read_as_their_transposes(recorder, d, dv):
    """(B, H, S, D) tensors (the SDPA drop-in's) need no transposes: the
    struct of a kept call and of the full road are those of the (B, S, H, D)
    views, and out is (B, H, S, Dv) over (B, S, H, Dv) memory."""
    def heads_first():
        return tuple(t.transpose(1, 2) for t in tensors(d, dv, bhsd=True))
    first, _, _, _ = _ops.run_forward(*heads_first(), *CALL, heads_first=True)  # keeps it
    assert first.shape == (2, 8, 33, dv) and first.stride() == (33 * 8 * dv, dv, 8 * dv, 1)
    q, k, v = heads_first()
    out, lse, _, _ = _ops.run_forward(q, k, v, *CALL, heads_first=True)
    assert out.stride() == first.stride()  # not q's (B, H, S, D) strides
    kept = recorder.calls[-1][1]
    recorder.kept.clear()
    _ops.run_forward(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), *CALL)
    full = recorder.calls[-1][1]
    a, b = (_native.ForwardArgs.from_buffer_copy(raw) for raw in (kept, full))
    assert (a.q.data, a.k.data, a.v.data) == (q.data_ptr(), k.data_ptr(), v.data_ptr())
    assert a.o.data == out.data_ptr() and a.lse == lse.data_ptr()
    for x in (a, b):
        x.o.data, x.lse, x.stream = 0, 0, 0
    assert bytes(a) == bytes(b)
    recorder.kept.clear()
    _ops.run_forward(q, k, v, *CALL, heads_first=True)
    _ops.run_forward(q, k, v, *CALL)  # the same tensors read as (B, S, H, D): another call
    assert len(recorder.kept) == 2


def test_a_kept_output_of_the_querys_layout_is_made_like_it(recorder, monkeypatch):
    """Where out has q's shape and strides (q dense: (B, S, H, D) memory, or
    its (B, H, S, D) view), a kept call makes it with torch.empty_like(q),
    which copies q's strides; otherwise with the full road's allocation."""
    made = []
    empty_like = torch.empty_like
    monkeypatch.setattr(torch, "empty_like", lambda t, *a, **kw: made.append(t) or
                        empty_like(t, *a, **kw))
    for heads_first in (False, True):
        def call():
            q, k, v = tensors()
            if heads_first:  # (B, H, S, D) views of (B, S, H, D) memory, as transformers' q
                q, k, v = (t.transpose(1, 2) for t in (q, k, v))
            return q, _ops.run_forward(q, k, v, *CALL, heads_first=heads_first)[0]
        _, first = call()
        made.clear()
        q, out = call()
        assert len(made) == 1 and made[0] is q and (out.shape, out.stride()) == (first.shape, first.stride())
    _ops.run_forward(*tensors(dv=32), *CALL)  # out narrower than q: not like it
    made.clear()
    out = _ops.run_forward(*tensors(dv=32), *CALL)[0]
    assert made == [] and out.shape == (2, 33, 8, 32) and out.is_contiguous()


def test_the_entry_points_key_keeps_the_struct(recorder, monkeypatch):
    """attention() hands its checks' key down: a call like an earlier one
    builds no key and no struct of its own."""
    built = []
    full_road = _ops._call
    monkeypatch.setattr(_ops, "_call", lambda *a, **kw: built.append(1) or full_road(*a, **kw))
    monkeypatch.setattr(_api, "_check", lambda *args: (CALL + (False,), 0.0))
    monkeypatch.setattr(_api, "_checked", {})
    for _ in range(3):
        out = flashgen.attention(*tensors(), causal=True)
    assert built == [1] and out.shape == (2, 33, 8, 64)
    assert list(recorder.kept) == list(_api._checked)  # one key, the checks'
    flashgen.attention(*tensors(bhsd=True), causal=True)  # other strides: another key
    assert built == [1, 1] and len(recorder.kept) == 2


def test_another_call_is_not_served_by_a_kept_struct(recorder):
    _ops.run_forward(*tensors(), *CALL)
    q, k, v = tensors(bhsd=True)  # the same shapes, other strides
    _ops.run_forward(q, k, v, *CALL)
    args = _native.ForwardArgs.from_buffer_copy(recorder.calls[-1][1])
    assert (args.q.stride_seq, args.q.stride_head) == (64, 33 * 64)
    windowed = CALL[:2] + (16, 0) + CALL[4:]
    _ops.run_forward(q, k, v, *windowed)
    args = _native.ForwardArgs.from_buffer_copy(recorder.calls[-1][1])
    assert (args.window_left, args.window_right) == (16, 0)


VARLEN = (1, 0, -1, -1, 0.0, 0.125)  # run_varlen_forward's options: causal


@pytest.mark.parametrize("d, dv, used", [(64, 64, False), (192, 128, True)])
def test_a_repeated_packed_call_hands_over_the_full_roads_struct(recorder, monkeypatch, d, dv,
                                                                 used):
    built = []
    full_road = _ops._packed_call
    monkeypatch.setattr(_ops, "_packed_call", lambda *a: built.append(1) or full_road(*a))

    def call(q, k, v, cu_q, cu_k):
        lengths = torch.tensor([30, 40], dtype=torch.int32) if used else None
        return _ops.run_varlen_forward(q, k, v, cu_q, cu_k, lengths, 33, 47, *VARLEN), lengths
    call(*packed(d=d, dv=dv))  # keeps the struct
    tensors = packed(d=d, dv=dv)
    (out, lse, _, _), lengths = call(*tensors)
    assert len(built) == 1  # the second call built none
    spec, kept = recorder.calls[-1]
    recorder.kept.clear()  # the full road, the same tensors: the struct as built
    _ops.run_varlen_forward(*tensors, lengths, 33, 47, *VARLEN)
    spec_full, full = recorder.calls[-1]
    assert spec is spec_full
    args = _native.ForwardArgs.from_buffer_copy(kept)
    q, k, v, cu_q, cu_k = tensors
    assert (args.q.data, args.k.data, args.v.data) == (q.data_ptr(), k.data_ptr(), v.data_ptr())
    assert (args.cu_seqlens_q, args.cu_seqlens_k) == (cu_q.data_ptr(), cu_k.data_ptr())
    assert args.seqused_k == (lengths.data_ptr() if used else None)
    assert args.o.data == out.data_ptr() and args.lse == lse.data_ptr()
    fresh = _native.ForwardArgs.from_buffer_copy(full)
    for a in (args, fresh):  # each call's own: o's data, lse, the stream
        a.o.data, a.lse, a.stream = 0, 0, 0
    assert bytes(args) == bytes(fresh)


def test_another_packed_call_is_not_served_by_a_kept_struct(recorder):
    q, k, v, cu_q, cu_k = packed()
    _ops.run_varlen_forward(q, k, v, cu_q, cu_k, None, 33, 47, *VARLEN)
    _ops.run_varlen_forward(q, k, v, cu_q, cu_k, None, 40, 47, *VARLEN)  # another longest
    args = _native.ForwardArgs.from_buffer_copy(recorder.calls[-1][1])
    assert args.seqlen_q == 40
    strided = torch.tensor([0, 0, 33, 0, 60, 0], dtype=torch.int32)[::2]
    _ops.run_varlen_forward(q, k, v, strided, cu_k, None, 33, 47, *VARLEN)  # copied: contiguous
    args = _native.ForwardArgs.from_buffer_copy(recorder.calls[-1][1])
    assert args.cu_seqlens_q not in (None, strided.data_ptr())


def step(paged=False, new_rows=0, lengths=True):
    """A decoding step's tensors, fresh: q (3, 2, 8, 64), a cache of 3 x 40
    rows (or 12 pages of 16, 4 a sequence) of 2 KV heads, new rows."""
    h = torch.float16
    q = torch.randn(3, 2, 8, 64, dtype=h)
    shape = (12, 16, 2, 64) if paged else (3, 40, 2, 64)
    kc, vc = torch.randn(shape, dtype=h), torch.randn(shape, dtype=h)
    kn = torch.randn(3, new_rows, 2, 64, dtype=h) if new_rows else None
    vn = torch.randn(3, new_rows, 2, 64, dtype=h) if new_rows else None
    lens = torch.tensor([5, 17, 30], dtype=torch.int32) if lengths else None
    table = torch.randperm(12, dtype=torch.int32).view(3, 4) if paged else None
    return q, kc, vc, kn, vn, lens, table


STEP = (1, 0, -1, -1, 0.125, 0)  # causal, bottom-right, no window, scale, splits chosen


@pytest.mark.parametrize("paged, new_rows, lengths, with_lse", [
    (False, 0, False, True), (True, 2, True, False), (False, 1, True, True)])
def test_a_repeated_step_hands_over_the_full_roads_struct(recorder, paged, new_rows, lengths,
                                                          with_lse):
    _ops.run_kvcache_forward(*step(paged, new_rows, lengths), *STEP, with_lse=with_lse)
    tensors = step(paged, new_rows, lengths)
    out, lse = _ops.run_kvcache_forward(*tensors, *STEP, with_lse=with_lse)
    spec, kept = recorder.calls[-1]
    recorder.kept.clear()
    _ops.run_kvcache_forward(*tensors, *STEP, with_lse=with_lse)
    spec_full, full = recorder.calls[-1]
    assert spec is spec_full
    args = _native.ForwardArgs.from_buffer_copy(kept)
    q, kc, vc, kn, vn, lens, table = tensors
    address = [t.data_ptr() if t is not None else None for t in (q, kc, vc, kn, vn, lens, table)]
    assert [args.q.data, args.k.data, args.v.data, args.k_new.data, args.v_new.data,
            args.cache_seqlens, args.block_table] == address
    assert args.o.data == out.data_ptr() and args.lse == (lse.data_ptr() if with_lse else None)
    assert args.workspace and args.workspace_bytes == 4096
    fresh = _native.ForwardArgs.from_buffer_copy(full)
    for a in (args, fresh):  # each call's own: o's data, lse, the stream, the workspace, counters
        a.o.data, a.lse, a.stream, a.workspace, a.split_counters = 0, 0, 0, 0, 0
    assert bytes(args) == bytes(fresh)


@pytest.mark.parametrize("paged", [False, True])
def test_a_heads_first_step_reads_the_transposes(recorder, paged):
    """A (B, H, S, D) step (transformers' cache): a kept call and the full
    road hand over the struct of the (B, S, H, D) views, and out is (B, Hq,
    Sq, Dv) over (B, Sq, Hq, Dv) memory."""
    def heads_first():
        q, kc, vc, kn, vn, lens, table = step(paged, 1, True)
        q, kc, vc, kn, vn = (t.transpose(1, 2).contiguous() for t in (q, kc, vc, kn, vn))
        return q, kc, vc, kn, vn, lens, table
    _ops.run_kvcache_forward(*heads_first(), *STEP, heads_first=True)  # keeps the struct
    tensors = heads_first()
    out, _ = _ops.run_kvcache_forward(*tensors, *STEP, heads_first=True)
    kept = recorder.calls[-1][1]
    assert out.shape == (3, 8, 2, 64) and out.stride() == (2 * 8 * 64, 64, 8 * 64, 1)
    recorder.kept.clear()
    q, kc, vc, kn, vn, lens, table = tensors
    _ops.run_kvcache_forward(*(t.transpose(1, 2) for t in (q, kc, vc, kn, vn)), lens, table,
                             *STEP)
    a, b = (_native.ForwardArgs.from_buffer_copy(raw) for raw in (kept, recorder.calls[-1][1]))
    assert (a.q.data, a.k.data, a.v.data, a.k_new.data) == (
        q.data_ptr(), kc.data_ptr(), vc.data_ptr(), kn.data_ptr())
    assert a.o.data == out.data_ptr()
    for x in (a, b):
        x.o.data, x.lse, x.stream, x.workspace, x.split_counters = 0, 0, 0, 0, 0
    assert bytes(a) == bytes(b)


def test_another_step_is_not_served_by_a_kept_struct(recorder):
    _ops.run_kvcache_forward(*step(), *STEP)
    q, kc, vc, kn, vn, lens, table = step()
    _ops.run_kvcache_forward(q, kc, vc, kn, vn, None, table, *STEP)  # no lengths now
    args = _native.ForwardArgs.from_buffer_copy(recorder.calls[-1][1])
    assert args.cache_seqlens is None
    strided = torch.zeros(6, dtype=torch.int32)[::2]
    _ops.run_kvcache_forward(q, kc, vc, kn, vn, strided, table, *STEP)  # copied: contiguous
    args = _native.ForwardArgs.from_buffer_copy(recorder.calls[-1][1])
    assert args.cache_seqlens not in (None, strided.data_ptr())


def test_a_repeated_step_that_must_copy_takes_the_full_road(recorder):
    _ops.run_kvcache_forward(*step(new_rows=1), *STEP)
    q, kc, vc, kn, vn, lens, table = step(new_rows=1)
    shifted = torch.randn(3 * 2 * 64 + 4, dtype=torch.float16)[4:].view(3, 1, 2, 64)
    assert shifted.data_ptr() % 16  # k_new's shape and strides, rows not 16-byte aligned
    _ops.run_kvcache_forward(q, kc, vc, shifted, vn, lens, table, *STEP)
    args = _native.ForwardArgs.from_buffer_copy(recorder.calls[-1][1])
    assert args.k_new.data not in (None, shifted.data_ptr())  # written from an aligned copy
    assert args.v_new.data == vn.data_ptr()

"""A value head dim of its own (v's, and the output's: DeepSeek's 192/128)
through the package with PyTorch and no GPU: the spec each call builds and
the widths its argument structs give o, dO and dV (the library's calls
replaced by a recorder), the custom operators' fake implementations (the
shapes torch.compile traces) and their autograd on meta tensors, the API on
fake CUDA tensors (attention in both layouts, attention_varlen, the
drop-in, flex_attention), and decoding steps refused before any kernel.
The kernels themselves are the GPU tests' business (test_gpu_attention,
test_gpu_varlen)."""
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed")

import flashgen  # noqa: E402
from flashgen import _api, _native, _ops  # noqa: E402

F16, BF16 = torch.float16, torch.bfloat16
# mask, align, window_left, window_right, dropout_p, scale, sparsity, block_q,
# block_k, factors, layout_id, deterministic: a causal call
OPTIONS = (1, 0, -1, -1, 0.0, 0.0, 0, 0, 0, 0, 0, False)
# the same without deterministic, as run_forward and run_backward take them
CALL = OPTIONS[:-1]


class Recorder:
    """A device context that records the calls made of it."""

    def __init__(self):
        self.calls = []
        self.kept = {}

    def keep(self, key, value):
        self.kept[key] = value

    def forward(self, spec, args):
        self.calls.append(("forward", spec, args))

    def forward_workspace_size(self, spec, args, sizes=None):
        return 0

    def backward_workspace_size(self, spec, args):
        return 0

    def backward(self, spec, args):
        self.calls.append(("backward", spec, args))


@pytest.fixture
def recorder(monkeypatch):
    rec = Recorder()
    monkeypatch.setattr(_native, "device_context", lambda index: rec)
    monkeypatch.setattr(_ops, "_stream", lambda index: 0)
    return rec


def strides(t):
    """(stride_batch, stride_seq, stride_head) of an fg_tensor."""
    return t.stride_batch, t.stride_seq, t.stride_head


def test_dense_calls_give_o_do_and_dv_the_value_head_dim(recorder):
    q = torch.randn(2, 5, 4, 192, dtype=F16)
    k = torch.randn(2, 7, 2, 192, dtype=F16)
    v = torch.randn(2, 7, 2, 128, dtype=F16)
    out, lse, _, _ = _ops.run_forward(q, k, v, *CALL)
    assert out.shape == (2, 5, 4, 128) and lse.shape == (2, 4, 5)
    (_, spec, args), = recorder.calls
    assert (spec.head_dim, spec.head_dim_v, spec.mask) == (192, 128, 1)
    assert strides(args.q) == (5 * 4 * 192, 4 * 192, 192)
    assert strides(args.k) == (7 * 2 * 192, 2 * 192, 192)
    assert strides(args.v) == (7 * 2 * 128, 2 * 128, 128)
    assert strides(args.o) == (5 * 4 * 128, 4 * 128, 128)
    assert args.o.data == out.data_ptr()
    d_out = torch.randn(2, 5, 4, 128, dtype=F16)
    dq, dk, dv, d_sinks = _ops.run_backward(d_out, q, k, v, out, lse, 0, 0, *CALL, False)
    assert (dq.shape, dk.shape, dv.shape) == (q.shape, k.shape, v.shape) and d_sinks is None
    (_, back_spec, back), = recorder.calls[1:]
    assert back_spec is spec  # the same spec: one kernel pair
    assert strides(back.forward.o) == strides(back.d_o) == (5 * 4 * 128, 4 * 128, 128)
    assert strides(back.d_q) == (5 * 4 * 192, 4 * 192, 192)
    assert strides(back.d_k) == (7 * 2 * 192, 2 * 192, 192)
    assert strides(back.d_v) == (7 * 2 * 128, 2 * 128, 128)
    assert (back.d_v.data, back.d_o.data) == (dv.data_ptr(), d_out.data_ptr())


def test_a_strided_value_is_read_where_it_is(recorder):
    """DeepSeek's value is a slice of a wider projection (its rows 16-byte
    aligned): no copy, its own strides."""
    kv = torch.randn(1, 9, 3, 64 + 128, dtype=BF16)
    q, k = torch.randn(1, 4, 3, 96, dtype=BF16), torch.randn(1, 9, 3, 96, dtype=BF16)
    v = kv[..., 64:]
    out, _, _, _ = _ops.run_forward(q, k, v, *CALL)
    (_, spec, args), = recorder.calls
    assert out.shape == (1, 4, 3, 128) and (spec.head_dim, spec.head_dim_v) == (96, 128)
    assert args.v.data == v.data_ptr() and strides(args.v) == (0, 3 * 192, 192)


def test_packed_calls_give_o_and_dv_the_value_head_dim(recorder):
    q = torch.randn(10, 4, 128, dtype=F16)
    k, v = torch.randn(12, 2, 128, dtype=F16), torch.randn(12, 2, 64, dtype=F16)
    cu_q = torch.tensor([0, 4, 10], dtype=torch.int32)
    cu_k = torch.tensor([0, 5, 12], dtype=torch.int32)
    out, lse, _, _ = _ops.run_varlen_forward(q, k, v, cu_q, cu_k, None, 6, 7, 1, 0, -1, -1, 0.0,
                                             0.0)
    assert out.shape == (10, 4, 64) and lse.shape == (4, 10)
    (_, spec, args), = recorder.calls
    assert (spec.head_dim, spec.head_dim_v, spec.varlen) == (128, 64, 1)
    assert (args.total_q, args.total_k) == (10, 12)
    assert strides(args.o)[1:] == (4 * 64, 64) and strides(args.v)[1:] == (2 * 64, 64)
    d_out = torch.randn(10, 4, 64, dtype=F16)
    dq, dk, dv, _ = _ops.run_varlen_backward(d_out, q, k, v, out, lse, cu_q, cu_k, None, 6, 7, 0,
                                             0, 1, 0, -1, -1, 0.0, 0.0, False)
    assert (dq.shape, dk.shape, dv.shape) == (q.shape, k.shape, v.shape)
    (_, _, back), = recorder.calls[1:]
    assert strides(back.d_o)[1:] == (4 * 64, 64) and strides(back.d_v)[1:] == (2 * 64, 64)
    assert strides(back.d_q)[1:] == (4 * 128, 128)


def test_a_decoding_step_tells_the_library_the_value_head_dim(recorder):
    """The operator puts v's head dim in the spec, and the decode family
    plans V's tiles and O by it (on an H100 the spec's first family is the
    Hopper forward, which takes a cache's calls of many queries)."""
    q = torch.randn(2, 1, 4, 64, dtype=F16)
    k_cache, v_cache = torch.randn(2, 16, 2, 64, dtype=F16), torch.randn(2, 16, 2, 32, dtype=F16)
    out, _ = _ops.run_kvcache_forward(q, k_cache, v_cache, None, None, None, None, 0, 0, -1, -1,
                                      0.0, 0)
    (_, spec, _), = recorder.calls
    assert (spec.head_dim, spec.head_dim_v, spec.kv_cache) == (64, 32, 1)
    assert out.shape == (2, 1, 4, 32)
    name = flashgen.Context("a100").plan(spec)["kernel_name"]
    assert name.startswith("fg_decode_sm80_fp16_d64v32_kvcache_"), name
    name = flashgen.Context("h100").plan(spec)["kernel_name"]
    assert name.startswith("fg_fwd_sm90a_fp16_d64v32_kvcache_"), name


def test_a_latent_step_tells_the_library_its_value_head_dim(recorder):
    """mla: the cache is K alone, its first head_dim_v columns V; the spec
    says so (FG_KV_LATENT) and out takes head_dim_v."""
    q, kv = torch.randn(2, 1, 16, 576, dtype=BF16), torch.randn(2, 64, 1, 576, dtype=BF16)
    lens = torch.tensor([5, 64], dtype=torch.int32)
    out, lse = _ops.mla(q, kv, lens, None, 0, 0, -1, -1, 0.0, 0, 512, with_lse=False)
    (_, spec, args), = recorder.calls
    assert (spec.head_dim, spec.head_dim_v, spec.kv_cache) == (576, 512, 2)
    assert out.shape == (2, 1, 16, 512) and lse is None
    assert not args.v.data  # no V of its own (NULL)
    name = flashgen.Context("h100").plan(spec)["kernel_name"]
    assert name == "fg_mla_sm90a_bf16_d576v512_kvlatent_wg", name


def test_specs_are_kept_by_their_value_head_dim():
    def spec(dv):
        return _ops._spec(BF16, 192, 1, False, 0, 0, 0, 0, head_dim_v=dv)
    assert spec(None) is spec(192)  # equal dims: the spec without one, as the library says
    assert spec(None).head_dim_v == 0 and spec(128).head_dim_v == 128
    assert spec(128) is spec(128) and spec(128) is not spec(64)
    ctx = flashgen.Context("a100")
    names = {dv: ctx.plan(spec(dv))["kernel_name"] for dv in (None, 128, 64)}
    assert names[None].startswith("fg_fwd_sm80_bf16_d192_causal")
    assert names[128].startswith("fg_fwd_sm80_bf16_d192v128_causal")
    assert names[64].startswith("fg_fwd_sm80_bf16_d192v64_causal")


# ---- fake tensors: the shapes torch.compile traces ---------------------------------

def fake_mode():
    from torch._subclasses.fake_tensor import FakeTensorMode
    return FakeTensorMode()


def cuda(*shape, dtype=BF16, grad=False):
    return torch.empty(*shape, dtype=dtype, device="cuda", requires_grad=grad)


@pytest.mark.parametrize("d, dv", [(192, 128), (128, 64), (64, 128), (40, 200)])
def test_operators_fake_shapes(d, dv):
    with fake_mode():
        q, k, v = cuda(2, 33, 8, d), cuda(2, 47, 2, d), cuda(2, 47, 2, dv)
        out, lse, rng = torch.ops.flashgen.forward(q, k, v, *OPTIONS)
        assert out.shape == (2, 33, 8, dv) and lse.shape == (2, 8, 33) and rng.shape == (2,)
        d_out = cuda(2, 33, 8, dv)
        dq, dk, dv_, d_sinks, d_aux = torch.ops.flashgen.backward(d_out, q, k, v, out, lse, rng,
                                                                  *OPTIONS)
        assert (dq.shape, dk.shape, dv_.shape) == (q.shape, k.shape, v.shape)
        cu = cuda(3, dtype=torch.int32)
        pq, pk, pv = cuda(60, 8, d), cuda(90, 2, d), cuda(90, 2, dv)
        out, lse, rng = torch.ops.flashgen.varlen_forward(pq, pk, pv, cu, cu, None, 33, 47, 1, 0,
                                                          -1, -1, 0.0, 0.0, False)
        assert out.shape == (60, 8, dv) and lse.shape == (8, 60)
        grads = torch.ops.flashgen.varlen_backward(cuda(60, 8, dv), pq, pk, pv, out, lse, rng, cu,
                                                   cu, None, 33, 47, 1, 0, -1, -1, 0.0, 0.0,
                                                   False)
        assert [g.shape for g in grads[:3]] == [pq.shape, pk.shape, pv.shape]


def test_autograd_gives_dv_the_values_shape():
    """The operators' autograd formulas, run on meta tensors (shapes only)."""
    def leaf(*shape):
        return torch.empty(*shape, dtype=BF16, device="meta", requires_grad=True)
    q, k, v = leaf(2, 33, 8, 192), leaf(2, 47, 2, 192), leaf(2, 47, 2, 128)
    out, lse, _ = torch.ops.flashgen.forward(q, k, v, *OPTIONS)
    assert out.shape == (2, 33, 8, 128)
    grads = torch.autograd.grad(out, (q, k, v), torch.ones_like(out))
    assert [g.shape for g in grads] == [q.shape, k.shape, v.shape]
    cu = torch.empty(3, dtype=torch.int32, device="meta")
    pq, pk, pv = leaf(60, 8, 192), leaf(90, 2, 192), leaf(90, 2, 128)
    out, _, _ = torch.ops.flashgen.varlen_forward(pq, pk, pv, cu, cu, None, 33, 47, 1, 0, -1, -1,
                                                  0.0, 0.0, False)
    assert out.shape == (60, 8, 128)
    grads = torch.autograd.grad(out, (pq, pk, pv), torch.ones_like(out))
    assert [g.shape for g in grads] == [pq.shape, pk.shape, pv.shape]


def test_the_api_on_fake_tensors(monkeypatch):
    monkeypatch.setattr(_api, "_capability", lambda device: (9, 0))
    with fake_mode():
        q, k, v = cuda(2, 33, 8, 192), cuda(2, 47, 2, 192), cuda(2, 47, 2, 128)
        out, lse = flashgen.attention(q, k, v, causal=True, return_lse=True)
        assert out.shape == (2, 33, 8, 128) and lse.shape == (2, 8, 33)
        bh = [t.transpose(1, 2) for t in (q, k, v)]
        assert flashgen.attention(*bh, layout="bhsd").shape == (2, 8, 33, 128)
        assert flashgen.scaled_dot_product_attention(*bh, is_causal=True,
                                                     enable_gqa=True).shape == (2, 8, 33, 128)
        assert flashgen.flex_attention(*bh, enable_gqa=True).shape == (2, 8, 33, 128)
        out, lse = flashgen.flex_attention(*bh, score_mod=lambda s, b, h, i, j: s * 0.5,
                                           enable_gqa=True, return_lse=True)
        assert out.shape == (2, 8, 33, 128) and lse.shape == (2, 8, 33)
        cu = cuda(3, dtype=torch.int32)
        out, lse = flashgen.attention_varlen(cuda(60, 8, 64), cuda(90, 2, 64), cuda(90, 2, 128),
                                             cu, cu, 33, 47, causal=True, return_lse=True)
        assert out.shape == (60, 8, 128) and lse.shape == (8, 60)


def test_a_latent_step_on_fake_tensors():
    """Under a mode mla_with_kvcache runs as torch.ops.flashgen.mla_forward,
    whose fake function gives out the value head dim and lse (B, Hq, Sq)."""
    with fake_mode():
        q, kv = cuda(3, 2, 16, 576), cuda(40, 64, 1, 576)
        table, lens = cuda(3, 10, dtype=torch.int32), cuda(3, dtype=torch.int32)
        out, lse = flashgen.mla_with_kvcache(q, kv, table, lens, 512, causal=True,
                                             return_lse=True)
        assert out.shape == (3, 2, 16, 512) and lse.shape == (3, 16, 2)
        assert lse.dtype == torch.float32


def test_the_drop_in_falls_back_only_for_what_it_cannot_take(monkeypatch):
    """A key head dim unlike the query's is PyTorch's to refuse; a value head
    dim of its own is flashgen's."""
    monkeypatch.setattr(_api, "_capability", lambda device: (8, 0))
    ran = []
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention",
                        lambda *args, **kwargs: ran.append(args) or args[0])
    _api._warned.clear()
    with fake_mode():
        q, v = cuda(1, 4, 9, 96), cuda(1, 4, 9, 64)
        with pytest.warns(UserWarning, match="key's head dim differs from the query's"):
            flashgen.scaled_dot_product_attention(q, v, v)
        assert len(ran) == 1
        assert flashgen.scaled_dot_product_attention(q, q, v).shape == (1, 4, 9, 64)
        assert len(ran) == 1


def test_decoding_steps_take_a_value_head_dim_of_their_own():
    """The decode family's operator (fake tensors): out of v_cache's head
    dim, new v rows of it; one off its multiples of 8 refused."""
    with fake_mode():
        q, k_cache, v_cache = cuda(2, 1, 8, 192), cuda(2, 64, 2, 192), cuda(2, 64, 2, 128)
        out, lse = flashgen.attention_with_kvcache(q, k_cache, v_cache, cuda(2, 1, 2, 192),
                                                   cuda(2, 1, 2, 128), cache_seqlens=3,
                                                   return_lse=True)
        assert out.shape == (2, 1, 8, 128) and lse.shape == (2, 8, 1)
        with pytest.raises(ValueError, match="v: value head dim 192, but v_cache has 128"):
            flashgen.attention_with_kvcache(q, k_cache, v_cache, cuda(2, 1, 2, 192),
                                            cuda(2, 1, 2, 192), cache_seqlens=3)
        with pytest.raises(ValueError, match="v_cache: value head dim 100; a decoding step"):
            flashgen.attention_with_kvcache(q, k_cache, cuda(2, 64, 2, 100), cache_seqlens=3)

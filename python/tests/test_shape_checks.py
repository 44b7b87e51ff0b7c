"""Shapes are checked before anything reshapes, indexes or runs on the
tensors: the transformers integration's padded and packed paths (which
reshape and index one tensor with another's shape), attention_varlen,
attention_with_kvcache, attention and the packed sharding helpers refuse
with the dense path's ValueError where a shape does not fit, and on CPU
tensors (PyTorch, no GPU): the shape checks come before the device's.
On a GPU a shape that got past them would index outside a tensor (a
device-side assert that ends the process's CUDA context). A value head dim
unlike the query's (DeepSeek's) fits: every path reshapes each tensor by
its own head dim."""
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed")

import flashgen  # noqa: E402
import flashgen.integrations.transformers as fg_transformers  # noqa: E402
from flashgen import distributed as cp  # noqa: E402

F16 = torch.float16
# fewer keys in v than in k (its head dim, DeepSeek's 64 beside 96, may differ)
V_UNLIKE_K = r"v: shape \(2, 4, 4, 64\) differs from k's \(2, 6, 4, 96\) \(as B, S, H, D\)"


@pytest.fixture
def no_kernel(monkeypatch):
    """attention_varlen must not be reached: the checks come first."""
    def reached(*args, **kwargs):
        raise AssertionError("attention_varlen reached with unchecked shapes")
    monkeypatch.setattr(flashgen, "attention_varlen", reached)


def bhsd(B, H, S, D, dtype=F16):
    return torch.randn(B, H, S, D).to(dtype)


def left_padded(B, S):
    mask = torch.ones(B, S, dtype=torch.long)
    mask[0, :3] = 0
    return mask


@pytest.mark.parametrize("sq", [6, 1])  # a padded prefill, a decoding step's new token
def test_padded_path_refuses_a_value_unlike_the_key_as_the_dense_path(no_kernel, sq):
    """A value with fewer keys than the key: the padded path would index
    past it; it is refused as the dense path refuses it."""
    q, k, v = bhsd(2, 4, sq, 96), bhsd(2, 4, 6, 96), bhsd(2, 4, 4, 64)
    with pytest.raises(ValueError, match=V_UNLIKE_K) as padded:
        fg_transformers.flashgen_attention_forward(None, q, k, v, left_padded(2, 6))
    with pytest.raises(ValueError, match=V_UNLIKE_K) as dense:
        fg_transformers.flashgen_attention_forward(None, q, k, v, None)
    assert str(padded.value) == str(dense.value)


def recorded(monkeypatch):
    """Stand-ins for attention, attention_varlen and attention_with_kvcache
    that record the shapes they get and return zeros of the output's shape
    (q's rows and heads, v's head dim) in their layout."""
    seen = []

    def dense(q, k, v, layout="bshd", **kwargs):
        seen.append(("attention", tuple(q.shape), tuple(k.shape), tuple(v.shape)))
        return torch.zeros(q.shape[:-1] + v.shape[-1:], dtype=q.dtype)

    def varlen(q, k, v, cu_q, cu_k, max_q, max_k, **kwargs):
        seen.append(("varlen", tuple(q.shape), tuple(k.shape), tuple(v.shape)))
        return torch.zeros(q.shape[:-1] + v.shape[-1:], dtype=q.dtype)

    def kvcache(q, k_cache, v_cache, layout="bshd", **kwargs):
        seen.append(("kvcache", layout, tuple(q.shape), tuple(k_cache.shape),
                     tuple(v_cache.shape)))
        return torch.zeros(q.shape[:-1] + v_cache.shape[-1:], dtype=q.dtype)
    monkeypatch.setattr(flashgen, "attention", dense)
    monkeypatch.setattr(flashgen, "attention_varlen", varlen)
    monkeypatch.setattr(flashgen, "attention_with_kvcache", kvcache)
    return seen


@pytest.mark.parametrize("sq", [6, 1])
def test_every_path_takes_a_value_head_dim_of_its_own(monkeypatch, sq):
    """DeepSeek's shapes (query and key head dim 96, value 64): the padded
    path packs each tensor by its own head dim, the dense path passes them
    on, and so does a decoding step (one query against a longer cache, no
    gradient) to the decode family, padded or not. The output is (B, Sq, H,
    64)."""
    seen = recorded(monkeypatch)
    q, k, v = bhsd(2, 4, sq, 96), bhsd(2, 4, 6, 96), bhsd(2, 4, 6, 64)
    step = ("kvcache", "bhsd", (2, 4, 1, 96), (2, 4, 6, 96), (2, 4, 6, 64))
    out, _ = fg_transformers.flashgen_attention_forward(None, q, k, v, left_padded(2, 6))
    assert out.shape == (2, sq, 4, 64)
    # 9 real keys (3 padded in row 0); queries the last sq positions
    assert seen[-1] == (("varlen", (9, 4, 96), (9, 4, 96), (9, 4, 64)) if sq == 6 else step)
    out, _ = fg_transformers.flashgen_attention_forward(None, q, k, v, None)
    assert out.shape == (2, sq, 4, 64)
    assert seen[-1] == (("attention", (2, 4, 6, 96), (2, 4, 6, 96), (2, 4, 6, 64)) if sq == 6
                        else step)


def test_packed_rows_take_a_value_head_dim_of_their_own(monkeypatch):
    seen = recorded(monkeypatch)
    q, k, v = bhsd(2, 4, 8, 96), bhsd(2, 4, 8, 96), bhsd(2, 4, 8, 64)
    out, _ = fg_transformers.flashgen_attention_forward(None, q, k, v, None,
                                                        position_ids=restarting(2, 8))
    assert out.shape == (2, 8, 4, 64)
    assert seen == [("varlen", (16, 4, 96), (16, 4, 96), (16, 4, 64))]


@pytest.mark.parametrize("q, k, v, mask, exc, match", [
    # more batch rows in k and the mask than in q: q's rows indexed past its end
    (bhsd(2, 4, 6, 96), bhsd(3, 4, 6, 96), bhsd(3, 4, 6, 96), left_padded(3, 6), ValueError,
     r"k: batch 3 and head dim 96, but q has batch 2 and head dim 96"),
    # fewer keys in v than in k: v's rows indexed past its end
    (bhsd(2, 4, 6, 64), bhsd(2, 4, 6, 64), bhsd(2, 4, 4, 64), left_padded(2, 6), ValueError,
     r"v: shape \(2, 4, 4, 64\) differs from k's \(2, 6, 4, 64\)"),
    (bhsd(2, 4, 6, 64), bhsd(2, 3, 6, 64), bhsd(2, 3, 6, 64), left_padded(2, 6), ValueError,
     r"k: 3 heads; the query heads \(4\) must be a multiple"),
    (bhsd(2, 4, 6, 64), bhsd(2, 4, 6, 64), bhsd(2, 4, 6, 64, torch.bfloat16), left_padded(2, 6),
     TypeError, r"v: torch.bfloat16, but q is torch.float16"),
    (bhsd(2, 4, 6, 64)[0], bhsd(2, 4, 6, 64), bhsd(2, 4, 6, 64), left_padded(2, 6), ValueError,
     r"q: 3-D; expected 4-D \(BHSD\)"),
    # more queries than the mask's keys: the queries are the last keys' positions
    (bhsd(2, 4, 8, 64), bhsd(2, 4, 6, 64), bhsd(2, 4, 6, 64), left_padded(2, 6), ValueError,
     r"q: 8 rows, but attention_mask has 6 keys"),
    (bhsd(2, 4, 6, 64), bhsd(2, 4, 6, 64), bhsd(2, 4, 6, 64), left_padded(2, 6).to("meta"),
     ValueError, r"attention_mask: on meta, but q is on cpu"),
    (bhsd(2, 4, 6, 64), bhsd(2, 4, 6, 64), bhsd(2, 4, 6, 64), left_padded(2, 5),
     NotImplementedError, r"an attention_mask of shape \(2, 5\) is not supported"),
])
def test_padded_path_checks_before_packing(no_kernel, q, k, v, mask, exc, match):
    with pytest.raises(exc, match=match):
        fg_transformers.flashgen_attention_forward(None, q, k, v, mask)


def restarting(B, S):
    return torch.arange(S).remainder(4).expand(B, S)


@pytest.mark.parametrize("q, k, v, positions, match", [
    (bhsd(1, 4, 8, 96), bhsd(1, 4, 8, 96), bhsd(1, 4, 6, 64), restarting(1, 8),
     r"v: shape \(1, 6, 4, 64\) differs from k's \(1, 8, 4, 96\)"),
    (bhsd(1, 4, 8, 96), bhsd(1, 4, 8, 96), bhsd(1, 4, 8, 300), restarting(1, 8),
     r"v: head dim 300; flashgen supports 1..256"),
    (bhsd(1, 4, 8, 64), bhsd(1, 4, 8, 64), bhsd(1, 4, 8, 64), restarting(1, 6),
     r"position_ids: shape \(1, 6\); expected \(batch 1, 8\) or \(1, 8\)"),
    (bhsd(2, 4, 8, 64), bhsd(2, 4, 8, 64), bhsd(2, 4, 8, 64), restarting(3, 8),
     r"position_ids: shape \(3, 8\)"),
])
def test_packed_path_checks_before_packing(no_kernel, q, k, v, positions, match):
    with pytest.raises(ValueError, match=match):
        fg_transformers.flashgen_attention_forward(None, q, k, v, None, position_ids=positions)


def test_packed_path_takes_one_row_of_positions_for_the_batch(monkeypatch):
    """position_ids (1, S) beside a batch of B rows (transformers' broadcast
    positions): the same sequences in every row."""
    seen = []

    def spy(q, k, v, cu_q, cu_k, max_q, max_k, **kwargs):
        seen.append((cu_q.tolist(), cu_k.tolist(), max_q, max_k))
        return torch.zeros_like(q)
    monkeypatch.setattr(flashgen, "attention_varlen", spy)
    q = bhsd(2, 4, 8, 64)
    for positions in (restarting(1, 8), restarting(2, 8)):
        out, _ = fg_transformers.flashgen_attention_forward(None, q, q, q, None,
                                                            position_ids=positions)
        assert out.shape == (2, 8, 4, 64)
    assert seen[0] == seen[1] == ([0, 4, 8, 12, 16], [0, 4, 8, 12, 16], 4, 4)


def test_varlen_checks_shapes_first():
    q, k, v = (torch.zeros(10, 4, d, dtype=F16) for d in (96, 96, 64))
    cu = torch.tensor([0, 4, 10], dtype=torch.int32)
    with pytest.raises(ValueError, match=r"v: shape \(8, 4, 64\) differs from k's \(10, 4, 96\) "
                                         r"\(as total, H, D\)"):
        flashgen.attention_varlen(q, k, v[:8], cu, cu, 6, 6)
    # a value head dim of its own passes the shapes: the device is next
    with pytest.raises(ValueError, match=r"q: on cpu; flashgen runs on CUDA devices"):
        flashgen.attention_varlen(q, k, v, cu, cu, 6, 6)
    with pytest.raises(ValueError, match=r"k: 3 heads; the query heads \(4\)"):
        flashgen.attention_varlen(q, k[:, :3], k[:, :3], cu, cu, 6, 6)


def test_kvcache_checks_shapes_first():
    q = torch.zeros(2, 1, 4, 96, dtype=F16)
    k_cache, v_cache = torch.zeros(2, 16, 4, 96, dtype=F16), torch.zeros(2, 16, 4, 64, dtype=F16)
    # a value head dim of its own passes the shapes (the device is next); one
    # the decode family cannot take, or new rows unlike the cache, do not
    with pytest.raises(ValueError, match=r"q: on cpu; flashgen runs on CUDA devices"):
        flashgen.attention_with_kvcache(q, k_cache, v_cache, cache_seqlens=3)
    with pytest.raises(ValueError, match=r"v_cache: value head dim 36; a decoding step takes "
                                         r"multiples of 8 up to 256"):
        flashgen.attention_with_kvcache(q, k_cache, v_cache[..., :36], cache_seqlens=3)
    with pytest.raises(ValueError, match=r"v_cache: shape \(2, 12, 4, 64\) differs from "
                                         r"k_cache's \(2, 16, 4, 96\)"):
        flashgen.attention_with_kvcache(q, k_cache, v_cache[:, :12], cache_seqlens=3)
    k, v = torch.zeros(2, 1, 4, 96, dtype=F16), torch.zeros(2, 1, 4, 64, dtype=F16)
    with pytest.raises(ValueError, match=r"v: value head dim 64, but v_cache has 96"):
        flashgen.attention_with_kvcache(q, k_cache, k_cache, k, v, cache_seqlens=3)
    with pytest.raises(ValueError, match=r"q: on cpu; flashgen runs on CUDA devices"):
        flashgen.attention_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=3)
    with pytest.raises(ValueError, match=r"k_cache: head dim 64, but q has 96"):
        flashgen.attention_with_kvcache(q, v_cache, v_cache, cache_seqlens=3)
    # an int cache_seqlens becomes a tensor on q's device only once q is checked
    with pytest.raises(TypeError, match=r"q: list; expected a torch.Tensor"):
        flashgen.attention_with_kvcache([0.0], k_cache, k_cache, cache_seqlens=3)
    # layout "bhsd": the same checks on the (B, S, H, D) views, the same messages
    heads_first = [t.transpose(1, 2) for t in (q, k_cache, v_cache)]
    with pytest.raises(ValueError, match=r"v_cache: shape \(2, 12, 4, 64\) differs from "
                                         r"k_cache's \(2, 16, 4, 96\)"):
        flashgen.attention_with_kvcache(*heads_first[:2], heads_first[2][:, :, :12],
                                        cache_seqlens=3, layout="bhsd")
    with pytest.raises(ValueError, match=r"q: on cpu; flashgen runs on CUDA devices"):
        flashgen.attention_with_kvcache(*heads_first, cache_seqlens=3, layout="bhsd")
    with pytest.raises(ValueError, match=r"q: 3-D; expected 4-D \(BHSD\)"):
        flashgen.attention_with_kvcache(heads_first[0][0], *heads_first[1:], layout="bhsd")
    with pytest.raises(ValueError, match=r"layout: 'sbhd'; valid: 'bshd', 'bhsd'"):
        flashgen.attention_with_kvcache(q, k_cache, v_cache, layout="sbhd")


def test_attention_checks_shapes_first():
    q, k, v = (torch.zeros(2, 6, 4, d, dtype=F16) for d in (96, 96, 64))
    with pytest.raises(ValueError, match=V_UNLIKE_K):
        flashgen.attention(q, k, v[:, :4])
    # a value head dim of its own passes the shapes: the device is next
    with pytest.raises(ValueError, match=r"q: on cpu; flashgen runs on CUDA devices"):
        flashgen.attention(q, k, v)


def test_sharding_packed_rows_refuses_boundaries_past_them():
    x = torch.randn(10, 2, 3)
    with pytest.raises(ValueError, match=r"x: 10 rows, but cu_seqlens ends at 12"):
        cp.shard_varlen(x, [0, 4, 12], 0, 2)
    shards = [cp.shard_varlen(x, [0, 4, 8], r, 2) for r in range(2)]
    with pytest.raises(ValueError, match=r"shards\[1\]: 3 rows, but cu_seqlens gives rank 1 4"):
        cp.unshard_varlen([shards[0], shards[1][:3]], [0, 4, 8])

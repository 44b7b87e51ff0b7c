"""Random arguments to attention, attention_varlen, attention_with_kvcache,
mla_with_kvcache and scaled_dot_product_attention, on fake CUDA tensors
(no GPU): shapes of any rank and size, dtypes, CPU tensors among CUDA ones,
options of every type, expressions, lengths as tensors, ints and floats.
Each call returns or is refused with a ValueError or TypeError: never
another exception (an IndexError or AttributeError from deep inside is a
check missing). The drop-in's calls handed to PyTorch raise as PyTorch
does. Needs PyTorch (on the CPU)."""
import random
import traceback
import warnings

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed")

import flashgen  # noqa: E402
from flashgen import _api  # noqa: E402

DTYPES = [torch.bfloat16] * 40 + [torch.float16, torch.float32, torch.int32, torch.float64]
OPTIONS = [None, 0, 1, -1, 2, 0.5, -0.5, 1e30, float("nan"), float("inf"), True, False, "x",
           (1, 2), (-1, -1), (3,), [4, 0], {}]


class Draw:
    def __init__(self, seed):
        self.r = random.Random(seed)

    def tensor(self, *shape, dtype=None):
        r = self.r
        return torch.empty(*shape, dtype=dtype or r.choice(DTYPES),
                           device=r.choice(["cuda"] * 40 + ["cpu"]))

    def shape(self, *dims):
        """dims, or now and then one rank fewer or one size anything."""
        r, s = self.r, list(dims)
        if r.random() < 0.05:
            s = s[:r.randint(1, len(s) - 1)]
        if r.random() < 0.05:
            s[r.randrange(len(s))] = r.choice([0, 1, 13, 257, 576])
        return s

    def options(self, names, p=0.04):
        return {n: self.r.choice(OPTIONS) for n in names if self.r.random() < p}


def attention(d):
    r = d.r
    B, Sq, Sk, Hk = r.randint(0, 3), r.randint(0, 40), r.randint(0, 40), r.choice([1, 2, 3])
    Hq = Hk * r.choice([1, 2]) + (r.random() < 0.05)
    D, Dv = r.choice([8, 13, 64, 128, 256, 300]), r.choice([8, 64, 128, 256])
    kw = d.options(("causal", "align", "window", "dropout_p", "softmax_scale", "deterministic",
                    "return_lse", "layout", "softcap", "alibi_slopes", "sinks", "score_mod",
                    "mask_mod", "aux", "sparsity"))
    if r.random() < 0.1:
        kw["alibi_slopes"] = d.tensor(r.choice([Hq, Hq + 1]), dtype=torch.float32)
    if r.random() < 0.1:
        kw["sinks"] = d.tensor(r.choice([Hq, 1]), dtype=r.choice([torch.float32, torch.float16]))
    if r.random() < 0.1:
        kw["score_mod"] = r.choice(["s * 2.0", "s + ", "s + bias[h]", "q > k", "s * q"])
    if r.random() < 0.1:
        kw["mask_mod"] = r.choice(["q >= k", "s > 0", "doc[q] == doc[k]", "q"])
    if r.random() < 0.05:
        kw["aux"] = {"bias": d.tensor(Hq, dtype=torch.float32),
                     "doc": d.tensor(Sq, dtype=torch.int32)}
    q = torch.empty(*d.shape(B, Sq, Hq, D), dtype=torch.bfloat16, device="cuda")
    k, v = d.tensor(*d.shape(B, Sk, Hk, D)), d.tensor(*d.shape(B, Sk, Hk, Dv))
    return flashgen.attention(q, k, v, **kw)


def packed(d):
    r = d.r
    n = r.randint(0, 3)
    lq, lk = [r.randint(0, 20) for _ in range(n)], [r.randint(0, 20) for _ in range(n)]
    Hk, D = r.choice([1, 2]), r.choice([8, 64, 13])
    Hq = Hk * r.choice([1, 2])

    def cu(ls):
        return d.tensor(len(ls) + 1 + (r.random() < 0.05),
                        dtype=r.choice([torch.int32] * 9 + [torch.int64]))
    kw = d.options(("causal", "align", "window", "dropout_p", "softmax_scale", "deterministic",
                    "return_lse", "softcap", "alibi_slopes", "sinks"))
    if r.random() < 0.1:
        kw["seqused_k"] = d.tensor(r.choice([n, n + 1]), dtype=torch.int32)
    max_q = r.choice([max(lq + [0])] * 4 + [-1, 1 << 31, 3.5, None, True])
    max_k = r.choice([max(lk + [0])] * 4 + [-1, 5])
    return flashgen.attention_varlen(d.tensor(sum(lq), Hq, D), d.tensor(sum(lk), Hk, D),
                                     d.tensor(sum(lk), Hk, D), cu(lq), cu(lk), max_q, max_k, **kw)


def kvcache(d):
    r = d.r
    B, Sq, Hk = r.randint(0, 3), r.randint(0, 5), r.choice([1, 2])
    Hq, D = Hk * r.choice([1, 4]), r.choice([64, 128, 40, 64, 13])
    paged, page = r.random() < 0.5, r.choice([1, 16, 7])
    P, S = r.randint(0, 6), r.randint(0, 50)
    P2, S2 = (P, S) if r.random() < 0.9 else (r.randint(0, 6), r.randint(0, 50))
    caches = ((d.tensor(P, page, Hk, D), d.tensor(P2, page, Hk, D)) if paged else
              (d.tensor(B, S, Hk, D), d.tensor(B, S2, Hk, D)))
    kw = d.options(("causal", "align", "window", "softmax_scale", "num_splits", "return_lse",
                    "softcap", "layout"))
    if paged:
        kw["block_table"] = d.tensor(B, r.randint(0, 4),
                                     dtype=r.choice([torch.int32] * 5 + [torch.int64]))
    if r.random() < 0.6:
        kw["cache_seqlens"] = r.choice([d.tensor(B, dtype=torch.int32), r.randint(-2, 60), 3.0,
                                        True, d.tensor(B + 1, dtype=torch.int32)])
    new = r.choice([0, 0, 1, 3])
    k = d.tensor(B, new, Hk, D) if new else None
    v = d.tensor(B, new, Hk, D) if new and r.random() < 0.95 else None
    return flashgen.attention_with_kvcache(d.tensor(B, Sq, Hq, D), *caches, k, v, **kw)


def latent(d):
    r = d.r
    B, Sq, Hq, D = r.randint(0, 3), r.randint(0, 3), r.choice([1, 16, 128]), r.choice(
        [576, 512, 64, 100])
    paged = r.random() < 0.5
    cache = (d.tensor(r.randint(0, 5), r.choice([64, 1, 7]), r.choice([1, 2]), D) if paged else
             d.tensor(B, r.randint(0, 40), 1, D))
    table = d.tensor(B, r.randint(0, 3), dtype=torch.int32) if paged else None
    lengths = r.choice([d.tensor(B, dtype=torch.int32), r.randint(-1, 100), None])
    return flashgen.mla_with_kvcache(d.tensor(B, Sq, Hq, D), cache, table, lengths,
                                     r.choice([512, 64, 600, 0, 48]), causal=r.random() < 0.5,
                                     num_splits=r.choice([0, 1, -1, 3]))


def sdpa(d):
    r = d.r
    B, Hq, S, D = r.randint(0, 2), r.choice([1, 2, 4]), r.randint(0, 30), r.choice([8, 64, 300])
    kw = d.options(("attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa"), 0.05)
    return flashgen.scaled_dot_product_attention(
        d.tensor(B, Hq, S, D), d.tensor(B, r.choice([Hq, 1, 3]), S + r.randint(0, 3), D),
        d.tensor(B, r.choice([Hq, 1]), S, D), **kw)


@pytest.mark.parametrize("call", [attention, packed, kvcache, latent, sdpa])
def test_random_arguments_return_or_are_refused(call, monkeypatch):
    from torch._subclasses.fake_tensor import FakeTensorMode
    monkeypatch.setattr(_api, "_capability", lambda device: (9, 0))  # an H100's, as if there
    d = Draw(sum(map(ord, call.__name__)))  # a fixed draw per entry point
    returned = 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the drop-in's fallback notes
        for case in range(600):
            with FakeTensorMode():
                try:
                    call(d)
                    returned += 1
                except (ValueError, TypeError):
                    pass
                except RuntimeError:
                    tb = traceback.format_exc()
                    # PyTorch's function, where the drop-in hands a call to it
                    if not (call is sdpa and "functional.scaled_dot_product_attention(" in tb):
                        raise
    assert returned > 0  # some calls are whole

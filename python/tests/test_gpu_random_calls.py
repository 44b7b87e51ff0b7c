"""Random calls of attention, attention_varlen and attention_with_kvcache on
the GPU, drawn from seeded generators: sizes off every tile, grouped heads,
value head dims of their own, masks, windows, scales, the logits' variants,
and inputs laid out as a user may hand them (rows padded, heads outermost,
every other row, one element past an aligned address, a batch broadcast by
a zero stride, the bhsd layout). Each call must match the fp64 reference
within twice PyTorch's in-dtype error (test_gpu_attention's measure), or,
where the case breaks one rule on purpose, be refused with a ValueError or
TypeError naming the argument; after every call the CUDA context must still
work, and a KV-cache step must have written its new rows and nothing else.
FLASHGEN_RANDOM_CALLS scales the number of calls (default 1), and
FLASHGEN_RANDOM_SEED draws other calls (default 0)."""
import os
import random
import warnings

import pytest

from conftest import gpu_or_skip

pytestmark = pytest.mark.gpu
torch = gpu_or_skip()

import flashgen  # noqa: E402
import reference  # noqa: E402
from tensors import make_cache  # noqa: E402

SCALE = float(os.environ.get("FLASHGEN_RANDOM_CALLS", "1"))
SEED = 1000 * int(os.environ.get("FLASHGEN_RANDOM_SEED", "0"))
LAYOUTS = ("contiguous", "padded", "heads_outer", "every_other_row", "offset", "batch_broadcast")


def count(n):
    return max(1, int(n * SCALE))


@pytest.fixture(scope="module")
def shared_cache(tmp_path_factory):
    """One kernel cache for a module's calls, which share most kernels."""
    return str(tmp_path_factory.mktemp("random-calls-cache"))


@pytest.fixture(autouse=True)
def _one_cache(shared_cache, monkeypatch):
    monkeypatch.setenv("FLASHGEN_CACHE_DIR", shared_cache)


def laid_out(t, how):
    """t's values (a batch broadcast: batch 0's) in other memory, as a leaf
    with t's requires_grad. t: (B, S, H, D), or (T, H, D) packed."""
    with torch.no_grad():
        x = _moved(t, how)
    return x.detach().requires_grad_(t.requires_grad)


def _moved(t, how):
    shape, make = t.shape, lambda *s: torch.zeros(*s, dtype=t.dtype, device=t.device)
    if how == "padded":  # rows and heads wider than the tensor
        big = make(*shape[:-2], shape[-2] + 1, shape[-1] + 8)
        big[..., :shape[-2], :shape[-1]] = t
        x = big[..., :shape[-2], :shape[-1]]
    elif how == "heads_outer":
        x = t.transpose(-3, -2).contiguous().transpose(-3, -2)
    elif how == "every_other_row":
        big = make(*shape[:-3], 2 * shape[-3], *shape[-2:])
        big[..., ::2, :, :] = t
        x = big[..., ::2, :, :]
    elif how == "offset":  # 2 bytes past an aligned address
        x = make(t.numel() + 1)[1:].view(shape)
        x.copy_(t)
    elif how == "batch_broadcast" and t.dim() == 4:
        x = t[:1].expand(shape)
    else:
        x = t
    return x


def check(name, got, ref64, lowp, dtype, floor_scale=1.0):
    floor = (1e-3 if dtype == torch.float16 else 8e-3) * floor_scale
    err, base = reference.error(got, ref64), reference.error(lowp, ref64)
    assert err <= 2 * base + floor, f"{name}: error {err:.3g}, PyTorch's in-dtype {base:.3g}"


def check_lse(lse, ref_lse):
    rows = torch.isfinite(ref_lse)
    assert torch.equal(torch.isfinite(lse), rows), "lse: infinite rows differ"
    if rows.any():  # relative to the largest (modifiers may scale the scores)
        big = max(1.0, ref_lse[rows].abs().max().item())
        assert reference.error(lse[rows], ref_lse[rows]) < 1e-3 * big, "lse"


def check_grads(names, leaves, out, ref, lowp, d_out, dtype, relative=False):
    """The gradients of out, of the fp64 reference and of PyTorch's in-dtype
    computation with respect to leaves, within check()'s bound at four times
    its floor (relative: times the largest reference gradient too). Where
    the reference does not reach a leaf (rows no sequence sees), zeros."""
    got = torch.autograd.grad(out, leaves, d_out, allow_unused=True)
    want = torch.autograd.grad(ref, leaves, d_out.double(), allow_unused=True)
    base = torch.autograd.grad(lowp, leaves, d_out, allow_unused=True)
    for name, x, a, w, b in zip(names, leaves, got, want, base):
        w = torch.zeros_like(x) if w is None else w
        assert a is not None and a.shape == x.shape and torch.isfinite(a).all(), name
        check(name, a, w, torch.zeros_like(x) if b is None else b, dtype,
              4.0 * (max(1.0, w.abs().max().item()) if relative else 1.0))


def check_call(about, out, lse, ref, lowp, ref_lse, dtype, leaves=None, d_out=None):
    """A call's output and lse against the references, and with leaves (q,
    k, v) its gradients for d_out; a failure names the call (about)."""
    try:
        check("out", out, ref, lowp, dtype)
        check_lse(lse, ref_lse)
        if leaves is not None:
            check_grads(("dq", "dk", "dv"), leaves, out, ref, lowp, d_out, dtype)
    except AssertionError as e:
        raise AssertionError(f"{about}: {e}") from None


def healthy():
    """The context still runs work (a device-side fault would raise here)."""
    torch.cuda.synchronize()
    assert torch.ones(4, device="cuda").sum().item() == 4.0


def draw_shape(r, head_dims=(40, 64, 64, 128, 128, 13, 256)):
    D = r.choice(head_dims)
    Dv = D if r.random() < 0.85 else r.choice([d for d in (32, 64, 128) if d != D])
    Hk = r.choice([1, 2, 3])
    return dict(D=D, Dv=Dv, Hk=Hk, Hq=Hk * r.choice([1, 2, 4]), dtype=r.choice(
        [torch.float16, torch.bfloat16]))


def draw_options(r, Hq, B):
    causal = r.random() < 0.5
    opts = dict(causal=causal, align=r.choice(["bottom-right", "top-left"]))
    if r.random() < 0.3:
        left = r.choice([-1, r.randint(0, 80)])
        right = 0 if causal else r.choice([-1, r.randint(0, 80)])
        opts["window"] = (left, right)
    if r.random() < 0.2:
        opts["scale"] = r.uniform(0.03, 0.3)
    if r.random() < 0.12:
        opts["softcap"] = r.uniform(3.0, 40.0)
    if r.random() < 0.12:
        rows = (B, Hq) if r.random() < 0.5 else (Hq,)
        opts["alibi_slopes"] = torch.rand(*rows, device="cuda") * 0.3
    if r.random() < 0.12:
        opts["sinks"] = torch.randn(Hq, device="cuda")
    return opts


def call_options(opts):
    """reference.attention's options as flashgen's keywords."""
    out = dict(opts)
    if "scale" in out:
        out["softmax_scale"] = out.pop("scale")
    return out


# what a case breaks on purpose, and the word the error must name
BREAKS = ("k_head_dim", "heads", "float32", "window", "softcap", "slopes", "align", "cpu")


def broken(r, q, k, v, kw):
    """One rule broken: (q, k, v, kw, the word the error names)."""
    what = r.choice(BREAKS)
    if what == "k_head_dim":
        return q, k[..., :-1], v, kw, "k"
    if what == "heads":  # more key heads than query heads: not a divisor
        more = lambda x: x[:, :, :1].expand(-1, -1, q.shape[2] + 1, -1)
        return q, more(k), more(v), kw, "heads"
    if what == "float32":
        return q.float(), k, v, kw, "q"
    if what == "window":
        return q, k, v, dict(kw, causal=True, window=(4, 3)), "window"
    if what == "softcap":
        return q, k, v, dict(kw, softcap=-1.0), "softcap"
    if what == "slopes":
        return q, k, v, dict(kw, alibi_slopes=torch.ones(q.shape[2] + 1, device="cuda")), "alibi_slopes"
    if what == "align":
        return q, k, v, dict(kw, align="middle"), "align"
    return q, k.cpu(), v, kw, "k"


def test_random_attention_calls():
    r = random.Random(SEED + 1)
    g = torch.Generator(device="cuda").manual_seed(SEED + 1)
    for case in range(count(48)):
        s = draw_shape(r)
        B, Sq = r.choice([1, 2, 3]), r.randint(1, 300)
        Sk = Sq if r.random() < 0.3 else r.randint(1, 300)
        opts = draw_options(r, s["Hq"], B)
        grad = r.random() < 0.5
        deterministic = grad and r.random() < 0.3
        bhsd = r.random() < 0.2
        lay = [r.choice(LAYOUTS) for _ in range(3)]
        about = f"case {case}: B {B} Sq {Sq} Sk {Sk} {s} {opts} layouts {lay} bhsd {bhsd}"
        dtype = s["dtype"]
        make = lambda S, H, width: torch.randn(B, S, H, width, device="cuda", generator=g).to(dtype)
        q, k, v = (laid_out(make(S, H, w).requires_grad_(grad), how) for (S, H, w), how in zip(
            ((Sq, s["Hq"], s["D"]), (Sk, s["Hk"], s["D"]), (Sk, s["Hk"], s["Dv"])), lay))
        kw = call_options(opts)
        if r.random() < 0.15:
            bq, bk, bv, bkw, word = broken(r, q, k, v, kw)
            with pytest.raises((ValueError, TypeError)) as e:
                flashgen.attention(bq, bk, bv, **bkw)
            assert word in str(e.value), f"{about}: {e.value}"
            healthy()
            continue
        t = (lambda x: x.transpose(1, 2)) if bhsd else (lambda x: x)
        out, lse = flashgen.attention(t(q), t(k), t(v), layout="bhsd" if bhsd else "bshd",
                                      deterministic=deterministic, return_lse=True, **kw)
        out = t(out)
        assert out.shape == (B, Sq, s["Hq"], s["Dv"]) and out.dtype == dtype, about
        ref, ref_lse = reference.attention(q, k, v, **opts)
        lowp, _ = reference.attention(q, k, v, dtype=dtype, **opts)
        d_out = torch.randn(B, Sq, s["Hq"], s["Dv"], device="cuda", generator=g).to(dtype)
        check_call(about, out, lse, ref, lowp, ref_lse, dtype, (q, k, v) if grad else None, d_out)
        healthy()


def test_random_packed_calls():
    r = random.Random(SEED + 2)
    g = torch.Generator(device="cuda").manual_seed(SEED + 2)
    for case in range(count(24)):
        s = draw_shape(r, (40, 64, 128, 128))
        dtype, batch = s["dtype"], r.randint(1, 5)
        lq = [r.choice([0, r.randint(1, 200)]) for _ in range(batch)]
        lk = [n if r.random() < 0.5 else r.randint(0, 200) for n in lq]
        opts = draw_options(r, s["Hq"], batch)
        opts.pop("alibi_slopes", None)  # a row per sequence: its own test
        grad = r.random() < 0.5
        how = r.choice(("contiguous", "padded", "heads_outer", "offset"))
        about = f"case {case}: lengths {lq} / {lk} {s} {opts} layout {how}"
        make = lambda T, H, w: torch.randn(T, H, w, device="cuda", generator=g).to(dtype)
        q = laid_out(make(sum(lq), s["Hq"], s["D"]).requires_grad_(grad), how)
        k = laid_out(make(sum(lk), s["Hk"], s["D"]).requires_grad_(grad), how)
        v = laid_out(make(sum(lk), s["Hk"], s["Dv"]).requires_grad_(grad), how)
        cu = lambda ls: torch.tensor([0] + [sum(ls[:i + 1]) for i in range(len(ls))],
                                     dtype=torch.int32, device="cuda")
        out, lse = flashgen.attention_varlen(
            q, k, v, cu(lq), cu(lk), max(lq) + r.randint(0, 9), max(lk) + r.randint(0, 9),
            return_lse=True, **call_options(opts))
        assert out.shape == (sum(lq), s["Hq"], s["Dv"]), about
        refs, lowps, ref_lses = [], [], []
        for b in range(batch):
            qs, ks = slice(sum(lq[:b]), sum(lq[:b + 1])), slice(sum(lk[:b]), sum(lk[:b + 1]))
            one = (q[qs][None], k[ks][None], v[ks][None])
            ref, ref_lse = reference.attention(*one, **opts)
            lowp, _ = reference.attention(*one, dtype=dtype, **opts)
            refs.append(ref[0]), lowps.append(lowp[0]), ref_lses.append(ref_lse[0])
        ref, lowp, ref_lse = torch.cat(refs), torch.cat(lowps), torch.cat(ref_lses, dim=1)
        if sum(lq):
            d_out = torch.randn(sum(lq), s["Hq"], s["Dv"], device="cuda", generator=g).to(dtype)
            check_call(about, out, lse, ref, lowp, ref_lse, dtype, (q, k, v) if grad else None,
                       d_out)
        healthy()


def test_random_kvcache_steps():
    r = random.Random(SEED + 3)
    g = torch.Generator(device="cpu").manual_seed(SEED + 3)
    for case in range(count(40)):
        s = draw_shape(r, (64, 128, 128, 40))
        dtype, B = s["dtype"], r.randint(1, 3)
        page = r.choice([0, 0, 1, 7, 16, 64, 256])
        Sq = r.choice([1, 1, 2, 4, r.randint(1, 40)])
        new = r.choice([0, 0, 1, 2])
        lengths = [r.choice([0, r.randint(1, 700)]) for _ in range(B)]
        causal = r.random() < 0.5
        window = (r.randint(0, 100), 0 if causal else r.choice([-1, r.randint(0, 50)])) \
            if r.random() < 0.25 else None
        splits = r.choice([0, 0, 1, 3])
        as_int = B == 1 and r.random() < 0.5
        about = (f"case {case}: page {page} B {B} Sq {Sq} new {new} lengths {lengths} {s} "
                 f"causal {causal} window {window} splits {splits} int {as_int}")
        S = max(lengths) + new + r.randint(1, 9)  # a block table has a page or more
        q = torch.randn(B, Sq, s["Hq"], s["D"], generator=g).to(dtype).cuda()
        k_full = torch.randn(B, S, s["Hk"], s["D"], generator=g).to(dtype).cuda()
        v_full = torch.randn(B, S, s["Hk"], s["Dv"], generator=g).to(dtype).cuda()
        if page:
            k_cache, v_cache, table = make_cache(k_full, v_full, lengths, new, page, g)
        else:
            table = None
            held = torch.arange(S, device="cuda")[None, :, None, None] < \
                torch.tensor(lengths, device="cuda").view(-1, 1, 1, 1)
            k_cache = torch.where(held, k_full, float("nan")).to(dtype)
            v_cache = torch.where(held, v_full, float("nan")).to(dtype)
        k_new = torch.stack([k_full[b, n:n + new] for b, n in enumerate(lengths)]) if new else None
        v_new = torch.stack([v_full[b, n:n + new] for b, n in enumerate(lengths)]) if new else None
        # what the caches must hold after the step: as before, with the new rows
        want_k, want_v = k_cache.clone(), v_cache.clone()
        for b, n in enumerate(lengths):
            for j in range(n, n + new):
                at = (table[b, j // page], j % page) if page else (b, j)
                want_k[at], want_v[at] = k_full[b, j], v_full[b, j]
        seqlens = lengths[0] if as_int else torch.tensor(lengths, dtype=torch.int32, device="cuda")
        out, lse = flashgen.attention_with_kvcache(
            q, k_cache, v_cache, k_new, v_new, cache_seqlens=seqlens, block_table=table,
            causal=causal, window=window, num_splits=splits, return_lse=True)
        healthy()
        try:
            assert out.shape == (B, Sq, s["Hq"], s["Dv"])
            for cache, want in ((k_cache, want_k), (v_cache, want_v)):
                assert torch.equal(cache.isnan(), want.isnan()), "rows written outside the new ones"
                assert torch.equal(cache.nan_to_num(), want.nan_to_num()), "cache rows changed"
            for b, n in enumerate(lengths):
                one = (q[b:b + 1], k_full[b:b + 1, :n + new], v_full[b:b + 1, :n + new])
                ref, ref_lse = reference.attention(*one, causal=causal, window=window)
                lowp, _ = reference.attention(*one, causal=causal, window=window, dtype=dtype)
                check(f"out of sequence {b}", out[b:b + 1], ref, lowp, dtype)
                check_lse(lse[b:b + 1], ref_lse)
        except AssertionError as e:
            raise AssertionError(f"{about}: {e}") from None


# Score modifiers as FlexAttention functions, written as source text from
# these steps (x the score so far; {c} a constant, {t} a captured tensor:
# its shape and whether it may learn). The step hiding keys comes last: a
# hidden score times a learned gate has no gradient in PyTorch (0 · inf).
SCORE_STEPS = (
    ("x = x * {c}", None),
    ("x = x + {t}[h, q_idx - kv_idx + {last}]", ("rel", True)),
    ("x = {c} * torch.tanh(x / {c})", None),
    ("x = x - {t}[h] * (q_idx - kv_idx).abs()", ("heads", True)),
    ("x = x / {t}", ("scalar", True)),
    ("x = torch.clamp(x, min=-{c})", None),
    ("x = x + (q_idx - kv_idx) * 0.01", None),
    ("x = torch.where(kv_idx % 3 == 0, x - 1.0, x)", None),
    ("x = x + torch.log({t}[b, kv_idx])", ("positive", False)),
    ("x = x * torch.sigmoid({t}[h])", ("heads", True)),
    ("x = torch.maximum(x, x * 0.5)", None),
    ("x = x + {t}[b, h, kv_idx]", ("keys", True)),
    ("x = x + {t}[h, (q_idx - kv_idx) // 4 + {last}]", ("rel", True)),
)
MASK_ATOMS = ("(q_idx >= kv_idx)", "(q_idx - kv_idx < {w})", "({t}[q_idx] == {t}[kv_idx])",
              "(kv_idx % 4 != 1)", "(q_idx // {w} == kv_idx // {w})",
              "(({t}[kv_idx // 2] > 0) ^ (q_idx % 3 == 0))")


def captured(kind, B, H, Sq, Sk, learns, r, g):
    """A tensor a modifier captures (float32, or int32 document ids)."""
    if kind == "docs":
        return torch.tensor(sorted(r.randrange(4) for _ in range(max(Sq, Sk))), dtype=torch.int32,
                            device="cuda")
    shape = {"rel": (H, Sq + Sk - 1), "heads": (H,), "scalar": (), "positive": (B, Sk),
             "keys": (B, H, Sk)}[kind]
    t = torch.rand(shape, device="cuda", generator=g)
    t = {"rel": t - 0.5, "heads": t * 0.2, "scalar": t + 0.5, "positive": t * 1.5 + 0.5,
         "keys": t - 0.5}[kind]
    return t.requires_grad_(learns)


def draw_modifiers(r, g, B, H, Sq, Sk):
    """(score_mod, mask_mod (either may be None), the learning tensors, the
    functions' text)."""
    env, learning, lines = {"torch": torch}, [], []

    def tensor(kind, learns):
        name = f"t{len(env) - 1}"
        env[name] = captured(kind, B, H, Sq, Sk, learns and r.random() < 0.5, r, g)
        if env[name].requires_grad:
            learning.append(env[name])
        return name

    steps = [r.choice(SCORE_STEPS) for _ in range(r.randint(0, 3))]
    for text, tensor_kind in steps:
        t = tensor(*tensor_kind) if tensor_kind else ""
        lines.append(text.format(c=round(r.uniform(0.5, 3.0), 3), t=t, last=Sk - 1))
    if r.random() < 0.2:
        lines.append("x = torch.where(q_idx >= kv_idx, x, float('-inf'))")
    src = ""
    if lines:
        src += "def score_mod(score, b, h, q_idx, kv_idx):\n    x = score\n"
        src += "".join(f"    {line}\n" for line in lines) + "    return x\n"
    if r.random() < 0.4:
        atoms = []
        for _ in range(r.randint(1, 2)):
            atom = r.choice(MASK_ATOMS)
            atoms.append(atom.format(w=r.randint(4, 90), t=tensor("docs", False) if "{t}" in atom
                                     else ""))
        src += f"def mask_mod(b, h, q_idx, kv_idx):\n    return {r.choice([' & ', ' | ']).join(atoms)}\n"
    exec(src, env)
    return env.get("score_mod"), env.get("mask_mod"), learning, src


def test_random_score_and_mask_modifiers():
    r = random.Random(SEED + 4)
    g = torch.Generator(device="cuda").manual_seed(SEED + 4)
    for case in range(count(24)):
        s = draw_shape(r, (64, 128, 40))
        dtype, B, Sq = s["dtype"], r.randint(1, 2), r.randint(1, 200)
        Sk = Sq if r.random() < 0.5 else r.randint(1, 200)
        score_mod, mask_mod, learning, src = draw_modifiers(r, g, B, s["Hq"], Sq, Sk)
        causal, scale = r.random() < 0.3, r.choice([None, round(r.uniform(0.05, 0.3), 3)])
        about = f"case {case}: B {B} Sq {Sq} Sk {Sk} {s} causal {causal} scale {scale}\n{src}"
        make = lambda S, H, w: torch.randn(B, S, H, w, device="cuda", generator=g).to(
            dtype).requires_grad_()
        q, k, v = make(Sq, s["Hq"], s["D"]), make(Sk, s["Hk"], s["D"]), make(Sk, s["Hk"], s["Dv"])
        if mask_mod is not None and not causal and r.random() < 0.4:  # as FlexAttention's
            blocks = flashgen.create_block_mask(mask_mod, None, None, Sq, Sk,
                                                BLOCK_SIZE=r.choice([64, 128, (64, 128)]))
            heads = lambda x: x.transpose(1, 2)
            out, lse = flashgen.flex_attention(heads(q), heads(k), heads(v), score_mod=score_mod,
                                               block_mask=blocks, scale=scale, enable_gqa=True,
                                               return_lse=True)
            out, about = heads(out), about + "(flex_attention)"
        else:
            out, lse = flashgen.attention(q, k, v, causal=causal, align="top-left",
                                          softmax_scale=scale, score_mod=score_mod,
                                          mask_mod=mask_mod, return_lse=True)
        leaves = (q, k, v, *learning)
        d_out = torch.randn(B, Sq, s["Hq"], s["Dv"], device="cuda", generator=g).to(dtype)
        try:
            ref, ref_lse = reference.modified_attention(q, k, v, score_mod, mask_mod, scale,
                                                        causal=causal)
            lowp, _ = reference.modified_attention(q, k, v, score_mod, mask_mod, scale, dtype,
                                                   causal=causal)
            check("out", out, ref, lowp, dtype)
            check_lse(lse, ref_lse)
            names = ("dq", "dk", "dv") + tuple(f"the gradient of captured tensor {i}"
                                               for i in range(len(learning)))
            check_grads(names, leaves, out, ref, lowp, d_out, dtype, relative=True)
        except AssertionError as e:
            raise AssertionError(f"{about}: {e}") from None
        healthy()


def test_random_sdpa_calls():
    """The drop-in beside PyTorch's function in fp64 (its math), including
    the calls it hands to PyTorch (an attn_mask)."""
    F = torch.nn.functional
    r = random.Random(SEED + 5)
    g = torch.Generator(device="cuda").manual_seed(SEED + 5)
    for case in range(count(24)):
        s = draw_shape(r, (64, 128, 40, 13))
        B, Sq = r.randint(1, 3), r.randint(1, 200)
        Sk = Sq if r.random() < 0.4 else r.randint(1, 200)
        kw = dict(is_causal=r.random() < 0.4, scale=r.choice([None, r.uniform(0.05, 0.3)]),
                  enable_gqa=s["Hq"] != s["Hk"] or r.random() < 0.5)
        if not kw["is_causal"] and r.random() < 0.2:
            kw["attn_mask"] = torch.rand(Sq, Sk, device="cuda", generator=g) < 0.8
        about = f"case {case}: B {B} Sq {Sq} Sk {Sk} {s} {kw}"
        make = lambda S, H, w: torch.randn(B, H, S, w, device="cuda", generator=g).to(s["dtype"])
        q, k, v = make(Sq, s["Hq"], s["D"]), make(Sk, s["Hk"], s["D"]), make(Sk, s["Hk"], s["Dv"])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the fallback's note
            out = flashgen.scaled_dot_product_attention(q, k, v, **kw)
        ref = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), **kw)
        lowp = F.scaled_dot_product_attention(q, k, v, **kw)
        try:
            assert out.shape == ref.shape and out.dtype == q.dtype
            # rows an attn_mask hides everywhere: PyTorch gives NaN, flashgen 0
            rows = torch.isfinite(ref)
            check("out", out[rows], ref[rows], lowp[rows], s["dtype"])
        except AssertionError as e:
            raise AssertionError(f"{about}: {e}") from None
        healthy()

"""The transformers integration without a GPU: what it makes of transformers'
keyword arguments (sliding_window, softcap, s_aux), checked on tiny Gemma 2,
gpt-oss and Mistral models (tiny_models) against their eager attention, with
flashgen.attention, attention_varlen and attention_with_kvcache replaced by
the fp64 reference (the kernels themselves are the GPU tests' business);
which calls go to the decode family (generation's steps) and which do not;
a tiny DeepSeek-V3, whose value head dim is unlike its query's, against
eager on every path; and that
attn_implementation="flashgen" stays flashgen's on a model that lists the
hub's flash kernels it works with (gpt-oss), with nothing loaded. Needs
PyTorch and transformers; skipped without them."""
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed")
transformers = pytest.importorskip("transformers", reason="transformers is not installed")

import flashgen  # noqa: E402
import flashgen.integrations.transformers as fg_transformers  # noqa: E402
import reference  # noqa: E402
import tiny_models  # noqa: E402


def fake_attention(q, k, v, *, causal=False, align="bottom-right", window=None, dropout_p=0.0,
                   softmax_scale=None, layout="bshd", softcap=None, alibi_slopes=None,
                   sinks=None):
    assert dropout_p == 0.0
    if layout == "bhsd":
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    out, _ = reference.attention(q, k, v, causal=causal, align=align, window=window,
                                 scale=softmax_scale, softcap=softcap, alibi_slopes=alibi_slopes,
                                 sinks=sinks)
    out = out.to(q.dtype)
    return out.transpose(1, 2) if layout == "bhsd" else out


def fake_varlen(q, k, v, cu_q, cu_k, max_q, max_k, *, causal=False, align="bottom-right",
                window=None, dropout_p=0.0, softmax_scale=None, softcap=None, sinks=None):
    outs = []
    for b in range(cu_q.shape[0] - 1):
        i0, i1, j0, j1 = (int(x) for x in (cu_q[b], cu_q[b + 1], cu_k[b], cu_k[b + 1]))
        out, _ = reference.attention(q[None, i0:i1], k[None, j0:j1], v[None, j0:j1],
                                     causal=causal, align=align, window=window,
                                     scale=softmax_scale, softcap=softcap, sinks=sinks)
        outs.append(out[0].to(q.dtype))
    return torch.cat(outs)


DECODE_MASK = "valid[b, k] != 0"  # the integration's predicate on a padding mask


def fake_kvcache(q, k_cache, v_cache, k=None, v=None, *, cache_seqlens=None, block_table=None,
                 causal=False, align="bottom-right", window=None, softmax_scale=None,
                 num_splits=0, return_lse=False, softcap=None, alibi_slopes=None, sinks=None,
                 score_mod=None, mask_mod=None, aux=None, layout="bshd"):
    """attention_with_kvcache as documented, for what the integration passes
    (a cache of whole sequences, no new rows): sequence b sees its cache_seqlens[b]
    keys (default all), the queries the last ones, causal and window masks
    aligned per sequence, and the predicate valid[b, k] != 0 (0 outside
    valid); layout "bhsd": q, the caches and out (B, H, S, D)."""
    if layout == "bhsd":
        q, k_cache, v_cache = (t.transpose(1, 2) for t in (q, k_cache, v_cache))
    flashgen._checks.ranks(("q", "k_cache", "v_cache"), (q, k_cache, v_cache), "bshd")
    flashgen._checks.kvcache_shapes(q, k_cache, v_cache, k, v, False)
    assert k is None and block_table is None and score_mod is None and alibi_slopes is None
    assert k_cache.stride(-1) == 1 and v_cache.stride(-1) == 1  # read in place
    B, Sq, S = q.shape[0], q.shape[1], k_cache.shape[1]
    lens = [S] * B if cache_seqlens is None else \
        [cache_seqlens] * B if isinstance(cache_seqlens, int) else cache_seqlens.tolist()
    if mask_mod is not None:
        assert mask_mod == DECODE_MASK and set(aux) == {"valid"}
        valid = aux["valid"]
        assert valid.dtype == torch.int32 and valid.dim() == 2
        valid = torch.nn.functional.pad(valid, (0, max(0, S - valid.shape[1])))[:, :S] != 0
    outs = []
    for b, n in enumerate(lens):
        mask = None if mask_mod is None else valid[b:b + 1, None, :n].expand(1, Sq, n)
        out, lse = reference.attention(q[b:b + 1], k_cache[b:b + 1, :n], v_cache[b:b + 1, :n],
                                       causal=causal, align=align, window=window,
                                       scale=softmax_scale, softcap=softcap, sinks=sinks,
                                       mask=mask)
        outs.append((out.to(q.dtype), lse.float()))
    out = torch.cat([o for o, _ in outs])
    if layout == "bhsd":
        out = out.transpose(1, 2)
    return (out, torch.cat([lse for _, lse in outs])) if return_lse else out


@pytest.fixture
def on_the_cpu(monkeypatch):
    """The stand-ins, and how often each is called."""
    calls = {"attention": 0, "varlen": 0, "kvcache": 0, "masked": 0}

    def counted(name, fn):
        def call(*args, **kwargs):
            calls[name] += 1
            calls["masked"] += kwargs.get("mask_mod") is not None
            return fn(*args, **kwargs)
        return call
    monkeypatch.setattr(flashgen, "attention", counted("attention", fake_attention))
    monkeypatch.setattr(flashgen, "attention_varlen", counted("varlen", fake_varlen))
    monkeypatch.setattr(flashgen, "attention_with_kvcache", counted("kvcache", fake_kvcache))
    fg_transformers.register()
    return calls


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    paths = {}
    for kind in tiny_models.KINDS:
        paths[kind] = tmp_path_factory.mktemp(kind)
        tiny_models.build(transformers, kind).save_pretrained(paths[kind])
    return paths


def load(path, impl):
    model = transformers.AutoModelForCausalLM.from_pretrained(path, attn_implementation=impl,
                                                              dtype=torch.float32)
    assert model.config._attn_implementation == impl
    return model


@pytest.mark.parametrize("kind", tiny_models.KINDS)
def test_agrees_with_eager(on_the_cpu, saved, kind):
    """Logits, every parameter's gradient (gpt-oss's sinks included), padded
    batches (left and right) and greedy generation past the window."""
    torch.manual_seed(1)
    ids = torch.randint(0, 256, (2, 40))
    mask = torch.ones_like(ids)
    mask[0, :7] = 0
    mask[1, 33:] = 0
    got = {}
    for impl in ("eager", "flashgen"):
        model = load(saved[kind], impl)
        out = model(input_ids=ids, labels=ids)
        out.loss.backward()
        grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
        with torch.no_grad():
            padded = model(input_ids=ids, attention_mask=mask).logits
            gen = model.generate(ids[:1, :20], max_new_tokens=10, do_sample=False)
        got[impl] = out.logits.detach(), grads, padded, gen
    (logits, grads, padded, gen), ref = got["flashgen"], got["eager"]
    assert (logits - ref[0]).abs().max() < 1e-4
    assert grads.keys() == ref[1].keys()
    if kind == "gpt_oss":
        assert any("sinks" in name for name in grads)
    for name in grads:
        assert (grads[name] - ref[1][name]).abs().max() < 1e-4, name
    real = mask.bool()
    assert (padded[real] - ref[2][real]).abs().max() < 1e-4
    assert torch.equal(gen, ref[3])


@pytest.mark.parametrize("padded", (False, True))
@pytest.mark.parametrize("kind, whole", [("llama", False)] + [
    (kind, whole) for kind in tiny_models.KINDS for whole in (False, True)])
def test_generation_steps_go_to_the_decode_family(on_the_cpu, kind, whole, padded):
    """Greedy generation as eager generates it (the tokens, and each step's
    logits): the prompt through attention or attention_varlen, every later
    step (one new query against the cache) through attention_with_kvcache;
    a left-padded batch's padding hidden by its predicate, inside the
    sliding layers' windows too (8 keys, 5 real tokens), with Gemma 2's
    softcap and gpt-oss's sinks. The sliding layers' caches keep the
    window's keys; whole: a cache that keeps every key (DynamicCache()
    without the config), where the steps' window binds."""
    torch.manual_seed(2)
    ids = torch.randint(0, 256, (2, 12))
    mask = torch.ones_like(ids)
    if padded:
        mask[0, :7] = 0
    new = 12
    got = {}
    for impl in ("eager", "flashgen"):
        model = tiny_models.build(transformers, kind)
        model.set_attn_implementation(impl)
        cache = transformers.DynamicCache() if whole else None
        with torch.no_grad():
            got[impl] = model.generate(ids, attention_mask=mask, max_new_tokens=new,
                                       min_new_tokens=new, do_sample=False, pad_token_id=0,
                                       output_logits=True, return_dict_in_generate=True,
                                       past_key_values=cache)
    ours, ref = got["flashgen"], got["eager"]
    assert torch.equal(ours.sequences, ref.sequences)
    assert (torch.stack(ours.logits) - torch.stack(ref.logits)).abs().max() < 1e-4
    layers = model.config.num_hidden_layers
    assert on_the_cpu["attention"] + on_the_cpu["varlen"] == layers  # the prompt
    assert on_the_cpu["varlen"] == (layers if padded else 0)
    assert on_the_cpu["kvcache"] == layers * (new - 1)  # every step
    assert (on_the_cpu["masked"] > 0) == padded


def test_a_padded_step_gives_what_the_packed_path_gives(on_the_cpu):
    """A step of three queries with padding left (sequence 0) and right
    (sequence 1: its last two queries are padding), with a window, softcap
    and sinks: the decode family's predicate gives the packed path's
    result, zeros in the padded queries' rows."""
    torch.manual_seed(3)
    q = torch.randn(2, 4, 3, 16)
    k, v = torch.randn(2, 2, 10, 16), torch.randn(2, 2, 10, 16)
    mask = torch.ones(2, 10, dtype=torch.bool)
    mask[0, :4] = False
    mask[1, 8:] = False
    for kw in ({}, {"sliding_window": 4, "softcap": 5.0, "s_aux": torch.randn(4)}):
        before = on_the_cpu["kvcache"]
        got, _ = fg_transformers.flashgen_attention_forward(None, q, k, v, mask, **kw)
        assert on_the_cpu["kvcache"] == before + 1
        want = fg_transformers._unpadded(q, k, v, mask, True, 0.0, None,
                                         fg_transformers._variants(kw, True, q))
        assert got.shape == want.shape == (2, 3, 4, 16)
        assert (got - want).abs().max() < 1e-6
        assert (got[1, 1:] == 0).all() and (got[1, 0] != 0).any()


def test_what_is_not_a_decoding_step_keeps_its_path(monkeypatch):
    """Which stand-in each call reaches: a few queries (1..16) against more
    keys go to attention_with_kvcache; the prompt (as many queries as
    keys), more queries, dropout, a gradient to carry, a head dim that is
    not a multiple of 8 and a cache that cannot be read in place go where
    they went before."""
    seen = []

    def stand_in(name, shape):
        def call(q, *args, **kwargs):
            seen.append(name)
            return torch.zeros(shape(q, *args))
        return call
    monkeypatch.setattr(flashgen, "attention", stand_in("attention", lambda q, *_: q.shape))
    monkeypatch.setattr(flashgen, "attention_varlen", stand_in("varlen", lambda q, *_: q.shape))
    monkeypatch.setattr(flashgen, "attention_with_kvcache",
                        stand_in("kvcache", lambda q, *_: q.shape))

    def path(sq, sk, d=16, padded=False, dropout=0.0, grad=False, key=None, **kw):
        q = torch.randn(2, 4, sq, d, requires_grad=grad)
        k = torch.randn(2, 2, sk, d) if key is None else key
        mask = None
        if padded:
            mask = torch.ones(2, sk, dtype=torch.bool)
            mask[0, :2] = False
        seen.clear()
        out, _ = fg_transformers.flashgen_attention_forward(None, q, k, k, mask,
                                                            dropout=dropout, **kw)
        assert out.shape == (2, sq, 4, d)
        return seen[0]

    assert path(1, 10) == "kvcache"
    assert path(16, 40) == "kvcache"
    assert path(1, 10, padded=True) == "kvcache"
    assert path(1, 10, sliding_window=4, softcap=5.0) == "kvcache"
    assert path(10, 10) == "attention"
    assert path(10, 10, padded=True) == "varlen"
    assert path(17, 40) == "attention"
    assert path(1, 10, dropout=0.1) == "attention"
    assert path(1, 10, padded=True, dropout=0.1) == "varlen"
    assert path(1, 10, grad=True) == "attention"
    assert path(1, 10, padded=True, grad=True) == "varlen"
    sinks = torch.nn.Parameter(torch.randn(4))
    assert path(1, 10, s_aux=sinks) == "attention"
    with torch.no_grad():
        assert path(1, 10, grad=True) == "kvcache"
        assert path(1, 10, s_aux=sinks) == "kvcache"
        assert path(1, 10, d=12) == "attention"
        odd = torch.randn(2, 2, 10, 17)[..., 1:]  # rows not 16-byte aligned
        assert path(1, 10, key=odd) == "attention"
        # the shapes and strides of a step taken above, its address off 16 bytes: tested
        # on every call, not kept with the shapes
        shifted = torch.randn(2 * 2 * 10 * 16 + 2)[2:].view(2, 2, 10, 16)  # 8 bytes off
        assert shifted.data_ptr() % 16 and path(1, 10, key=shifted) == "attention"
        assert path(1, 10) == "kvcache"


def test_a_call_like_an_earlier_one_skips_the_checks(monkeypatch):
    """The integration's checks and its choice of path by shapes run once per
    call shape (shapes, strides, dtypes and devices of q, k, v; dropout);
    another shape runs them again, and bad tensors are still refused."""
    checked = []
    monkeypatch.setattr(fg_transformers, "_checked", lambda *ts: checked.append(1))
    monkeypatch.setattr(fg_transformers, "_seen", {})
    monkeypatch.setattr(flashgen, "attention_with_kvcache",
                        lambda q, *args, **kwargs: torch.zeros(q.shape))
    monkeypatch.setattr(flashgen, "attention", lambda q, *args, **kwargs: torch.zeros(q.shape))
    q, k = torch.randn(2, 4, 1, 16), torch.randn(2, 2, 10, 16)
    for _ in range(3):
        fg_transformers.flashgen_attention_forward(None, q, k, k, None)
    assert len(checked) == 1
    fg_transformers.flashgen_attention_forward(None, q, k.transpose(2, 3).contiguous()
                                               .transpose(2, 3), k, None)  # other strides
    fg_transformers.flashgen_attention_forward(None, q, k, k, None, dropout=0.1)
    assert len(checked) == 3
    monkeypatch.undo()
    with pytest.raises(ValueError):
        fg_transformers.flashgen_attention_forward(None, q, torch.randn(2, 3, 10, 16),
                                                   torch.randn(2, 3, 10, 16), None)


@pytest.mark.parametrize("kind", tiny_models.KINDS)
def test_the_variants_bind(saved, kind):
    """Without its variants each model's logits move far more than the
    tolerances above: the comparisons test them."""
    ids = torch.randint(0, 256, (1, 40))
    model = load(saved[kind], "eager")
    with torch.no_grad():
        base = model(input_ids=ids, use_cache=False).logits
        plain = tiny_models.without_variants(model, kind)(input_ids=ids, use_cache=False).logits
    assert (plain - base).abs().max() > 0.1


def test_window_follows_transformers():
    """sliding_window=W: the W keys up to the query's own (transformers'
    sliding_window_overlay: i - W < j <= i), W - 1 both ways without a
    causal mask (its flash path's window_size)."""
    assert fg_transformers._window(None, True) is None
    assert fg_transformers._window(8, True) == (7, 0)
    assert fg_transformers._window(8, False) == (7, 7)
    assert fg_transformers._window(1, True) == (0, 0)
    for bad in (0, -3, 2.5, True, "8"):
        with pytest.raises(ValueError, match="sliding_window"):
            fg_transformers._window(bad, True)


def test_sinks_reach_attention_as_fp32_with_their_gradient(monkeypatch):
    seen = {}

    def spy(q, k, v, **kw):
        seen.update(kw)
        return fake_attention(q, k, v, **kw)
    monkeypatch.setattr(flashgen, "attention", spy)
    query = torch.randn(1, 4, 10, 16, dtype=torch.bfloat16)
    s_aux = torch.nn.Parameter(torch.randn(4, dtype=torch.bfloat16))
    out, _ = fg_transformers.flashgen_attention_forward(None, query, query, query, None,
                                                        s_aux=s_aux, sliding_window=4,
                                                        softcap=20.0)
    assert seen["sinks"].dtype == torch.float32 and seen["window"] == (3, 0)
    assert seen["softcap"] == 20.0
    out.float().sum().backward()
    assert s_aux.grad is not None and s_aux.grad.dtype == torch.bfloat16


def test_gpt_oss_keeps_the_name_and_loads_nothing():
    """gpt-oss lists the hub's flash kernels it works with; transformers
    replaces any other name holding "flash" by the first of them (and then
    wants the `kernels` package and a download). register() keeps
    "flashgen"; other names are left to transformers."""
    fg_transformers.register()
    fg_transformers.register()  # twice: wrapped once
    check = transformers.PreTrainedModel._check_and_adjust_attn_implementation
    assert getattr(check, "answers_flashgen", False)
    assert not getattr(check.__wrapped__, "answers_flashgen", False)
    model = tiny_models.build(transformers, "gpt_oss")
    model.set_attn_implementation("flashgen")
    assert model.config._attn_implementation == "flashgen"
    config = model.config
    config._attn_implementation = "flashgen"
    assert transformers.GptOssForCausalLM(config).config._attn_implementation == "flashgen"
    model.set_attn_implementation("eager")
    assert model.config._attn_implementation == "eager"
    # another name holding "flash" still gets transformers' treatment: the
    # listed hub kernel in its place, which needs what is not here
    with pytest.raises((ImportError, ValueError, OSError)):
        model.set_attn_implementation("flashgen_unregistered")


def test_deepseek_v3_agrees_with_eager(on_the_cpu, monkeypatch):
    """DeepSeek-V3 (value head dim 64, query and key head dim 64 + 32):
    logits, every parameter's gradient, a batch padded left and right, and
    greedy generation, unpadded and left-padded, as eager computes them.
    Every call goes to attention, attention_varlen or (generation's steps)
    attention_with_kvcache with v's own head dim."""
    torch.manual_seed(4)
    ids = torch.randint(0, 256, (2, 24))
    mask = torch.ones_like(ids)
    mask[0, :5] = 0
    mask[1, 19:] = 0
    widths = set()

    def widths_of(fn):  # the head dims each call gets: (q's, v's)
        def call(q, k, v, *args, **kwargs):
            widths.add((q.shape[-1], v.shape[-1]))
            return fn(q, k, v, *args, **kwargs)
        return call
    for name in ("attention", "attention_varlen", "attention_with_kvcache"):
        monkeypatch.setattr(flashgen, name, widths_of(getattr(flashgen, name)))
    got = {}
    for impl in ("eager", "flashgen"):
        model = tiny_models.build(transformers, "deepseek_v3")
        model.set_attn_implementation(impl)
        out = model(input_ids=ids, labels=ids)
        out.loss.backward()
        grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
        with torch.no_grad():
            padded = model(input_ids=ids, attention_mask=mask).logits
            gen = model.generate(ids[:1, :12], max_new_tokens=8, min_new_tokens=8,
                                 do_sample=False, pad_token_id=0)
            left = mask.clone()
            left[1] = 1
            gen_padded = model.generate(ids[:, :12], attention_mask=left[:, :12],
                                        max_new_tokens=8, min_new_tokens=8, do_sample=False,
                                        pad_token_id=0, output_logits=True,
                                        return_dict_in_generate=True)
        got[impl] = out.logits.detach(), grads, padded, gen, gen_padded
    (logits, grads, padded, gen, gen_padded), ref = got["flashgen"], got["eager"]
    assert (logits - ref[0]).abs().max() < 1e-4
    assert grads.keys() == ref[1].keys() and any("kv_b_proj" in name for name in grads)
    for name in grads:
        assert (grads[name] - ref[1][name]).abs().max() < 1e-4, name
    real = mask.bool()
    assert (padded[real] - ref[2][real]).abs().max() < 1e-4
    assert torch.equal(gen, ref[3])
    assert torch.equal(gen_padded.sequences, ref[4].sequences)
    assert (torch.stack(gen_padded.logits) - torch.stack(ref[4].logits)).abs().max() < 1e-4
    assert widths == {(96, 64)}
    assert on_the_cpu["varlen"] > 0 and on_the_cpu["kvcache"] > 0

"""The transformers integration without a GPU: what it makes of transformers'
keyword arguments (sliding_window, softcap, s_aux), checked on tiny Gemma 2,
gpt-oss and Mistral models (tiny_models) against their eager attention, with
flashgen.attention and attention_varlen replaced by the fp64 reference
(the kernels themselves are the GPU tests' business); and that
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


@pytest.fixture
def on_the_cpu(monkeypatch):
    monkeypatch.setattr(flashgen, "attention", fake_attention)
    monkeypatch.setattr(flashgen, "attention_varlen", fake_varlen)
    fg_transformers.register()


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


def test_deepseek_v3_value_head_dim_is_refused_on_every_path(monkeypatch):
    """DeepSeek-V3 (query and key head dim 96, value 64; not supported yet):
    an unpadded forward and generation over a left-padded batch are refused
    alike, before anything is packed (on a GPU the padded path indexed past
    the value: a device-side assert)."""
    def reached(*args, **kwargs):
        raise AssertionError("attention_varlen reached with unchecked shapes")
    monkeypatch.setattr(flashgen, "attention_varlen", reached)
    fg_transformers.register()
    model = tiny_models.build(transformers, "deepseek_v3")
    model.set_attn_implementation("flashgen")
    ids = torch.randint(0, 256, (2, 12))
    mask = torch.ones_like(ids)
    mask[0, :4] = 0
    refused = r"v: shape \(2, 12, 4, 64\) differs from k's \(2, 12, 4, 96\)"
    with torch.no_grad():
        with pytest.raises(ValueError, match=refused):
            model.generate(ids, attention_mask=mask, max_new_tokens=3, do_sample=False)
        with pytest.raises(ValueError, match=refused):
            model(input_ids=ids)

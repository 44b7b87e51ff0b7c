"""attn_implementation="flashgen" in transformers: a small randomly
initialised Llama-shaped model with grouped-query attention, saved and
loaded with from_pretrained. Logits and parameter gradients in bf16 must be
as close to the fp32 eager model as those of the sdpa implementation are
(within a factor of 2); padded batches agree with sdpa; and what the
integration refuses it names. A tiny DeepSeek-V3 (tiny_models: value head
dim 64, query and key head dim 96) against fp32 eager: bf16 logits and
gradients, greedy generation through the KV cache, padded batches and a
cache step, none of it on the decode family."""
import pytest

from conftest import gpu_or_skip

pytestmark = pytest.mark.gpu
torch = gpu_or_skip()
transformers = pytest.importorskip("transformers", reason="transformers is not installed")

import flashgen.integrations.transformers as fg_transformers  # noqa: E402
import tiny_models  # noqa: E402


@pytest.fixture(scope="module")
def saved_model(tmp_path_factory):
    fg_transformers.register()
    config = transformers.LlamaConfig(vocab_size=512, hidden_size=256, intermediate_size=512,
                                      num_hidden_layers=2, num_attention_heads=8,
                                      num_key_value_heads=2, max_position_embeddings=1024)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config)
    path = tmp_path_factory.mktemp("llama")
    model.save_pretrained(path)
    return path


def run(path, impl, dtype, ids):
    model = transformers.AutoModelForCausalLM.from_pretrained(
        path, attn_implementation=impl, torch_dtype=dtype).cuda()
    assert model.config._attn_implementation == impl
    out = model(input_ids=ids, labels=ids)
    out.loss.backward()
    grads = torch.cat([p.grad.float().flatten() for p in model.parameters()])
    return out.logits.float(), grads


def rel(a, ref):
    return ((a - ref).norm() / ref.norm()).item()


def test_logits_and_gradients_agree_with_sdpa(saved_model):
    ids = torch.randint(0, 512, (2, 97), device="cuda")
    ref_logits, ref_grads = run(saved_model, "eager", torch.float32, ids)
    errs = {}
    for impl in ("flashgen", "sdpa", "eager"):
        logits, grads = run(saved_model, impl, torch.bfloat16, ids)
        errs[impl] = (rel(logits, ref_logits), rel(grads, ref_grads))
    print("relative error vs fp32 eager (logits, gradients):", errs)
    for i, what in enumerate(("logits", "gradients")):
        bound = 2 * max(errs["sdpa"][i], errs["eager"][i])
        assert errs["flashgen"][i] <= bound, (what, errs)


def test_generate_with_a_kv_cache(saved_model):
    ids = torch.randint(0, 512, (1, 20), device="cuda")
    outs = {}
    for impl in ("flashgen", "sdpa"):
        model = transformers.AutoModelForCausalLM.from_pretrained(
            saved_model, attn_implementation=impl, torch_dtype=torch.float16).cuda()
        outs[impl] = model(input_ids=ids).logits[:, -1].float()
        gen = model.generate(ids, max_new_tokens=8, do_sample=False)
        assert gen.shape == (1, 28)
    assert torch.allclose(outs["flashgen"], outs["sdpa"], atol=2e-2)


def test_padded_batches_agree_with_sdpa(saved_model):
    """Left and right padding: logits at the real tokens, then one step more
    through the KV cache (one query per row against a padded cache), as sdpa
    gives them; and generation runs."""
    ids = torch.randint(0, 512, (3, 40), device="cuda")
    mask = torch.ones_like(ids)
    mask[0, :13] = 0   # left padding
    mask[1, 29:] = 0   # right padding
    nxt = torch.randint(0, 512, (3, 1), device="cuda")
    mask2 = torch.cat([mask, torch.ones_like(nxt)], dim=1)
    logits, steps = {}, {}
    for impl in ("flashgen", "sdpa"):
        model = transformers.AutoModelForCausalLM.from_pretrained(
            saved_model, attn_implementation=impl, torch_dtype=torch.float16).cuda()
        out = model(input_ids=ids, attention_mask=mask, use_cache=True)
        logits[impl] = out.logits.float()
        steps[impl] = model(input_ids=nxt, attention_mask=mask2,
                            past_key_values=out.past_key_values).logits[:, -1].float()
        gen = model.generate(ids, attention_mask=mask, max_new_tokens=6, do_sample=False)
        assert gen.shape == (3, 46)
    real = mask.bool()
    assert torch.allclose(logits["flashgen"][real], logits["sdpa"][real], atol=2e-2)
    assert torch.allclose(steps["flashgen"], steps["sdpa"], atol=2e-2)


def test_generation_steps_run_the_decode_family(saved_model, monkeypatch):
    """Greedy generation over a left-padded batch: every step after the
    prompt (one query per row against the cache, the padding hidden by a
    predicate) runs attention_with_kvcache, and each step's logits are
    sdpa's while the tokens before it agree."""
    import flashgen
    real, masks = flashgen.attention_with_kvcache, []

    def counted(*args, **kwargs):
        masks.append(kwargs.get("mask_mod"))
        return real(*args, **kwargs)
    monkeypatch.setattr(flashgen, "attention_with_kvcache", counted)
    ids = torch.randint(0, 512, (2, 30), device="cuda")
    mask = torch.ones_like(ids)
    mask[0, :11] = 0
    out = {}
    for impl in ("flashgen", "sdpa"):
        model = transformers.AutoModelForCausalLM.from_pretrained(
            saved_model, attn_implementation=impl, torch_dtype=torch.float16).cuda()
        out[impl] = model.generate(ids, attention_mask=mask, max_new_tokens=8, min_new_tokens=8,
                                   do_sample=False, pad_token_id=0, output_logits=True,
                                   return_dict_in_generate=True)
    assert len(masks) == model.config.num_hidden_layers * 7 and all(masks)
    new = (out["flashgen"].sequences[:, 30:] == out["sdpa"].sequences[:, 30:]).all(0)
    agree = 1 + (int(new.logical_not().nonzero()[0]) if not new.all() else len(new))
    for got, want in list(zip(out["flashgen"].logits, out["sdpa"].logits))[:agree]:
        assert torch.allclose(got.float(), want.float(), atol=2e-2)


def test_sequences_packed_by_position_ids(saved_model):
    """Two sequences in one row, positions restarting at 0: the logits of each
    as sdpa gives them for the sequence alone."""
    a, b = (torch.randint(0, 512, (1, n), device="cuda") for n in (25, 35))
    ids = torch.cat([a, b], dim=1)
    pos = torch.cat([torch.arange(25), torch.arange(35)]).cuda()[None]
    fg = transformers.AutoModelForCausalLM.from_pretrained(
        saved_model, attn_implementation="flashgen", torch_dtype=torch.float16).cuda()
    ref = transformers.AutoModelForCausalLM.from_pretrained(
        saved_model, attn_implementation="sdpa", torch_dtype=torch.float16).cuda()
    got = fg(input_ids=ids, position_ids=pos).logits.float()
    want = torch.cat([ref(input_ids=a).logits, ref(input_ids=b).logits], dim=1).float()
    assert torch.allclose(got, want, atol=2e-2)


def test_other_masks_are_refused_by_name():
    query = torch.zeros(2, 4, 10, 64, device="cuda", dtype=torch.float16)
    mask = torch.zeros(2, 1, 10, 10, device="cuda", dtype=torch.float16)
    with pytest.raises(NotImplementedError, match="attention_mask of shape"):
        fg_transformers.flashgen_attention_forward(None, query, query, query, mask)


# ---- DeepSeek-V3: a value head dim (64) unlike the query's and key's (96) ------------

@pytest.fixture(scope="module")
def saved_deepseek(tmp_path_factory):
    fg_transformers.register()
    path = tmp_path_factory.mktemp("deepseek_v3")
    tiny_models.build(transformers, "deepseek_v3").save_pretrained(path)
    return path


@pytest.fixture
def decode_steps(monkeypatch):
    """The (query, cache's value) head dims of the steps that reach the
    decode family (attention_with_kvcache), which then runs them."""
    import flashgen
    steps, run = [], flashgen.attention_with_kvcache

    def counted(q, k_cache, v_cache, *args, **kwargs):
        steps.append((q.shape[-1], v_cache.shape[-1]))
        return run(q, k_cache, v_cache, *args, **kwargs)
    monkeypatch.setattr(flashgen, "attention_with_kvcache", counted)
    return steps


def within(errs, what, i, floor=1e-3):
    """flashgen's error at most twice the worse of sdpa's and eager's."""
    bound = 2 * max(errs["sdpa"][i], errs["eager"][i]) + floor
    assert errs["flashgen"][i] <= bound, (what, errs)


def test_deepseek_v3_logits_and_gradients_agree_with_eager(saved_deepseek):
    """One training step's forward and backward in bf16: logits and every
    parameter's gradient within twice the error of transformers' bf16
    implementations against the fp32 eager model."""
    ids = torch.randint(0, 256, (2, 77), device="cuda")
    runs = {}
    for impl, dtype in (("eager", torch.float32), ("flashgen", torch.bfloat16),
                        ("sdpa", torch.bfloat16), ("eager", torch.bfloat16)):
        model = tiny_models.load(transformers, saved_deepseek, impl, dtype)
        out = model(input_ids=ids, labels=ids)
        out.loss.backward()
        grads = {n: p.grad.float() for n, p in model.named_parameters() if p.grad is not None}
        runs[impl, dtype] = out.logits.float(), grads
    ref_logits, ref_grads = runs["eager", torch.float32]
    names = sorted(ref_grads)
    assert any("kv_b_proj" in n for n in names)
    flat_ref = torch.cat([ref_grads[n].flatten() for n in names])
    errs = {}
    for impl in ("flashgen", "sdpa", "eager"):
        logits, grads = runs[impl, torch.bfloat16]
        assert sorted(grads) == names, impl
        errs[impl] = (rel(logits, ref_logits),
                      rel(torch.cat([grads[n].flatten() for n in names]), flat_ref))
    print("deepseek_v3 relative error vs fp32 eager (logits, gradients):", errs)
    within(errs, "logits", 0)
    within(errs, "gradients", 1)


def test_deepseek_v3_greedy_generation(saved_deepseek, decode_steps):
    """Greedy generation through the KV cache (the steps through the decode
    family, query/key head dim 96, value 64): each token one the fp32 eager
    model also ranks first, within the logits' error; a left-padded batch
    generates too."""
    ids = torch.randint(0, 256, (2, 20), device="cuda")
    model = tiny_models.load(transformers, saved_deepseek, "flashgen", torch.bfloat16)
    ref = tiny_models.load(transformers, saved_deepseek, "eager", torch.float32)
    with torch.no_grad():
        err = (model(input_ids=ids).logits.float() - ref(input_ids=ids).logits).abs().max()
        gen = model.generate(ids, max_new_tokens=16, do_sample=False)
        assert gen.shape == (2, 36)
        logits = ref(input_ids=gen).logits[:, 19:-1]
        chosen = logits.gather(-1, gen[:, 20:, None])[..., 0]
        slack = logits.max(-1).values - chosen
        assert (slack <= 3 * err + 1e-3).all(), (slack.max().item(), err.item())
        assert decode_steps and set(decode_steps) == {(96, 64)}, decode_steps
        mask = torch.ones_like(ids)
        mask[0, :7] = 0
        gen = model.generate(ids, attention_mask=mask, max_new_tokens=8, min_new_tokens=8,
                             do_sample=False, pad_token_id=0)
        assert gen.shape == (2, 28)


def test_deepseek_v3_padded_batches_and_a_cache_step(saved_deepseek, decode_steps):
    """Left and right padding (the packed kernels), then one step more
    through the KV cache (the decode family), against fp32 eager at the real tokens, within
    twice the error of sdpa's and eager's in bf16."""
    ids = torch.randint(0, 256, (3, 40), device="cuda")
    mask = torch.ones_like(ids)
    mask[0, :13] = 0   # left padding
    mask[1, 29:] = 0   # right padding
    nxt = torch.randint(0, 256, (3, 1), device="cuda")
    mask2 = torch.cat([mask, torch.ones_like(nxt)], dim=1)
    got = {}
    for impl, dtype in (("eager", torch.float32), ("flashgen", torch.bfloat16),
                        ("sdpa", torch.bfloat16), ("eager", torch.bfloat16)):
        model = tiny_models.load(transformers, saved_deepseek, impl, dtype)
        with torch.no_grad():
            out = model(input_ids=ids, attention_mask=mask, use_cache=True)
            step = model(input_ids=nxt, attention_mask=mask2,
                         past_key_values=out.past_key_values).logits[:, -1].float()
        got[impl, dtype] = out.logits.float(), step
    real = mask.bool()
    ref_logits, ref_step = got["eager", torch.float32]
    errs = {impl: (rel(got[impl, torch.bfloat16][0][real], ref_logits[real]),
                   rel(got[impl, torch.bfloat16][1], ref_step))
            for impl in ("flashgen", "sdpa", "eager")}
    print("deepseek_v3 relative error vs fp32 eager (padded logits, cache step):", errs)
    assert decode_steps, "the cache step did not reach the decode family"
    within(errs, "padded logits", 0)
    within(errs, "cache step", 1)

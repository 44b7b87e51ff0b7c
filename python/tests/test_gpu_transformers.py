"""attn_implementation="flashgen" in transformers: a small randomly
initialised Llama-shaped model with grouped-query attention, saved and
loaded with from_pretrained. Logits and parameter gradients in bf16 must be
as close to the fp32 eager model as those of the sdpa implementation are
(within a factor of 2), and what the integration refuses it names."""
import pytest

from conftest import gpu_or_skip

pytestmark = pytest.mark.gpu
torch = gpu_or_skip()
transformers = pytest.importorskip("transformers", reason="transformers is not installed")

import flashgen.integrations.transformers as fg_transformers  # noqa: E402


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


def test_padding_is_refused_by_name(saved_model):
    model = transformers.AutoModelForCausalLM.from_pretrained(
        saved_model, attn_implementation="flashgen", torch_dtype=torch.float16).cuda()
    ids = torch.randint(0, 512, (2, 10), device="cuda")
    mask = torch.ones_like(ids)
    mask[0, :3] = 0
    with pytest.raises(NotImplementedError, match="padded batches"):
        model(input_ids=ids, attention_mask=mask)
    model(input_ids=ids, attention_mask=torch.ones_like(ids))  # no padding: fine

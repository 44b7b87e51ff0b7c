"""attn_implementation="flashgen" on models with the scores' variants: tiny
random Gemma 2 (logit soft-capping, sliding windows), gpt-oss (attention
sinks, sliding windows) and Mistral (sliding windows), built in code
(tiny_models: nothing is downloaded) with each variant made to bind,
saved and loaded with from_pretrained. bf16 logits and parameter gradients
(gpt-oss's sinks on their own too) must be within twice the error of
transformers' own bf16 implementations against the fp32 eager model;
greedy generation past the window, through transformers' sliding KV caches,
picks tokens the fp32 eager model also ranks first (within the logits'
error); and padded batches, left and right, and a step of the KV cache after
them agree likewise."""
import pytest

from conftest import gpu_or_skip

pytestmark = pytest.mark.gpu
torch = gpu_or_skip()
transformers = pytest.importorskip("transformers", reason="transformers is not installed")

import flashgen.integrations.transformers as fg_transformers  # noqa: E402
import tiny_models  # noqa: E402

# transformers' implementations to measure flashgen against: Gemma 2 and
# gpt-oss through eager (gpt-oss has no sdpa; Gemma 2's cap is eager's).
OTHERS = {"gemma2": ("eager",), "gpt_oss": ("eager",), "mistral": ("sdpa", "eager")}


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    fg_transformers.register()
    paths = {}
    for kind in tiny_models.KINDS:
        paths[kind] = tmp_path_factory.mktemp(kind)
        tiny_models.build(transformers, kind).save_pretrained(paths[kind])
    return paths


def rel(a, ref):
    return ((a.float() - ref.float()).norm() / ref.float().norm()).item()


def run(path, impl, dtype, ids):
    model = tiny_models.load(transformers, path, impl, dtype)
    out = model(input_ids=ids, labels=ids)
    out.loss.backward()
    grads = {n: p.grad.float() for n, p in model.named_parameters() if p.grad is not None}
    return out.logits.float(), grads


def within(errs, kind, what, i, floor=1e-3):
    bound = 2 * max(errs[impl][i] for impl in OTHERS[kind]) + floor
    assert errs["flashgen"][i] <= bound, (kind, what, errs)


@pytest.mark.parametrize("kind", tiny_models.KINDS)
def test_logits_and_gradients_agree_with_eager(saved, kind):
    ids = torch.randint(0, 256, (2, 77), device="cuda")
    ref_logits, ref_grads = run(saved[kind], "eager", torch.float32, ids)
    names = sorted(ref_grads)
    sinks = [n for n in names if n.endswith("sinks")]
    assert bool(sinks) == (kind == "gpt_oss")
    errs = {}
    for impl in ("flashgen",) + OTHERS[kind]:
        logits, grads = run(saved[kind], impl, torch.bfloat16, ids)
        assert sorted(grads) == names, impl
        flat = torch.cat([grads[n].flatten() for n in names])
        flat_ref = torch.cat([ref_grads[n].flatten() for n in names])
        errs[impl] = (rel(logits, ref_logits), rel(flat, flat_ref),
                      max((rel(grads[n], ref_grads[n]) for n in sinks), default=0.0))
    print(kind, "relative error vs fp32 eager (logits, gradients, sinks' gradients):", errs)
    within(errs, kind, "logits", 0)
    within(errs, kind, "gradients", 1)
    within(errs, kind, "sinks' gradients", 2, floor=1e-2)


@pytest.mark.parametrize("kind", tiny_models.KINDS)
def test_greedy_generation_past_the_window(saved, kind):
    ids = torch.randint(0, 256, (2, 20), device="cuda")
    model = tiny_models.load(transformers, saved[kind], "flashgen", torch.bfloat16)
    ref = tiny_models.load(transformers, saved[kind], "eager", torch.float32)
    with torch.no_grad():
        err = (model(input_ids=ids).logits.float() - ref(input_ids=ids).logits).abs().max()
        gen = model.generate(ids, max_new_tokens=16, do_sample=False)
        assert gen.shape == (2, 36)
        # each step as the fp32 eager model sees the sequence so far
        logits = ref(input_ids=gen).logits[:, 19:-1]
        chosen = logits.gather(-1, gen[:, 20:, None])[..., 0]
        slack = logits.max(-1).values - chosen
        assert (slack <= 3 * err + 1e-3).all(), (kind, slack.max().item(), err.item())
        bf16_eager = tiny_models.load(transformers, saved[kind], "eager", torch.bfloat16)
        same = bf16_eager.generate(ids, max_new_tokens=16, do_sample=False)
        print(kind, "tokens as bf16 eager's:", (same == gen).float().mean().item())


@pytest.mark.parametrize("kind", tiny_models.KINDS)
def test_padded_batches_and_a_cache_step(saved, kind):
    """Left and right padding (varlen with the variants), then one step more
    through the KV cache, against fp32 eager at the real tokens."""
    ids = torch.randint(0, 256, (3, 40), device="cuda")
    mask = torch.ones_like(ids)
    mask[0, :13] = 0   # left padding
    mask[1, 29:] = 0   # right padding
    nxt = torch.randint(0, 256, (3, 1), device="cuda")
    mask2 = torch.cat([mask, torch.ones_like(nxt)], dim=1)
    got = {}
    runs = [("eager", torch.float32)] + [(impl, torch.bfloat16)
                                         for impl in ("flashgen",) + OTHERS[kind]]
    for impl, dtype in runs:
        model = tiny_models.load(transformers, saved[kind], impl, dtype)
        with torch.no_grad():
            out = model(input_ids=ids, attention_mask=mask, use_cache=True)
            step = model(input_ids=nxt, attention_mask=mask2,
                         past_key_values=out.past_key_values).logits[:, -1].float()
        got[(impl, dtype)] = out.logits.float(), step
    # The step of the right-padded row is left out: its new token comes after
    # the padding, where transformers' eager masks count the window in
    # positions (padding included) and flash-style ones in tokens.
    real = mask.bool()
    ref_logits, ref_step = got[("eager", torch.float32)]
    errs = {impl: (rel(got[(impl, torch.bfloat16)][0][real], ref_logits[real]),
                   rel(got[(impl, torch.bfloat16)][1][[0, 2]], ref_step[[0, 2]]))
            for impl in ("flashgen",) + OTHERS[kind]}
    print(kind, "relative error vs fp32 eager (padded logits, cache step):", errs)
    within(errs, kind, "padded logits", 0)
    within(errs, kind, "cache step", 1)

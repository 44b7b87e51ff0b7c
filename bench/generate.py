"""transformers' generate through attn_implementation="flashgen" against
"sdpa": tokens per second of greedy generation on a randomly initialised
model with Llama-3-8B's layer shape (hidden 4096, 32 query heads on 8 KV
heads, head dim 128, MLP 14336, vocabulary 128256; built in code, nothing
downloaded) and a few layers, bf16, a prompt of 2048 tokens and 128 new
ones at batch 1 and 32. The prompt runs the dense forward, each later step
the decode family (attention_with_kvcache). Reported: all tokens generated
per second of generate, and the steps after the prompt alone (generate of
128 tokens less generate of 1, per step).

usage: python3 bench/generate.py [--quick] [--layers N]  (the flashgen package and
       transformers importable, a GPU)
"""
import argparse
import sys
import time

from requires import torch_and_gpus  # bench/, the script's folder

torch = torch_and_gpus()
try:
    import transformers
except ModuleNotFoundError as e:
    if e.name != "transformers":
        raise
    sys.exit("generate.py: needs transformers (pip install transformers)")

import flashgen  # noqa: E402
import flashgen.integrations.transformers as fg_transformers  # noqa: E402

IMPLS = ("flashgen", "sdpa")


def llama3_8b_shaped(layers):
    """Llama-3-8B's layers, `layers` of them, random weights, bf16 on the GPU."""
    config = transformers.LlamaConfig(
        vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=layers,
        num_attention_heads=32, num_key_value_heads=8, head_dim=128,
        max_position_embeddings=8192, rope_theta=500000.0, tie_word_embeddings=False)
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = transformers.LlamaForCausalLM(config)
    model = model.to(torch.bfloat16).eval()
    model.generation_config.eos_token_id = None  # every token asked for
    model.generation_config.pad_token_id = 0
    return model


def seconds(model, ids, new, repeats=3):
    """The median wall time of a greedy generate of `new` tokens."""
    times = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        start = time.perf_counter()
        with torch.no_grad():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new,
                                 min_new_tokens=new, do_sample=False)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
        assert out.shape[1] == ids.shape[1] + new
    return sorted(times)[len(times) // 2]


def decode_calls(model, ids):
    """The calls to attention_with_kvcache in a generate of three tokens (two
    steps after the prompt: two per layer)."""
    real, calls = flashgen.attention_with_kvcache, []

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)
    flashgen.attention_with_kvcache = counted
    try:
        seconds(model, ids, 3, repeats=1)
    finally:
        flashgen.attention_with_kvcache = real
    return len(calls)


def main():
    parser = argparse.ArgumentParser(description="generate tokens/s, flashgen against sdpa")
    parser.add_argument("--quick", action="store_true", help="batch 1 only, prompt 512")
    parser.add_argument("--layers", type=int, default=4)
    args = parser.parse_args()
    fg_transformers.register()
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, transformers "
          f"{transformers.__version__}, flashgen {flashgen.__version__}")
    prompt, new = (512, 128) if args.quick else (2048, 128)
    batches = (1,) if args.quick else (1, 32)
    model = llama3_8b_shaped(args.layers)
    print(f"Llama-3-8B-shaped, {args.layers} layers, bf16, random weights: 32/8 heads, d 128; "
          f"prompt {prompt}, {new} new tokens, greedy (bar: flashgen >= sdpa)")
    for batch in batches:
        ids = torch.randint(1, 128256, (batch, prompt), device="cuda")
        for impl in IMPLS:
            model.set_attn_implementation(impl)
            seconds(model, ids, 4, repeats=1)  # compiles, allocates
        # the implementations in turns, medians of each: the GPU's clocks
        # and temperature drift over a run, and neither goes first always
        times = {impl: ([], []) for impl in IMPLS}
        for turn in range(3):
            for impl in (IMPLS if turn % 2 == 0 else IMPLS[::-1]):
                model.set_attn_implementation(impl)
                times[impl][0].append(seconds(model, ids, new, repeats=1))
                times[impl][1].append(seconds(model, ids, 1, repeats=1))
        rates = {}
        for impl, (wholes, firsts) in times.items():
            whole, first = sorted(wholes)[1], sorted(firsts)[1]
            rates[impl] = (batch * new / whole, batch * (new - 1) / (whole - first))
        model.set_attn_implementation("flashgen")
        steps = decode_calls(model, ids)
        (fg, fg_steps), (sd, sd_steps) = rates["flashgen"], rates["sdpa"]
        print(f"batch {batch:3d}: flashgen {fg:9.1f} tokens/s (steps {fg_steps:9.1f}) | "
              f"sdpa {sd:9.1f} (steps {sd_steps:9.1f}) | flashgen/sdpa {fg / sd:5.2f} "
              f"(steps {fg_steps / sd_steps:5.2f}); attention_with_kvcache calls in two steps: "
              f"{steps} of {2 * args.layers}",
              flush=True)
        del ids
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()

"""Tiny randomly initialised transformers models built in code (nothing is
downloaded), each with the scores' variant it is known for made to bind:
Gemma 2 (logit soft-capping and a sliding window on every other layer),
gpt-oss (attention sinks and a sliding window on every other layer, a
mixture of two experts that every token uses, so that no routing decision
flips between precisions) and Mistral (a sliding window on every layer).
The windows are 8 keys: sequences of a few dozen tokens go past them.
Not among KINDS: Llama (none of the variants) and DeepSeek-V3 (none of the
variants either: its value head dim, 64, is unlike its query and key head
dim, 96, and its tests are its own; a mixture of two experts that every
token uses, as gpt-oss's)."""
import torch

WINDOW = 8
KINDS = ("gemma2", "gpt_oss", "mistral")


def build(transformers, kind, seed=0):
    """The model (fp32, on the CPU) of `kind`; its weights are scaled so that
    the variant binds: Gemma 2's queries and keys so that scores reach well
    past the cap of 3, gpt-oss's sinks set to logits of about 2 and its
    queries scaled so that rows differ in how much the sink takes."""
    torch.manual_seed(seed)
    common = dict(vocab_size=256, hidden_size=256, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, sliding_window=WINDOW)
    if kind == "gemma2":
        config = transformers.Gemma2Config(intermediate_size=512, head_dim=64,
                                           attn_logit_softcapping=3.0,
                                           final_logit_softcapping=30.0,
                                           query_pre_attn_scalar=64,
                                           max_position_embeddings=512, **common)
        model = transformers.Gemma2ForCausalLM(config)
        with torch.no_grad():
            for layer in model.model.layers:
                layer.self_attn.q_proj.weight.mul_(8)
                layer.self_attn.k_proj.weight.mul_(8)
    elif kind == "gpt_oss":
        config = transformers.GptOssConfig(intermediate_size=256, head_dim=64,
                                           num_local_experts=2, num_experts_per_tok=2, **common)
        model = transformers.GptOssForCausalLM(config)
        with torch.no_grad():
            for layer in model.model.layers:
                layer.self_attn.sinks.copy_(2.0 + torch.randn(config.num_attention_heads))
                layer.self_attn.q_proj.weight.mul_(4)
    elif kind == "mistral":
        config = transformers.MistralConfig(intermediate_size=512, max_position_embeddings=512,
                                            **common)
        model = transformers.MistralForCausalLM(config)
    elif kind == "llama":
        common.pop("sliding_window")
        config = transformers.LlamaConfig(intermediate_size=512, max_position_embeddings=512,
                                          **common)
        model = transformers.LlamaForCausalLM(config)
    elif kind == "deepseek_v3":  # value head dim 64, query and key head dim 64 + 32
        config = transformers.DeepseekV3Config(
            vocab_size=256, hidden_size=128, intermediate_size=256, moe_intermediate_size=64,
            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
            n_routed_experts=2, num_experts_per_tok=2, n_shared_experts=1,
            first_k_dense_replace=1, n_group=1, topk_group=1, kv_lora_rank=32, q_lora_rank=None,
            qk_nope_head_dim=64, qk_rope_head_dim=32, v_head_dim=64, max_position_embeddings=512)
        model = transformers.DeepseekV3ForCausalLM(config)
    else:
        raise ValueError(kind)
    return model


def without_variants(model, kind):
    """The model's layers with their variants turned off in place (no cap, no
    window, sinks at -1e4): how much that changes the logits shows that
    the variants bind."""
    with torch.no_grad():
        for layer in model.model.layers:
            attn = layer.self_attn
            if getattr(attn, "sliding_window", None) is not None:
                attn.sliding_window = 1 << 20
            if kind == "gemma2":
                attn.attn_logit_softcapping = None
            if kind == "gpt_oss":
                attn.sinks.fill_(-1e4)
    model.config.sliding_window = 1 << 20
    return model


def load(transformers, path, impl, dtype):
    """A saved tiny model on the GPU with the attention implementation impl
    (checked taken), generating every token asked for."""
    model = transformers.AutoModelForCausalLM.from_pretrained(
        path, attn_implementation=impl, dtype=dtype).cuda()
    assert model.config._attn_implementation == impl
    model.generation_config.eos_token_id = None
    return model

"""Tiny Hugging Face checkpoints (Llama, Mistral, Qwen2, Qwen3; Mixtral, Qwen3-MoE; Phi-3, OLMo-2, OLMo-3)
with non-trivial weights."""

import pytest
import torch

# hidden 64, 4 heads: KV heads 2 (or 1) are replicated at tp=4 (or 2); vocabs are not multiples of tp
FAMILIES = {
    "llama": dict(num_key_value_heads=2, vocab_size=1001, attention_bias=True,
                  mlp_bias=True, rope_theta=5000.0),
    "mistral": dict(num_key_value_heads=1, head_dim=16, vocab_size=999, sliding_window=4096,
                    rope_theta=20000.0),
    "qwen2": dict(num_key_value_heads=2, vocab_size=1003, rope_theta=1e6, tie_word_embeddings=False),
    "qwen3": dict(num_key_value_heads=2, head_dim=32, vocab_size=1001, rope_theta=1e6,
                  tie_word_embeddings=True),
}
# 4 experts, top-2; Mixtral's experts use intermediate_size (96), Qwen3-MoE's layer 1 is a dense mlp_only
# layer
MOE_FAMILIES = {
    "mixtral": dict(num_key_value_heads=2, vocab_size=1001, num_local_experts=4, num_experts_per_tok=2,
                    sliding_window=4096),
    "qwen3_moe": dict(num_key_value_heads=1, head_dim=16, vocab_size=999, num_experts=4,
                      num_experts_per_tok=2,
                      moe_intermediate_size=48, mlp_only_layers=[1], norm_topk_prob=True),
}

# Phi-3: q/k/v and gate/up fused on disk, a window (6) shorter than the test sequences; OLMo-2: biases, 2 KV
# heads
# (tp=4 would replicate them, which its k_norm refuses); OLMo-3: 3 layers, sliding (window 5) / full /
# sliding, each layer type with its own rope_theta, 4 KV heads so tp=4 runs
NO_SPECIAL_TOKENS = dict(pad_token_id=None, bos_token_id=None, eos_token_id=None)
EXTRA_FAMILIES = {
    "phi3": dict(num_key_value_heads=2, vocab_size=1001, sliding_window=6, **NO_SPECIAL_TOKENS),
    "olmo2": dict(num_key_value_heads=2, vocab_size=1001, attention_bias=True, rope_theta=500000.0,
                  **NO_SPECIAL_TOKENS),
    "olmo3": dict(num_key_value_heads=4, vocab_size=999, num_hidden_layers=3, sliding_window=5,
                  layer_types=["sliding_attention", "full_attention", "sliding_attention"],
                  rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                                   "full_attention": {"rope_type": "default", "rope_theta": 500000.0}},
                  **NO_SPECIAL_TOKENS),
}


def make_tiny(family: str, folder, seed: int = 0, max_shard_size: str | None = None, **overrides):
    """Save a 2-layer transformers model of `family` with random weights, norms around 1, and biases != 0;
    `overrides` replace or add config fields (rope_parameters, max_position_embeddings, ...)."""
    import transformers
    config_cls = {"llama": transformers.LlamaConfig, "mistral": transformers.MistralConfig,
                  "qwen2": transformers.Qwen2Config, "qwen3": transformers.Qwen3Config,
                  "mixtral": transformers.MixtralConfig, "qwen3_moe": transformers.Qwen3MoeConfig,
                  "phi3": transformers.Phi3Config, "olmo2": transformers.Olmo2Config,
                  "olmo3": transformers.Olmo3Config}[family]
    config = config_cls(**{"hidden_size": 64, "num_attention_heads": 4, "intermediate_size": 96,
                           "num_hidden_layers": 2, "rms_norm_eps": 1e-6,
                           **{**FAMILIES, **MOE_FAMILIES, **EXTRA_FAMILIES}[family], **overrides})
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager").float().eval()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen)
            p.copy_(1 + 0.1 * noise if "norm" in name else noise * (0.1 if name.endswith("bias") else 0.05))
    kwargs = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.save_pretrained(folder, **kwargs)
    return model


@pytest.fixture(scope="session")
def tiny(tmp_path_factory):
    """family -> (checkpoint folder, transformers model); llama is saved sharded with an index."""
    root = tmp_path_factory.mktemp("tiny")
    out = {}
    for i, family in enumerate(FAMILIES):
        folder = root / family
        out[family] = (folder, make_tiny(family, folder, seed=i,
                                         max_shard_size="200KB" if family == "llama" else None))
    return out


@pytest.fixture(scope="session")
def tiny_moe(tmp_path_factory):
    """family -> (checkpoint folder, transformers model) for the MoE families."""
    root = tmp_path_factory.mktemp("tiny-moe")
    return {family: (root / family, make_tiny(family, root / family, seed=10 + i))
            for i, family in enumerate(MOE_FAMILIES)}


@pytest.fixture(scope="session")
def tiny_extra(tmp_path_factory):
    """family -> (checkpoint folder, transformers model) for Phi-3, OLMo-2 and OLMo-3."""
    root = tmp_path_factory.mktemp("tiny-extra")
    return {family: (root / family, make_tiny(family, root / family, seed=20 + i))
            for i, family in enumerate(EXTRA_FAMILIES)}


@pytest.fixture(scope="session")
def tiny_config(tmp_path_factory):
    """A small Qwen3-shaped config.json (random weights), for runs that need no transformers reference."""
    import json
    path = tmp_path_factory.mktemp("cfg") / "tiny-qwen3.json"
    path.write_text(json.dumps({"model_type": "qwen3", "hidden_size": 64, "num_attention_heads": 4,
                                "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 128,
                                "vocab_size": 1000, "num_hidden_layers": 2, "tie_word_embeddings": True}))
    return path

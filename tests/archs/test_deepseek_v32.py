"""DeepSeek-V3.2 (DeepseekV32ForCausalLM): its sparse attention's indexer is not modelled, so the published
config is refused in one line naming it, and so is any DeepSeek config that carries index_topk (vLLM 0.33's
deepseek_v2.py builds an indexer for every such layer), rather than drawn as V3 without it."""
import pytest

from tpviz import shard_map
from tpviz.errors import ConfigError
from tests.helpers.errors import one_line

# deepseek-ai/DeepSeek-V3.2's config.json as an architecture note prints it whole (token ids dropped); a Rust
# engine's test copy agrees on every size it gives (7168 / 18432 / 2048, 128 heads, MLA ranks 1536 / 512)
V32 = {"architectures": ["DeepseekV32ForCausalLM"], "model_type": "deepseek_v32", "attention_bias": False,
       "first_k_dense_replace": 3, "hidden_act": "silu", "hidden_size": 7168, "index_head_dim": 128,
       "index_n_heads": 64, "index_topk": 2048, "intermediate_size": 18432, "kv_lora_rank": 512,
       "max_position_embeddings": 163840, "moe_intermediate_size": 2048, "moe_layer_freq": 1, "n_group": 8,
       "n_routed_experts": 256, "n_shared_experts": 1, "norm_topk_prob": True, "num_attention_heads": 128,
       "num_experts_per_tok": 8, "num_hidden_layers": 61, "num_key_value_heads": 128,
       "num_nextn_predict_layers": 1, "q_lora_rank": 1536, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
       "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                               "scale_fmt": "ue8m0", "weight_block_size": [128, 128]},
       "rms_norm_eps": 1e-06,
       "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0,
                        "original_max_position_embeddings": 4096, "type": "yarn"},
       "rope_theta": 10000, "routed_scaling_factor": 2.5, "scoring_func": "sigmoid",
       "tie_word_embeddings": False, "topk_group": 4, "topk_method": "noaux_tc", "torch_dtype": "bfloat16",
       "v_head_dim": 128,
       "vocab_size": 129280}


@pytest.mark.parametrize("tp", [1, 8, 16])
def test_deepseek_v32_refused_naming_the_indexer(tp):
    with pytest.raises(ConfigError) as e:
        shard_map(V32, tp)
    assert one_line(e.value)
    assert "deepseek_v32 uses DeepSeek Sparse Attention" in str(e.value)
    assert "self_attn.indexer.wq_b" in str(e.value) and "key cache of its own" in str(e.value)


@pytest.mark.parametrize("model_type, cls", [("deepseek_v3", "DeepseekV3ForCausalLM"),
                                             ("deepseek_v2", "DeepseekV2ForCausalLM")])
def test_index_topk_on_a_deepseek_config_is_refused(model_type, cls):
    """Without index_topk the same numbers map as V3 does; with it, the indexer would be missing."""
    plain = {k: v for k, v in V32.items() if not k.startswith("index_")}
    m = shard_map({**plain, "model_type": model_type, "architectures": [cls]}, 8)
    assert m.model.model_type == model_type
    with pytest.raises(ConfigError) as e:
        shard_map({**V32, "model_type": model_type, "architectures": [cls]}, 8)
    assert one_line(e.value) and str(e.value).startswith("index_topk=2048: ")
    assert "self_attn.indexer" in str(e.value)


def test_kimi_k25_with_index_topk_is_refused():
    """Kimi-K2.5 builds its decoder by deepseek_v2.py too: an index_topk there would add indexers."""
    from tpviz.config.sources import presets
    cfg = presets()["moonshotai/Kimi-K2.5"]
    with pytest.raises(ConfigError) as e:
        shard_map({**cfg, "text_config": {**cfg["text_config"], "index_topk": 2048}}, 8)
    assert one_line(e.value) and "indexer" in str(e.value)

"""One architecture, one set of tensors: the checkpoint names and shapes Run live writes for random weights
(random_weights.checkpoint_shapes, which the live loader reads back) must be exactly those the explorer's plan
maps, for every family Run live runs. A family added to one side only fails here."""
import pytest

import tpviz
from tpviz.live.model.config import live_types
from tpviz.live.load.random_weights import checkpoint_shapes
from tpviz.live.load.source import live_config
from tpviz.config.sources import presets
from tpviz.config.normalize import normalize

SMALL = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16, intermediate_size=96,
             num_hidden_layers=3, vocab_size=1000, moe_intermediate_size=32, num_experts=4,
             num_local_experts=4,
             n_routed_experts=4, num_experts_per_tok=2, shared_expert_intermediate_size=48,
             n_group=2, topk_group=1, first_k_dense_replace=1, q_lora_rank=32, kv_lora_rank=32,
             qk_nope_head_dim=16, qk_rope_head_dim=8,
             v_head_dim=16, sliding_window=8, query_pre_attn_scalar=16)
# a preset of each family, else a small config of its own (OLMo has no preset)
PRESET = {"llama": "meta-llama/Llama-3.1-8B", "mistral": "mistralai/Mistral-7B-Instruct-v0.3",
          "qwen2": "Qwen/Qwen2.5-0.5B", "qwen3": "Qwen/Qwen3-0.6B",
          "phi3": "microsoft/Phi-3-mini-128k-instruct",
          "mixtral": "mistralai/Mixtral-8x7B-v0.1", "qwen3_moe": "Qwen/Qwen3-30B-A3B",
          "qwen2_moe": "Qwen/Qwen1.5-MoE-A2.7B", "deepseek_v3": "deepseek-ai/DeepSeek-V3",
          "gemma2": "google/gemma-2-9b-it", "gemma3": "google/gemma-3-27b-it",
          "gpt_oss": "openai/gpt-oss-20b", "kimi_k25": "moonshotai/Kimi-K2.5",
          "kimi_vl": "moonshotai/Kimi-VL-A3B-Instruct"}


def small_config(family: str) -> dict:
    """The family's preset (or a sibling's, retyped) shrunk to SMALL: text config only, unquantized."""
    name = PRESET.get(family) or {"olmo2": "Qwen/Qwen3-0.6B", "olmo3": "Qwen/Qwen3-0.6B",
                                  "deepseek_v2": "deepseek-ai/DeepSeek-V3",
                                  "gemma3_text": "google/gemma-3-27b-it"}[family]
    cfg = presets()[name]
    if family in ("kimi_k25", "kimi_vl"):  # their decoder is text_config's alone: DeepSeek-V3's, shrunk
        return {**{k: v for k, v in cfg.items() if k not in ("text_config", "quantization_config")},
                "text_config": small_config("deepseek_v3")}
    cfg = {**cfg.get("text_config", {}), **{k: v for k, v in cfg.items() if k != "text_config"},
           "model_type": family}
    if family == "deepseek_v2":
        cfg.update(topk_method="greedy", scoring_func="softmax")
    for key in ("quantization_config", "layer_types", "mlp_only_layers", "architectures", "rope_scaling"):
        cfg.pop(key, None)
    shrink = {k: v for k, v in SMALL.items() if k in cfg}
    shrink.update({k: SMALL[k] for k in ("hidden_size", "num_attention_heads",
                                         "num_key_value_heads", "head_dim",
                                         "intermediate_size", "num_hidden_layers", "vocab_size")})
    return {**cfg, **shrink}


@pytest.mark.parametrize("family", live_types())
def test_random_weights_write_exactly_the_tensors_the_plan_maps(family):
    cfg = small_config(family)
    live = live_config(normalize(cfg, family))
    shapes = checkpoint_shapes(live)
    # the live spec: Run live leaves a vision tower out, so its plan is the text decoder's
    m = tpviz.shard_map(live.spec, 1, tensor_names=set(shapes), dtype="float32",
                        tensor_bytes={n: 4 * _numel(s) for n, s in shapes.items()})
    assert m.checkpoint["verified"], (family, m.checkpoint)
    assert (m.checkpoint["bytes"]["checked"]
            and m.checkpoint["bytes"]["count"] == 0), (family, m.checkpoint["bytes"])


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def test_a_tensor_on_one_side_only_is_caught():
    cfg = small_config("qwen3")
    shapes = checkpoint_shapes(live_config(normalize(cfg, "qwen3")))
    shapes.pop("model.layers.0.self_attn.k_norm.weight")
    m = tpviz.shard_map(cfg, 1, tensor_names=set(shapes))
    assert not m.checkpoint["verified"]


def test_each_rank_checks_its_parameters_against_the_explorers_map():
    """A rank's parameters are the map on screen: equal shapes pass (and are counted); a layer that built
    another shape than the plan draws is named in one line, before any forward pass."""
    import torch
    from tpviz.errors import WeightsError
    from tpviz.live.load.targets import check_against_map
    from tpviz.live.model.causal_lm import LiveForCausalLM
    cfg = small_config("qwen3")
    live = live_config(normalize(cfg, "qwen3"))
    with torch.device("meta"):
        model = LiveForCausalLM(live, 2, 1)
    assert check_against_map(model, 1) == len(dict(model.named_parameters()))
    mlp = model.model.layers[0].mlp
    mlp.gate_up_proj.weight = torch.nn.Parameter(torch.empty(48, 64, device="meta"), requires_grad=False)
    with pytest.raises(WeightsError,
                       match=r"^rank 1: model\.layers\.0\.mlp\.gate_up_proj\.weight holds \[48, 64\], "
                                           r"but the map draws \[96, 64\] for this rank"):
        check_against_map(model, 1)

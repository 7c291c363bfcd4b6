"""Architectures checked against the tensor names of a tiny checkpoint that transformers itself builds (its
model class is what writes the real checkpoints): the map names exactly those, tied ones aside."""
import math

import pytest
import torch
import transformers
from tests.helpers.checkpoint import written_shapes

from tpviz import shard_map
from tpviz.config.sources import presets
from tpviz.deploy.traffic import stage_traffic
from tpviz.errors import ConfigError
from tpviz.plan import build_plan
from tpviz.plan.tensors import tensors
from tpviz.rules import Layout
from tpviz.trace.checkpoint import expand
from tpviz.trace.collectives import collectives

TINY = dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
            intermediate_size=96, vocab_size=512)
CASES = {"CohereForCausalLM": "CohereForAI/c4ai-command-r-v01",
         "Exaone4ForCausalLM": "LGAI-EXAONE/EXAONE-4.0-32B",
         "Cohere2ForCausalLM": "CohereLabs/c4ai-command-r7b-12-2024"}
TINY_KINDS = {"Exaone4ForCausalLM": dict(layer_types=["sliding_attention", "full_attention"])}  # 2 layers


@pytest.mark.parametrize("hf_class", sorted(CASES))
def test_the_map_names_what_transformers_writes(hf_class):
    cfg = {**presets()[CASES[hf_class]], **TINY, **TINY_KINDS.get(hf_class, {})}
    config = transformers.AutoConfig.for_model(**{k: v for k, v in cfg.items() if k != "architectures"})
    with torch.device("meta"):
        model = getattr(transformers, hf_class)(config)
    written = {name for name, _ in model.named_parameters()}  # tied parameters once, as save_pretrained does
    assert set(expand(shard_map(cfg, 2))) == written


def test_command_r_reduces_once_per_layer_and_refuses_qk_norms():
    """vLLM 0.33 models/commandr.py: attention and MLP side by side under one LayerNorm, one all-reduce of
    their sum per layer; Command-R+'s per-head q/k norms are refused, named."""
    cfg = presets()["CohereForAI/c4ai-command-r-v01"]
    m = shard_map(cfg, 4)
    reduces = [c for c in collectives(m) if c.where.startswith(("after o_proj", "after down_proj"))]
    assert [c.count for c in reduces] == [40, 0]  # o_proj and down_proj summed, reduced once
    assert m.model.tie_word_embeddings and not any(p.family == "lm_head" for p in m.params)
    for key in ("use_qk_norm", "attention_bias"):
        with pytest.raises(ConfigError, match=key):
            shard_map({**cfg, key: True}, 4)


def test_exaone4_windows_three_layers_in_four():
    """vLLM 0.33 models/exaone4.py: layer_types' sliding layers cache sliding_window tokens, the rest all."""
    m = shard_map(presets()["LGAI-EXAONE/EXAONE-4.0-32B"], 4)
    kinds = [layer.mixer.window for layer in m.model.layers]
    assert kinds[:8] == [4096, 4096, 4096, 0] * 2 and kinds.count(0) == 16
    assert not any("input_layernorm" in name for name in expand(m))


def test_command_r7b_caches_one_token_past_its_window():
    """vLLM 0.33 models/commandr.py passes sliding_window + 1 for Cohere2's sliding layers (they attend to
    [pos - sliding_window, pos]); every fourth layer is full attention."""
    m = shard_map(presets()["CohereLabs/c4ai-command-r7b-12-2024"], 2)
    windows = [layer.mixer.window for layer in m.model.layers]
    assert windows[:4] == [4097, 4097, 4097, 0] and windows.count(0) == 8
    assert m.model.joint_reduce and "sliding_window + 1" in " ".join(m.model.notes)


# MoE classes: transformers 5 fuses their experts in memory, and save_pretrained writes them back under the
# checkpoint's own names, so the names and shapes are read from what it saves
MOE_CASES = {"MiniMaxM2ForCausalLM": "MiniMaxAI/MiniMax-M2",
             "Ernie4_5_MoeForCausalLM": "baidu/ERNIE-4.5-21B-A3B-PT",
             "Lfm2MoeForCausalLM": "LiquidAI/LFM2-8B-A1B",
             "GraniteMoeHybridForCausalLM": "ibm-granite/granite-4.0-h-tiny"}
TINY_MOE = dict(num_local_experts=4, num_experts=4, moe_num_experts=4, num_experts_per_tok=2)
LAYERS = {"Lfm2MoeForCausalLM": dict(layer_types=["conv", "full_attention"], num_dense_layers=1),
          "GraniteMoeHybridForCausalLM": dict(layer_types=["mamba", "attention"], mamba_n_heads=4,
                                              mamba_d_head=32, mamba_d_state=16, shared_intermediate_size=48)}


def saved(hf_class: str, cfg: dict, folder) -> dict[str, tuple]:
    """The tensor names and shapes a tiny random model of hf_class saves (transformers' own writer)."""
    config = transformers.AutoConfig.for_model(**{k: v for k, v in cfg.items() if k != "architectures"})
    return written_shapes(getattr(transformers, hf_class)(config), folder)


@pytest.mark.parametrize("hf_class, dense", [(c, False) for c in sorted(MOE_CASES)]
                         + [("GraniteMoeHybridForCausalLM", True)])
def test_the_map_names_and_shapes_what_transformers_saves(hf_class, dense, tmp_path):
    cfg = {**presets()[MOE_CASES[hf_class]], **TINY, **TINY_MOE, **LAYERS.get(hf_class, {})}
    if dense:  # Granite-4.0-H-Micro / -1B: the shared MLP alone
        cfg.update(num_local_experts=0, num_experts_per_tok=0)
    cfg.pop("quantization_config", None)  # transformers writes an unquantized model
    written = saved(hf_class, cfg, tmp_path)
    m = shard_map(cfg, 2, tensor_names=set(written), checkpoint_source="tiny")
    assert m.checkpoint["verified"], m.checkpoint
    assert {t.name: tuple(t.shape) for t in tensors(build_plan(m.model))} == written  # shapes as stored


def test_minimax_m2_cuts_its_q_k_norms_with_the_heads():
    """vLLM 0.33 minimax_m2.py: q_norm spans all 48 q heads and is cut over tp like q; k_norm spans the 8 KV
    heads, cut over tp, or over the KV heads when tp is larger (each GPU its replicated head's slice); each
    layer all-reduces the two fp32 variances; the router and its bias are float32; 256 experts cap tp."""
    cfg = presets()["MiniMaxAI/MiniMax-M2"]
    m = shard_map(cfg, 16)
    k_norm = m.tensor("model.layers.*.self_attn.k_norm.weight")
    assert [(p.rank, p.start, p.stop) for p in k_norm.pieces][:4] == [(0, 0, 128), (1, 0, 128), (2, 128, 256),
                                                                      (3, 128, 256)]
    q_norm = m.tensor("model.layers.*.self_attn.q_norm.weight")
    assert [(p.start, p.stop) for p in q_norm.pieces if p.rank == 5] == [(5 * 384, 6 * 384)]
    variances = [c for c in collectives(m) if "variances" in c.where]
    assert [(c.count, c.bytes_per_token) for c in variances] == [(62, 8)]
    router = {p.name: p.element_bytes for p in m.params if "_moe." in p.name and ".experts." not in p.name}
    assert router == {"model.layers.*.block_sparse_moe.gate.weight": 4,
                      "model.layers.*.block_sparse_moe.e_score_correction_bias": 4}
    with pytest.raises(ConfigError, match="use_qk_norm"):
        shard_map({**cfg, "use_qk_norm": False}, 2)
    with pytest.raises(ConfigError, match="shared_intermediate_size"):
        shard_map({**cfg, "shared_intermediate_size": 1536}, 2)


def test_minimax_m2_stores_what_the_hub_counts():
    """228,703,644,928 values: the parameter count of the published FP8 checkpoint (weights, their block
    scales, the float32 router and its bias), as a public test quotes it from the HF API."""
    m = shard_map(presets()["MiniMaxAI/MiniMax-M2"], 1)
    assert sum(math.prod(t.shape) * t.copies for t in m.tensors) == 228_703_644_928


def test_ernie45_moe_keeps_its_first_layer_dense_and_stores_what_the_hub_counts():
    """vLLM 0.33 ernie45_moe.py: layer 0 is a dense MLP (moe_layer_start_index 1), the other 27 hold 64
    experts, two shared experts as one MLP of 2 x 1536 and a float32 router with its bias; the published
    checkpoint holds 21,825,437,888 values, 4,425,408 of them float32 (the HF API's count for
    ERNIE-4.5-21B-A3B-Thinking, the same architecture): 43,659,726,592 bytes."""
    cfg = presets()["baidu/ERNIE-4.5-21B-A3B-PT"]
    m = shard_map(cfg, 1)
    assert [layer.ffn.kind for layer in m.model.layers] == ["dense"] + ["moe"] * 27
    assert m.model.layers[1].ffn.shared == 3072
    assert sum(math.prod(t.shape) * t.copies for t in m.tensors) == 21_825_437_888
    assert m.total_weight_bytes == 43_659_726_592
    spaced = shard_map({**cfg, "moe_layer_interval": 2, "moe_layer_end_index": 20}, 1)
    moe_layers = [i for i, layer in enumerate(spaced.model.layers) if layer.ffn.kind == "moe"]
    assert moe_layers == list(range(1, 20, 2))
    with pytest.raises(ConfigError, match="hidden_act"):
        shard_map({**cfg, "hidden_act": "gelu"}, 1)


def test_lfm2_moe_keeps_two_dense_layers_and_a_float32_expert_bias():
    """vLLM 0.33 lfm2_moe.py: layers 0-1 hold a dense MLP of intermediate_size (no LFM2 adjustment), the rest
    32 experts; six of the 24 layers attend (layer_types), the others are short convolutions with a state per
    sequence; the router is in the model's dtype, expert_bias float32; logits always from embed_tokens."""
    cfg = presets()["LiquidAI/LFM2-8B-A1B"]
    m = shard_map({**cfg, "tie_word_embeddings": False}, 2)
    assert [layer.ffn.kind for layer in m.model.layers[:3]] == ["dense", "dense", "moe"]
    assert m.model.layers[0].ffn.size == 7168
    assert sum(layer.mixer.is_attention for layer in m.model.layers) == 6
    router = {p.name.rsplit(".", 1)[-1]: p.element_bytes for p in m.params if ".feed_forward.gate." in p.name
              or p.name.endswith("expert_bias")}
    assert router == {"weight": 0, "expert_bias": 4}
    assert not any(p.family == "lm_head" for p in m.params)
    assert sum(math.prod(t.shape) * t.copies for t in m.tensors) == 8_339_930_560  # the card's 8.3B
    with pytest.raises(ConfigError, match="layer_types"):
        shard_map({k: v for k, v in cfg.items() if k != "layer_types"}, 2)


def test_granite4_hybrid_reduces_its_shared_mlp_apart_and_keeps_mamba_state():
    """vLLM 0.33 granitemoehybrid.py: 36 Mamba2 layers and 4 attention layers (NoPE: position_embedding_type
    is not rope), every one with 64 stacked experts and a shared MLP beside them; the FusedMoE and the shared
    MLP's output_linear each all-reduce, so a layer reduces three times under tp; only the attention layers
    cache KV; without experts the shared MLP is the layer's MLP."""
    cfg = presets()["ibm-granite/granite-4.0-h-tiny"]
    m = shard_map(cfg, 4)
    kinds = [layer.mixer.kind for layer in m.model.layers]
    assert kinds.count("mamba2") == 36
    assert [i for i, k in enumerate(kinds) if k == "attention"] == [5, 15, 25, 35]
    assert not any(layer.mixer.rope for layer in m.model.layers if layer.mixer.is_attention)
    reduces = {c.where.split(" (")[0]: c.count for c in collectives(m) if c.op == "all-reduce"}
    assert reduces["after the shared MLP's output_linear"] == 40 and reduces["after down_proj"] == 40
    moe = [t for t in stage_traffic(m.model, Layout(tp=4))[0] if t.kind == "moe_all_reduce"]
    assert moe[0].count == 80  # the experts' and the shared MLP's, 40 layers each
    # 6.94B in bf16 (the card's 7B), the 36 mixers' A (48 heads) in float32 as vLLM holds it
    assert m.total_weight_bytes == 13_878_074_496 + 36 * 48 * 2
    dense = shard_map({**cfg, "num_local_experts": 0, "num_experts_per_tok": 0}, 2)
    assert {layer.ffn.kind for layer in dense.model.layers} == {"dense"}
    assert dense.model.layers[0].ffn.size == 1024
    with pytest.raises(ConfigError, match="mamba_proj_bias"):
        shard_map({**cfg, "mamba_proj_bias": True}, 2)

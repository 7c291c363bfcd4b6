"""Gemma-4 as vLLM 0.33 models/gemma4.py builds it: the MoE block beside each layer's MLP (26B-A4B) and the
KV-shared layers that keep no cache of their own (E2B, E4B). Names and shapes are checked against tiny
checkpoints transformers writes; the counts and cache bytes are computed by hand here."""
import math

import pytest
import torch
import transformers
from tests.helpers.checkpoint import written_shapes

from tpviz import shard_map
from tpviz.config.normalize import normalize
from tpviz.config.sources import presets
from tpviz.deploy.sizing import Sizer
from tpviz.errors import ConfigError, TPSizeError
from tpviz.plan import build_plan
from tpviz.plan.tensors import tensors
from tpviz.rules import Layout
from tpviz.trace.caches import kv_sources
from tpviz.trace.checkpoint import checkpoint_sentence
from tpviz.trace.collectives import collectives

MOE = "google/gemma-4-26B-A4B-it"
TINY = dict(num_hidden_layers=6, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
            global_head_dim=32, intermediate_size=96, vocab_size=512, vocab_size_per_layer_input=512,
            layer_types=(["sliding_attention"] * 2 + ["full_attention"]) * 2)


def saved(text: dict, folder) -> dict[str, tuple]:
    """The tensor names and shapes a tiny random Gemma4ForCausalLM of this text config saves."""
    config = transformers.Gemma4TextConfig(**{k: v for k, v in text.items() if k != "model_type"})
    torch.manual_seed(0)
    return written_shapes(transformers.Gemma4ForCausalLM(config), folder)


def assert_maps_what_transformers_saves(text: dict, folder) -> None:
    written = saved(text, folder)
    m = shard_map({**text, "architectures": ["Gemma4ForCausalLM"]}, 2, tensor_names=set(written),
                  checkpoint_source="tiny")
    assert m.checkpoint["verified"], m.checkpoint
    assert {t.name: tuple(t.shape) for t in tensors(build_plan(m.model))} == written


def test_moe_names_and_shapes_are_what_transformers_saves(tmp_path):
    text = {**presets()[MOE]["text_config"], **TINY, "num_global_key_value_heads": 1,
            "moe_intermediate_size": 24, "num_experts": 4, "top_k_experts": 2}
    assert_maps_what_transformers_saves(text, tmp_path)


def test_26b_a4b_stores_what_its_card_counts():
    """30 layers, each: q/k/v/o (k = v on the 5 full layers), 7 norms, layer_scalar, the router (proj, scale,
    per_expert_scale), 128 experts of 704 stacked, and the MLP of 2112 beside them; 25.2B on the card.
    On the GPU the full layers' qkv_proj also holds V's rows (k loaded twice)."""
    hidden, experts = 2816, 128
    per_layer = (7 * hidden + 1 + experts * hidden + hidden + experts
                 + experts * 3 * 704 * hidden + 3 * 2112 * hidden)
    sliding = hidden * (4096 + 2048 + 2048 + 4096) + 2 * 256
    full = hidden * (8192 + 1024 + 8192) + 2 * 512
    total = 262144 * hidden + hidden + 30 * per_layer + 25 * sliding + 5 * full
    assert total == 25_233_141_790
    m = shard_map(presets()[MOE], 1)
    assert sum(math.prod(t.shape) for t in tensors(build_plan(m.model)) if not t.plan.tower) == total
    # the vision tower, whole (tests/plan/test_tower_hf.py counts Gemma-4-31B's, whose sizes it shares), and
    # embed_vision's projection to this model's 2816
    h = 1152
    tower = 27 * (4 * h * h + 3 * h * 4304 + 2 * 72 + 4 * h) + 2 * h + 2 * 10240 * h + h * 768 + h * hidden
    assert m.total_weight_bytes == 2 * (total + 5 * 1024 * hidden + tower)
    assert {layer.ffn.label for layer in m.model.layers} == {"MoE 128×704 + shared 2112"}


def test_26b_a4b_reduces_mlp_and_experts_apart_and_caches_by_layer_kind():
    """Gemma4MLP's down_proj and the FusedMoE each all-reduce (reduce_results); the sliding layers cache 8 KV
    heads of 256 up to 1024 tokens, the full layers 2 of 512 (k = v), replicated at tp 4."""
    m = shard_map(presets()[MOE], 4)
    reduces = {c.where.split(" (")[0]: c.count for c in collectives(m) if c.op == "all-reduce"}
    assert reduces["after the shared MLP's down_proj"] == 30 and reduces["after down_proj"] == 30
    rank = m.ranks[0]
    assert rank.kv_cache_bytes_per_token == 5 * 2 * 1 * 512 * 2
    assert rank.kv_cache_windowed == [{"kind": "sliding_attention", "window": 1024, "layers": 25,
                                       "bytes_per_token": 25 * 2 * 2 * 256 * 2}]
    assert shard_map(presets()[MOE], 16).tp_size == 16
    with pytest.raises(TPSizeError):
        shard_map(presets()[MOE], 32)  # 16 query heads


def test_moe_refusals_name_the_part():
    text = presets()[MOE]["text_config"]
    with pytest.raises(ConfigError, match="moe_intermediate_size"):
        shard_map({**presets()[MOE], "text_config": {**text, "moe_intermediate_size": None}}, 2)
    for key in ("num_experts", "top_k_experts"):
        with pytest.raises(ConfigError, match=key):
            shard_map({**presets()[MOE], "text_config": {**text, key: 0}}, 2)
    fp8 = {**presets()[MOE], "quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]}}
    with pytest.raises(ConfigError, match="experts.gate_up_proj"):
        shard_map(fp8, 2)


def shared_text(**over) -> dict:
    """E2B's attention layout (35 layers, 4 sliding of 256 then 1 full of 512, one KV head, the last 20
    layers KV-shared, double-wide MLPs there), without its per-layer input embeddings unless asked."""
    types = (["sliding_attention"] * 4 + ["full_attention"]) * 7
    return {"model_type": "gemma4_text", "architectures": ["Gemma4ForCausalLM"], "hidden_size": 1536,
            "intermediate_size": 6144, "num_attention_heads": 8, "num_key_value_heads": 1, "head_dim": 256,
            "global_head_dim": 512, "num_hidden_layers": 35, "layer_types": types, "sliding_window": 512,
            "num_kv_shared_layers": 20, "use_double_wide_mlp": True, "attention_k_eq_v": False,
            "vocab_size": 262144, "tie_word_embeddings": True, "hidden_size_per_layer_input": 0,
            "max_position_embeddings": 131072, **over}


def test_kv_shared_names_and_shapes_are_what_transformers_saves(tmp_path):
    """Shared layers hold q_proj, q_norm and o_proj alone (no k_proj, v_proj, k_norm); with
    use_double_wide_mlp their MLP is twice as wide."""
    text = {**presets()[MOE]["text_config"], **TINY, "num_global_key_value_heads": None, "num_experts": None,
            "attention_k_eq_v": False, "enable_moe_block": False, "num_kv_shared_layers": 2,
            "use_double_wide_mlp": True}
    assert_maps_what_transformers_saves(text, tmp_path)


def test_kv_shared_layers_cache_nothing():
    """KV bytes per token count only the 15 layers that own a cache: full layers 4, 9, 14 (one KV head of
    512, K and V, bf16) and 12 sliding layers (one head of 256) up to their 512-token window; at tp 2 the one
    KV head is replicated, so each GPU holds the same. Without sharing, 7 full and 28 sliding layers cache."""
    for tp in (1, 2):
        m = shard_map(shared_text(), tp)
        for rank in m.ranks:
            assert rank.kv_cache_bytes_per_token == 3 * 2 * 512 * 2
            assert rank.kv_cache_windowed == [{"kind": "sliding_attention", "window": 512, "layers": 12,
                                               "bytes_per_token": 12 * 2 * 256 * 2}]
    m = shard_map(shared_text(num_kv_shared_layers=0), 1)
    assert m.ranks[0].kv_cache_bytes_per_token == 7 * 2 * 512 * 2
    assert m.ranks[0].kv_cache_windowed[0]["layers"] == 28


def test_kv_shared_layers_read_their_source_cache_in_the_speed_bound():
    """vLLM 0.33: a shared layer attends over the cache of the last earlier layer of its kind (13 for the
    sliding ones, 14 for the full ones): read each decode step, never written."""
    spec = normalize(shared_text())
    assert [layer.mixer.kv_shared for layer in spec.layers] == [False] * 15 + [True] * 20
    assert {layer.ffn.size for layer in spec.layers[15:]} == {2 * 6144}
    assert kv_sources(spec) == {i: 14 if (i + 1) % 5 == 0 else 13 for i in range(15, 35)}
    cost = Sizer(spec).stage_cost(Layout(tp=1), set(range(35)), True, True)
    assert len(cost.attention) == 15 and len(cost.shared_attention) == 20
    assert sorted({(size, window) for size, window, _ in cost.shared_attention}) == [(2 * 256 * 2, 512),
                                                                                     (2 * 512 * 2, 0)]


def test_kv_sharing_refusals_name_the_part():
    with pytest.raises(ConfigError, match="num_kv_shared_layers"):
        shard_map(shared_text(num_kv_shared_layers=35), 1)


# google/gemma-4-E2B-it's text_config, as two engines' copies of its fields give it (no complete copy of the
# release's config.json was found, so no preset): 256 per-layer input values a layer, a 262144-row table
E2B = shared_text(hidden_size_per_layer_input=256, vocab_size_per_layer_input=262144)


def test_per_layer_inputs_names_and_shapes_are_what_transformers_saves(tmp_path):
    text = {**presets()[MOE]["text_config"], **TINY, "num_global_key_value_heads": None, "num_experts": None,
            "attention_k_eq_v": False, "enable_moe_block": False, "num_kv_shared_layers": 2,
            "use_double_wide_mlp": True, "hidden_size_per_layer_input": 8, "vocab_size_per_layer_input": 300}
    assert_maps_what_transformers_saves(text, tmp_path)


def test_e2b_per_layer_inputs_at_tp2_by_hand():
    """embed_tokens_per_layer [262144, 35 x 256] vocab-parallel (131072 rows a GPU),
    per_layer_model_projection [8960, 1536] column-parallel (4480 rows a GPU), the per-layer gate
    [256, 1536] and projection [1536, 256] and the norms whole."""
    m = shard_map(E2B, 2)
    by_name = {t.name: t for t in m.tensors}
    for name, rows, split in (("model.embed_tokens_per_layer.weight", 262144, True),
                              ("model.per_layer_model_projection.weight", 8960, True),
                              ("model.per_layer_projection_norm.weight", 256, False),
                              ("model.layers.*.per_layer_input_gate.weight", 256, False),
                              ("model.layers.*.per_layer_projection.weight", 1536, False),
                              ("model.layers.*.post_per_layer_input_norm.weight", 1536, False)):
        t = by_name[name]
        assert (t.split_dim == 0) if split else (t.split_dim is None), name
        held = [sum(p.stop - p.start for p in t.rank_pieces(r)) for r in (0, 1)]
        assert held == ([rows // 2] * 2 if split else [rows] * 2), name
    assert by_name["model.embed_tokens_per_layer.weight"].shape == [262144, 8960]


def test_e2b_stores_its_card_count_and_the_table_its_published_size():
    """35 layers (12 sliding and 3 full owning a cache, 16 and 4 KV-shared with double-wide MLPs), each with
    5 norms, layer_scalar and the per-layer gate and projection; the tables and the projection once. Less the
    per-layer table that is the card's 2.3B effective; the table is the 4.38 GiB published for it."""
    h, ple, layers = 1536, 256, 35
    sliding, full = 8 * 256 * h * 2 + 2 * 256 * h + 512, 8 * 512 * h * 2 + 2 * 512 * h + 1024
    shared_sliding, shared_full = 8 * 256 * h * 2 + 256, 8 * 512 * h * 2 + 512
    mlp, wide = 3 * 6144 * h, 3 * 12288 * h
    table = 262144 * layers * ple
    total = (262144 * h + table + layers * ple * h + ple + h + layers * (5 * h + 1 + 2 * ple * h)
             + 12 * (sliding + mlp) + 3 * (full + mlp) + 16 * (shared_sliding + wide)
             + 4 * (shared_full + wide))
    m = shard_map(E2B, 1)
    assert m.total_weight_bytes == 2 * total == 2 * 4_628_569_379
    assert abs((total - table) / 2.3e9 - 1) < 0.01
    assert round(2 * table / 2 ** 30, 2) == 4.38


def test_e2b_per_layer_collectives_and_reads():
    """At tp 2 the first stage all-reduces each token's 35 x 256 looked-up values and all-gathers the
    projection's; a decode step reads a row of the table per token (not all of it, though the embedding is
    tied to lm_head)."""
    m = shard_map(E2B, 2)
    size = 35 * 256 * 2
    ple = {c.op: c for c in collectives(m) if "per_layer" in c.where}
    assert ple["all-reduce"].bytes_per_token == size and ple["all-reduce"].sent_per_rank == size
    assert ple["all-gather"].bytes_per_token == size and ple["all-gather"].sent_per_rank == size / 2
    sizer = Sizer(normalize(E2B))
    heads = {p.name: sizer.head_table(p) for p in sizer.plans if p.family == "embed"}
    assert heads == {"model.embed_tokens.weight": True, "model.embed_tokens_per_layer.weight": False}


def test_kv_shared_k_v_and_k_norm_a_checkpoint_ships_are_dropped_at_load(tmp_path):
    """A real Gemma-4 checkpoint still ships k_proj, v_proj and k_norm for its KV-shared layers, which vLLM
    0.33's weights mapper drops: named so in one line, not as tensors the map lacks."""
    text = {**presets()[MOE]["text_config"], **TINY, "num_global_key_value_heads": None, "num_experts": None,
            "attention_k_eq_v": False, "enable_moe_block": False, "num_kv_shared_layers": 2,
            "hidden_size_per_layer_input": 8, "vocab_size_per_layer_input": 300}
    written = set(saved(text, tmp_path))
    shipped = {f"model.layers.{i}.self_attn.{n}.weight" for i in (4, 5)
               for n in ("k_proj", "v_proj", "k_norm")}
    assert not shipped & written
    m = shard_map({**text, "architectures": ["Gemma4ForCausalLM"]}, 2, tensor_names=written | shipped,
                  checkpoint_source="release")
    assert m.checkpoint["verified"] and m.checkpoint["dropped"] == 6, m.checkpoint
    sentence = checkpoint_sentence(m.checkpoint)
    assert "6 more are dropped by vLLM at load (" in sentence and "KV-shared layers" in sentence
    assert all(f"model.layers.*.self_attn.{n}.weight (2)" in sentence for n in ("k_proj", "v_proj", "k_norm"))
    assert "\n" not in sentence

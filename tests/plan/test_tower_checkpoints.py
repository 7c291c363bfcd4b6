"""Towers and wrapped text decoders against checkpoints made apart from tpviz: tiny checkpoints transformers'
own classes save (their on-disk names and shapes), a published per-module parameter table (Llama-4-Scout's
tower) and a published weight table (GLM-4.5V's text decoder)."""
import json

import pytest
import transformers

from tests.plan.test_tower import TEXT
from tpviz import shard_map
from tpviz.config.sources import load_spec, presets
from tpviz.errors import ConfigError
from tpviz.plan import build_plan
from tpviz.plan.tensors import tensors
from tpviz.trace.shardmap import numel
from tests.helpers.checkpoint import written_shapes
from tests.helpers.errors import one_line

TEXT_ONLY = dict(tie_word_embeddings=False, **TEXT)
SAVED = {  # towers checked against the checkpoint transformers writes (its on-disk names and shapes)
    "Mistral3ForConditionalGeneration": dict(
        model_type="mistral3", tie_word_embeddings=False, spatial_merge_size=2,
        multimodal_projector_bias=True,
        text_config=dict(model_type="mistral", head_dim=16, **TEXT_ONLY),
        vision_config=dict(model_type="pixtral", hidden_size=32, num_attention_heads=4, intermediate_size=48,
                           num_hidden_layers=2, patch_size=4, image_size=32, head_dim=8)),
    "LlavaForConditionalGeneration": dict(  # Pixtral-12B's HF format: llava.py around a Pixtral tower
        model_type="llava", tie_word_embeddings=False, vision_feature_layer=-1,
        text_config=dict(model_type="mistral", head_dim=16, **TEXT_ONLY),
        vision_config=dict(model_type="pixtral", hidden_size=32, num_attention_heads=4, intermediate_size=48,
                           num_hidden_layers=2, patch_size=4, image_size=32, head_dim=8)),
    "Qwen3VLMoeForConditionalGeneration": dict(
        model_type="qwen3_vl_moe", tie_word_embeddings=False,
        text_config=dict(model_type="qwen3_vl_moe_text", head_dim=16, num_experts=4, num_experts_per_tok=2,
                         moe_intermediate_size=24, **TEXT),
        vision_config=dict(depth=3, hidden_size=32, num_heads=4, intermediate_size=48, out_hidden_size=64,
                           num_position_embeddings=16, deepstack_visual_indexes=[0, 1])),
    "Llama4ForConditionalGeneration": dict(
        model_type="llama4", text_config=dict(model_type="llama4_text", head_dim=16, num_local_experts=2,
                                              intermediate_size_mlp=96, **TEXT_ONLY),
        vision_config=dict(hidden_size=32, num_attention_heads=4, intermediate_size=64, num_hidden_layers=2,
                           patch_size=4, image_size=16, projector_input_dim=48, projector_output_dim=48,
                           vision_output_dim=48, pixel_shuffle_ratio=0.5)),
}


def saved(hf_class: str, folder) -> tuple[dict, dict[str, tuple]]:
    """The config.json and every tensor (name, shape) a tiny random model of this class saves."""
    config = transformers.AutoConfig.for_model(**SAVED[hf_class])
    shapes = written_shapes(getattr(transformers, hf_class)(config), folder)
    return json.loads((folder / "config.json").read_text()), shapes


@pytest.mark.parametrize("hf_class", sorted(SAVED))
def test_the_tower_names_and_shapes_what_transformers_saves(hf_class, tmp_path):
    """Every tower and projector tensor transformers saves is in the map with its shape, and the map draws
    no tower tensor the checkpoint lacks."""
    cfg, shapes = saved(hf_class, tmp_path)
    m = shard_map(cfg, 2, tensor_names=set(shapes), checkpoint_source="tiny")
    planned = {t.name: t.shape for t in tensors(build_plan(m.model)) if t.plan.tower}
    prefixes = m.model.tower.prefixes
    tower = {n[n.index(p):]: s for n, s in shapes.items() for p in prefixes if p in n}
    assert tower and tower == planned
    assert m.checkpoint["verified"], m.checkpoint  # the text decoder's names too (Llama-4's feed_forward.*)


def test_llama4_decoder_names_and_shapes_what_transformers_saves(tmp_path):
    """models/llama4.py: the MoE under feed_forward (router, shared_expert) with the routed experts fused per
    layer, experts.gate_up_proj [experts, hidden, 2 x intermediate] and experts.down_proj [experts,
    intermediate, hidden], as Llama-4's checkpoints and transformers store them."""
    cfg, shapes = saved("Llama4ForConditionalGeneration", tmp_path)
    m = shard_map(cfg, 2, tensor_names=set(shapes), checkpoint_source="tiny")
    planned = {t.name: t.shape for t in tensors(build_plan(m.model))}
    text = {n.replace("language_model.model.", "model.").replace("language_model.lm_head", "lm_head"): s
            for n, s in shapes.items() if n.startswith("language_model.")}
    assert text == {n: s for n, s in planned.items() if n in text} and len(text) == len(
        [n for n in planned if not n.startswith(m.model.tower.prefixes)])
    assert text["model.layers.0.feed_forward.experts.gate_up_proj"] == (2, 64, 192)
    fp8 = {"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}
    with pytest.raises(ConfigError) as e:  # their stacked scales are not modelled
        load_spec({**presets()["meta-llama/Llama-4-Scout-17B-16E-Instruct"], "quantization_config": fp8})
    assert one_line(e.value) and "llama4_text's fused experts" in str(e.value)


def test_qwen3_vl_moe_text_decoder_checks_whole():
    """Qwen3-VL-MoE: its fused experts and untied lm_head match the saved checkpoint name for name. The
    released checkpoints store experts.gate_up_proj [experts, hidden, 2 x intermediate] (the 30B-A3B's
    [128, 2048, 1536]; tests/trace/test_real_indexes.py holds its index), which vLLM's FusedMoE loads with
    is_fused_checkpoint_transposed; transformers 5 keeps [experts, 2 x intermediate, hidden] in memory and
    saves it so, the transpose of what the map draws (a layout vLLM 0.33 would transpose wrongly)."""
    import tempfile
    from pathlib import Path
    with tempfile.TemporaryDirectory() as d:
        cfg, shapes = saved("Qwen3VLMoeForConditionalGeneration", Path(d))
    m = shard_map(cfg, 2, tensor_names=set(shapes), checkpoint_source="tiny")
    assert m.checkpoint["verified"], m.checkpoint
    planned = {t.name: t.shape for t in tensors(build_plan(m.model))}
    fused = "model.layers.0.mlp.experts.gate_up_proj"
    assert planned[fused] == (4, 64, 48)
    assert shapes["model.language_model.layers.0.mlp.experts.gate_up_proj"] == (4, 48, 64)
    assert planned["model.layers.0.mlp.experts.down_proj"] == (4, 24, 64)
    assert planned["lm_head.weight"] == shapes["lm_head.weight"]


# Llama-4-Scout's vision parameters as a published per-module table lists them (a model-card copy whose config
# equals the preset's vision_config; docs/presets.md)
SCOUT_VISION = {"vision_model.class_embedding": 1408, "vision_model.positional_embedding_vlm": 812416,
                "vision_model.patch_embedding.linear.weight": 827904, "vision_model.layernorm_pre.bias": 1408,
                "vision_model.model.layers.*.self_attn.q_proj.weight": 1982464,
                "vision_model.model.layers.*.self_attn.o_proj.bias": 1408,
                "vision_model.model.layers.*.mlp.fc1.weight": 7929856,
                "vision_model.model.layers.*.mlp.fc1.bias": 5632,
                "vision_model.vision_adapter.mlp.fc1.weight": 23068672,
                "vision_model.vision_adapter.mlp.fc2.weight": 16777216,
                "multi_modal_projector.linear_1.weight": 20971520}


def test_llama4_scout_tower_sizes_equal_its_published_parameter_table():
    m = shard_map("meta-llama/Llama-4-Scout-17B-16E-Instruct", 1)
    assert {n: numel(m.tensor(n).shape) for n in SCOUT_VISION} == SCOUT_VISION


# GLM-4.5V's text tensors as a published weight table lists them (layers and experts as ranges;
# docs/presets.md)
GLM45V_TEXT = [("lm_head.weight", (), (151552, 4096)), ("model.embed_tokens.weight", (), (151552, 4096)),
               ("model.norm.weight", (), (4096,)),
               *((f"model.layers.{{l}}.{n}", range(46), s) for n, s in (
                   ("input_layernorm.weight", (4096,)), ("post_attention_layernorm.weight", (4096,)),
                   ("self_attn.q_proj.weight", (12288, 4096)), ("self_attn.q_proj.bias", (12288,)),
                   ("self_attn.k_proj.weight", (1024, 4096)), ("self_attn.k_proj.bias", (1024,)),
                   ("self_attn.v_proj.weight", (1024, 4096)), ("self_attn.v_proj.bias", (1024,)),
                   ("self_attn.o_proj.weight", (4096, 12288)))),
               *((f"model.layers.0.mlp.{n}.weight", (), s) for n, s in (
                   ("gate_proj", (10944, 4096)), ("up_proj", (10944, 4096)), ("down_proj", (4096, 10944)))),
               *((f"model.layers.{{l}}.mlp.{n}", range(1, 46), s) for n, s in (
                   ("gate.weight", (128, 4096)), ("gate.e_score_correction_bias", (128,)),
                   ("shared_experts.gate_proj.weight", (1408, 4096)),
                   ("shared_experts.up_proj.weight", (1408, 4096)),
                   ("shared_experts.down_proj.weight", (4096, 1408)))),
               *((f"model.layers.{{l}}.mlp.experts.{e}.{n}.weight", range(1, 46), s)
                 for e in range(128) for n, s in (("gate_proj", (1408, 4096)), ("up_proj", (1408, 4096)),
                                                  ("down_proj", (4096, 1408))))]


def test_glm45v_maps_its_text_decoder_beside_its_tower():
    """glm4_1v.py builds GLM-4.5V's text_config as Glm4MoeForCausalLM: the map's text tensors are GLM-4.5's
    decoder, name for name and shape for shape the 17,925 text tensors of the released checkpoint (its
    106,852,251,264 values: the published 107,710,933,120 less the tower's 858,681,856, which
    tests/plan/test_tower_glm.py checks)."""
    published = {(n.format(l=l) if "{l}" in n else n): s for n, ls, s in GLM45V_TEXT for l in (ls or [None])}
    m = shard_map("zai-org/GLM-4.5V", 4)
    drawn = {t.name: t.shape for t in tensors(build_plan(m.model)) if not t.plan.tower}
    assert len(published) == 17925 and drawn == published
    assert sum(numel(s) for s in drawn.values()) == 106_852_251_264
    assert m.model.tower.kind == "glm4v"


def test_kimi_vl_maps_its_deepseek_decoder_and_its_tower():
    """kimi_vl.py builds text_config as DeepseekV2ForCausalLM (deepseek_v2.py, DeepSeek-V3's file too): the
    decoder maps as DeepSeek-V3's; MoonViT (moonvit.py, MoonViTConfig's defaults where vision_config is
    silent) and the projector beside it (tests/archs/test_kimi_vl.py)."""
    text = dict(model_type="deepseek_v3", hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=4, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16,
                kv_lora_rank=32,
                q_lora_rank=None, intermediate_size=128, moe_intermediate_size=32, n_routed_experts=4,
                n_shared_experts=1, num_experts_per_tok=2, first_k_dense_replace=1, vocab_size=512,
                topk_method="noaux_tc")
    m = shard_map({"architectures": ["KimiVLForConditionalGeneration"], "model_type": "kimi_vl",
                   "text_config": text, "vision_config": {"model_type": "moonvit", "hidden_size": 32}}, 2)
    assert m.model.model_type == "deepseek_v3" and m.model.tower.kind == "moonvit_vl"
    assert m.tensor("model.layers.*.self_attn.kv_b_proj.weight").split_dim == 0
    assert (m.model.tower.hidden, m.model.tower.heads, m.model.tower.depth, m.model.tower.grid) == (
        32, 16, 27, (64, 64))
    assert m.tensor("multi_modal_projector.linear_2.weight").shape == [64, 128]

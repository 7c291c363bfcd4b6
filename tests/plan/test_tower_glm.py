"""GLM-4.1V / GLM-4.5V's vision tower (plan/tower_glm.py) as vLLM 0.33's glm4_1v.py builds it: the names and
shapes transformers' Glm4vForConditionalGeneration saves, GLM-4.5V's tower against its published weight table,
the tp 2 slices by hand, the head limit and --mm-encoder-tp-mode data."""
import json

import pytest
import transformers

from tests.helpers.checkpoint import written_shapes
from tests.helpers.errors import one_line
from tpviz import shard_map
from tpviz.config.sources import load_spec, presets
from tpviz.errors import ConfigError, TPSizeError
from tpviz.plan import build_plan
from tpviz.plan.tensors import tensors
from tpviz.trace.shardmap import numel

TINY = dict(model_type="glm4v", tie_word_embeddings=False,
            text_config=dict(model_type="glm4v_text", hidden_size=64, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2, intermediate_size=96,
                             vocab_size=512, attention_bias=True),
            vision_config=dict(depth=2, hidden_size=32, num_heads=4, intermediate_size=48, out_hidden_size=64,
                               patch_size=4, image_size=16, spatial_merge_size=2, temporal_patch_size=2))


def saved(folder) -> tuple[dict, dict[str, tuple]]:
    config = transformers.AutoConfig.for_model(**TINY)
    shapes = written_shapes(transformers.Glm4vForConditionalGeneration(config), folder)
    return json.loads((folder / "config.json").read_text()), shapes


def test_glm41v_names_and_shapes_what_transformers_saves(tmp_path):
    """Every tensor transformers saves (model.visual.*, and the glm4 decoder under model.language_model.*)
    is in the map with its shape, and the map draws none it lacks."""
    cfg, shapes = saved(tmp_path)
    m = shard_map(cfg, 2, tensor_names=set(shapes), checkpoint_source="tiny")
    assert m.checkpoint["verified"], m.checkpoint
    assert m.model.model_type == "glm4v_text" and m.model.tower.kind == "glm4v"
    planned = {t.name: t.shape for t in tensors(build_plan(m.model)) if t.plan.tower}
    tower = {n[n.index("visual."):]: s for n, s in shapes.items() if "visual." in n}
    assert tower == planned
    assert planned["visual.blocks.0.mlp.gate_proj.weight"] == (64, 32)  # out_hidden_size wide
    assert planned["visual.merger.gate_proj.weight"] == (48, 64)  # intermediate_size wide
    assert planned["visual.downsample.weight"] == (64, 32, 2, 2)


def test_glm45v_tower_equals_its_published_weight_table():
    """GLM-4.5V's released checkpoint: 18,106 tensors and 107,710,933,120 values, of which its text decoder
    holds 17,925 and 106,852,251,264 (tests/plan/test_tower_checkpoints.py); the tower the rest, 181 tensors
    and 858,681,856 values."""
    m = shard_map("zai-org/GLM-4.5V", 4)
    drawn = {t.name: t.shape for t in tensors(build_plan(m.model)) if t.plan.tower}
    assert len(drawn) == 18_106 - 17_925
    assert sum(numel(s) for s in drawn.values()) == 107_710_933_120 - 106_852_251_264 == 858_681_856
    # by hand from its vision_config: 24 blocks of 1536 (12 heads), MLP 4096 (out_hidden_size), merger 10944
    block = 2 * 1536 + 4 * 1536 ** 2 + 3 * 4096 * 1536
    once = (1536 * 3 * 2 * 14 * 14 + 1536 + 1536 + 576 * 1536 + 1536 + 4096 * 1536 * 4 + 4096 + 4096 ** 2
            + 2 * 4096 + 3 * 10944 * 4096)
    assert 24 * block + once == 858_681_856


def test_glm45v_tp2_slices_by_hand():
    """tp 2: each GPU six of the 12 heads of 128 (q, k and v rows 768 each), proj's columns halved, the
    gate/up rows of each block (4096) and of the merger (10944) halved, the merger's proj rows halved
    (column-parallel, gathered); the patch kernel, position table, norms and downsample whole."""
    m = shard_map("zai-org/GLM-4.5V", 2)
    qkv = m.tensor("visual.blocks.*.attn.qkv.weight")
    assert qkv.blocks == 24 and qkv.shape == [4608, 1536]
    assert [(p.start, p.stop) for p in qkv.rank_pieces(1)] == [(768, 1536), (2304, 3072), (3840, 4608)]
    assert [(p.start, p.stop) for p in m.tensor("visual.blocks.*.attn.proj.weight").rank_pieces(1)] == [
        (768, 1536)]
    up = m.tensor("visual.blocks.*.mlp.up_proj.weight")
    assert up.shard_id == 1 and [(p.start, p.stop) for p in up.rank_pieces(1)] == [(2048, 4096)]
    gate = m.tensor("visual.merger.gate_proj.weight")
    assert [(p.start, p.stop) for p in gate.rank_pieces(0)] == [(0, 5472)]
    assert [(p.start, p.stop) for p in m.tensor("visual.merger.down_proj.weight").rank_pieces(1)] == [
        (5472, 10944)]
    assert [(p.start, p.stop) for p in m.tensor("visual.merger.proj.weight").rank_pieces(1)] == [(2048, 4096)]
    for name in ("visual.patch_embed.proj.weight", "visual.embeddings.position_embedding.weight",
                 "visual.downsample.weight", "visual.post_conv_layernorm.weight",
                 "visual.merger.post_projection_norm.bias"):
        assert m.tensor(name).split_dim is None, name
    # bf16 bytes one GPU holds of the tower: the split layers halved, the rest whole
    split = 24 * (4 * 1536 ** 2 + 3 * 4096 * 1536) + 4096 ** 2 + 3 * 10944 * 4096
    assert m.ranks[1].weight_bytes_by_family["vision"] == (858_681_856 - split // 2) * 2


def test_twelve_vision_heads_refuse_tp8_unless_the_encoder_runs_data_parallel():
    """glm4_1v.py divides the 12 vision heads by tp: tp 8 fails in weights mode;
    Glm4vForConditionalGeneration supports data mode, which holds the whole tower on every GPU."""
    with pytest.raises(TPSizeError) as e:
        shard_map("zai-org/GLM-4.5V", 8)
    assert one_line(e.value) and "vision_config.num_heads=12 is not divisible by tp_size=8" in str(e.value)
    assert "--mm-encoder-tp-mode data" in str(e.value)
    m = shard_map(load_spec("zai-org/GLM-4.5V").served(mm_encoder="data"), 8)
    tower = [t for t in m.tensors if t.tower]
    assert tower and all(t.split_dim is None for t in tower)
    assert m.ranks[7].weight_bytes_by_family["vision"] == 858_681_856 * 2


def test_a_biased_or_quantized_glm_tower():
    """Glm4vVisionAttention builds qkv without a bias: a config asking for one is refused; a quantized
    checkpoint hands its quantization to the tower, which tpviz leaves out and names."""
    cfg = presets()["zai-org/GLM-4.5V"]
    with pytest.raises(ConfigError) as e:
        load_spec({**cfg, "vision_config": {**cfg["vision_config"], "attention_bias": True}})
    assert one_line(e.value) and "attention_bias" in str(e.value)
    fp8 = {"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}
    spec = load_spec({**cfg, "quantization_config": fp8})
    assert spec.tower is None and any("the vision tower" in n and "left out" in n for n in spec.notes)

"""Kimi-VL (vLLM 0.33 models/kimi_vl.py and moonvit.py): DeepSeek-V3's decoder (MLA without a q latent, 64
experts) from text_config under language_model., MoonViT under vision_tower. and the projector under
multi_modal_projector., against names and shapes read off the model files' module structure (transformers
5.20 has no Kimi-VL class to save a tiny checkpoint; no published index was found), hand-computed."""
import pytest

from tpviz import shard_map
from tpviz.config.sources import load_spec, presets
from tpviz.errors import ConfigError, TPSizeError
from tpviz.trace.shardmap import numel
from tests.helpers.errors import one_line

KIMI_VL = "moonshotai/Kimi-VL-A3B-Instruct"
B = "vision_tower.encoder.blocks.*."
# moonvit.py's modules: MoonVitEncoderLayer (wqkv, wo with attn_bias, mlp = MLP2's fc0 / fc1, norm0 / norm1),
# MoonVisionPatchEmbed (a Conv2d of 3 channels, Learnable2DInterpPosEmb [64, 64, 1152]), final_layernorm;
# kimi_vl.py's KimiVLMultiModalProjector (pre_norm LayerNorm, linear_1 [4608, 4608], linear_2 [2048, 4608])
TOWER = {f"{B}wqkv.weight": [3456, 1152], f"{B}wqkv.bias": [3456], f"{B}wo.weight": [1152, 1152],
         f"{B}wo.bias": [1152], f"{B}mlp.fc0.weight": [4304, 1152], f"{B}mlp.fc0.bias": [4304],
         f"{B}mlp.fc1.weight": [1152, 4304], f"{B}mlp.fc1.bias": [1152],
         **{f"{B}norm{i}.{w}": [1152] for i in (0, 1) for w in ("weight", "bias")},
         "vision_tower.patch_embed.proj.weight": [1152, 588], "vision_tower.patch_embed.proj.bias": [1152],
         "vision_tower.patch_embed.pos_emb.weight": [4096, 1152],
         **{f"vision_tower.encoder.final_layernorm.{w}": [1152] for w in ("weight", "bias")},
         **{f"multi_modal_projector.pre_norm.{w}": [1152] for w in ("weight", "bias")},
         "multi_modal_projector.linear_1.weight": [4608, 4608], "multi_modal_projector.linear_1.bias": [4608],
         "multi_modal_projector.linear_2.weight": [2048, 4608], "multi_modal_projector.linear_2.bias": [2048]}


@pytest.fixture(scope="module")
def tp1():
    return shard_map(KIMI_VL, 1)


def test_tower_names_and_shapes(tp1):
    assert {t.name: list(t.shape) for t in tp1.tensors if t.tower} == TOWER
    assert tp1.model.tower.kind == "moonvit_vl" and tp1.model.tower.depth == 27


def test_values_by_hand(tp1):
    """Text: embed and head 2 x 163,840 x 2048; 27 MLA layers of 13,767,168 (q_proj 3072 x 2048, kv_a 576 x
    2048, kv_b 4096 x 512, o 2048 x 2048, three norms); one dense MLP 3 x 2048 x 11,264; 26 MoE layers of
    571,080,768 (64 experts and 2 shared of 1408, router and score bias); the final norm: 15,960,110,208, the
    card's 16B. The tower: 27 blocks of 15,239,504, the patch kernel, position table and final norm:
    416,866,032; the projector 30,679,808: the ~0.4B of the vision side."""
    count = {"text": 0, "vision": 0}
    for t in tp1.tensors:  # copies: the stored tensors one drawn name stands for (its '*')
        count[t.tower or "text"] += t.copies * numel(t.shape)
    assert count == {"text": 15_960_110_208, "vision": 416_866_032 + 30_679_808}


def test_tp2_slices():
    """tp 2: wqkv 8 of the 16 heads of 72 per GPU from each of q, k and v; fc0 2152 rows; wo and fc1 split
    along their input; the projector (ReplicatedLinear) and pos_emb whole on both."""
    m = shard_map(KIMI_VL, 2)
    qkv = sorted((p.start, p.stop) for p in m.tensor(f"{B}wqkv.weight").pieces if p.rank == 1)
    assert qkv == [(576, 1152), (1728, 2304), (2880, 3456)]
    assert [(p.rank, p.start, p.stop) for p in m.tensor(f"{B}mlp.fc0.weight").pieces] == [
        (0, 0, 2152), (1, 2152, 4304)]
    assert m.tensor(f"{B}wo.weight").split_dim == 1 and m.tensor(f"{B}mlp.fc1.weight").split_dim == 1
    for name in ("multi_modal_projector.linear_1.weight", "multi_modal_projector.linear_2.weight",
                 "vision_tower.patch_embed.pos_emb.weight"):
        t = m.tensor(name)
        assert t.split_dim is None and sorted(p.rank for p in t.pieces) == [0, 1], name
    assert m.tensor("model.layers.*.self_attn.q_proj.weight").split_dim == 0


def test_tp_above_the_vision_heads_needs_data_mode():
    """moonvit.py asks is_vit_use_data_parallel() without the heads: 16 heads over 32 GPUs fail in vLLM (no
    fallback, unlike kimi_k25_vit.py), unless --mm-encoder-tp-mode data, which kimi_vl.py supports. The
    decoder's own 16 heads stop tp 32 first, so this is checked on a decoder of 64 heads."""
    raw = presets()[KIMI_VL]
    wide = {**raw, "text_config": {**raw["text_config"], "num_attention_heads": 64,
                                   "num_key_value_heads": 64}}
    with pytest.raises(TPSizeError) as e:
        shard_map(wide, 32)
    assert one_line(e.value) and "vision_config.num_attention_heads" in str(e.value)
    assert "--mm-encoder-tp-mode data" in str(e.value) and "by itself" not in str(e.value)
    m = shard_map(load_spec(wide).served(mm_encoder="data"), 32)
    fc0 = m.tensor(f"{B}mlp.fc0.weight")
    assert sorted((p.rank, p.start, p.stop) for p in fc0.pieces) == [(r, 0, 4304) for r in range(32)]


@pytest.mark.parametrize("key", ["q_lora_rank", "topk_method"])
def test_text_keys_left_to_deepseek_v2_defaults_refused(key):
    """kimi_vl.py's config reads text_config as DeepseekV2Config: an absent q_lora_rank is 1536 there (a q
    latent), an absent topk_method greedy (no score bias), not DeepSeek-V3's; tpviz refuses, naming it."""
    raw = presets()[KIMI_VL]
    text = {k: v for k, v in raw["text_config"].items() if k != key}
    with pytest.raises(ConfigError) as e:
        load_spec({**raw, "text_config": text})
    assert one_line(e.value) and f"text_config is missing {key}" in str(e.value)

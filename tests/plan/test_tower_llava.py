"""LLaVA (vLLM 0.33 llava.py, llava_next.py): a Pixtral tower (Pixtral-12B in HF format) mapped as
PixtralHFVisionModel, a CLIP or SigLIP one as clip.py's / siglip.py's vision model, each with llava.py's
two-linear projector; another tower left out and named. The Pixtral names against what transformers saves
are in test_tower_checkpoints.py; the CLIP and SigLIP ones here."""
import json

import pytest
import transformers

from tpviz import shard_map
from tpviz.config.sources import load_spec, presets
from tpviz.errors import ConfigError, TPSizeError
from tpviz.plan import build_plan
from tpviz.plan.tensors import tensors
from tpviz.trace.shardmap import numel
from tests.helpers.checkpoint import written_shapes
from tests.helpers.errors import one_line
from tests.plan.test_tower import TEXT

# Pixtral-12B's dimensions: Mistral-NeMo's decoder (40 layers of 5120, 32 / 8 heads of 128, MLP 14336, 131072
# vocab, untied) and PixtralVisionConfig's defaults (24 blocks of 1024, 16 heads, MLP 4096, patch 16)
PIXTRAL_12B = {
    "architectures": ["LlavaForConditionalGeneration"], "model_type": "llava", "projector_hidden_act": "gelu",
    "vision_feature_layer": -1, "tie_word_embeddings": False,
    "text_config": {"model_type": "mistral", "hidden_size": 5120, "head_dim": 128, "intermediate_size": 14336,
                    "num_attention_heads": 32, "num_hidden_layers": 40, "num_key_value_heads": 8,
                    "vocab_size": 131072, "rms_norm_eps": 1e-05, "rope_theta": 1e9},
    "vision_config": {"model_type": "pixtral", "hidden_size": 1024, "head_dim": 64, "image_size": 1024,
                      "intermediate_size": 4096, "num_attention_heads": 16, "num_hidden_layers": 24,
                      "patch_size": 16, "hidden_act": "silu"}}


def tower_values(m) -> int:
    return sum(p.count * numel(p.shape) for p in m.params if p.tower)


def test_pixtral_12b_tower_and_projector_by_hand():
    """24 blocks of q/k/v/o (1024²), gate/up/down (4096 × 1024) and two norms, the 16 × 16 patch conv and
    ln_pre: 403,489,792 values (the card's 400M encoder); the projector 1024 → 5120 → 5120 with biases,
    both split over tp; no Mistral-3 norm or patch merger."""
    m = shard_map(PIXTRAL_12B, 4)
    block = 4 * 1024 ** 2 + 3 * 4096 * 1024 + 2 * 1024
    projector = 1024 * 5120 + 5120 + 5120 * 5120 + 5120
    assert tower_values(m) == 24 * block + 1024 * 3 * 16 * 16 + 1024 + projector
    assert not any("patch_merger" in t.name or t.name.endswith("projector.norm.weight") for t in m.tensors)
    one = m.tensor("multi_modal_projector.linear_1.weight")
    assert one.shape == [5120, 1024] and [(p.start, p.stop) for p in one.rank_pieces(1)] == [(1280, 2560)]
    assert m.tensor("multi_modal_projector.linear_2.weight").split_dim == 1
    assert m.tensor("multi_modal_projector.linear_2.bias").split_dim is None  # added once, after the reduce
    assert any("pixtral.py and llava.py" in n for n in m.model.notes)
    assert abs(m.total_weight_bytes / 2 - 12.7e9) / 12.7e9 < 0.01  # 12B decoder + 0.4B encoder


def test_llava_config_defaults_and_the_heads_limit():
    """LlavaConfig's defaults, not Mistral3Config's: vision_feature_layer -2 (23 of 24 blocks built) and a
    biased projector; the 16 vision heads limit tp, and llava.py has no data mode to avoid it."""
    cfg = {k: v for k, v in PIXTRAL_12B.items() if k != "vision_feature_layer"}
    spec = load_spec(cfg)
    assert spec.tower.depth == 23 and spec.tower.proj_bias
    assert not load_spec({**PIXTRAL_12B, "multimodal_projector_bias": False}).tower.proj_bias
    with pytest.raises(TPSizeError) as e:
        shard_map(PIXTRAL_12B, 32)
    assert one_line(e.value) and "vision_config.num_attention_heads=16" in str(e.value)
    assert "has no --mm-encoder-tp-mode data" in str(e.value)
    assert not load_spec(PIXTRAL_12B).tower.supports_data


# LLaVA-1.5-7B's and LLaVA-NeXT's tower: CLIP ViT-L/14 at 336 (24 layers of 1024, 16 heads, MLP 4096), the
# second-to-last layer's features; a Vicuna-7B (Llama-2-7B) decoder given in full
LLAVA_15 = {"architectures": ["LlavaForConditionalGeneration"], "model_type": "llava",
            "projector_hidden_act": "gelu", "vision_feature_layer": -2, "tie_word_embeddings": False,
            "text_config": {"model_type": "llama", "hidden_size": 4096, "intermediate_size": 11008,
                            "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 32,
                            "vocab_size": 32064, "rms_norm_eps": 1e-05},
            "vision_config": {"model_type": "clip_vision_model", "hidden_size": 1024, "image_size": 336,
                              "intermediate_size": 4096, "num_attention_heads": 16, "num_hidden_layers": 24,
                              "patch_size": 14, "projection_dim": 768}}


def test_llava_15_clip_tower_by_hand():
    """clip.py as llava.py builds it: 23 of 24 layers (vision_feature_layer -2), each q/k/v (biased, one
    QKVParallelLinear over 16 heads), out_proj, fc1 / fc2 and two LayerNorms; the class token, the 14 x 14
    patch kernel without bias, 577 positions and pre_layrnorm whole; no post_layernorm; the projector
    1024 -> 4096 -> 4096 with biases: 290,909,184 tower values (with the skipped layer and post_layernorm,
    303,507,456: CLIP ViT-L/14-336's vision model) and 20,979,712 projector values."""
    m = shard_map(LLAVA_15, 2)
    layer = 4 * (1024 * 1024 + 1024) + 2 * 4096 * 1024 + 4096 + 1024 + 4 * 1024
    once = 1024 + 1024 * 3 * 14 * 14 + 577 * 1024 + 2 * 1024
    projector = 1024 * 4096 + 4096 + 4096 * 4096 + 4096
    assert sum(p.count * numel(p.shape) for p in m.params if p.tower) == 23 * layer + once + projector
    assert 23 * layer + once == 290_909_184 and 24 * layer + once + 2 * 1024 == 303_507_456
    k = m.tensor("vision_tower.vision_model.encoder.layers.*.self_attn.k_proj.weight")
    assert k.blocks == 23 and [(p.start, p.stop) for p in k.rank_pieces(1)] == [(512, 1024)]
    assert m.tensor("vision_tower.vision_model.encoder.layers.*.mlp.fc2.weight").split_dim == 1
    assert m.tensor("vision_tower.vision_model.embeddings.position_embedding.weight").split_dim is None
    assert not any("post_layernorm" in t.name for t in m.tensors)
    assert any("clip.py and llava.py" in n for n in m.model.notes)
    with pytest.raises(TPSizeError) as e:  # 16 heads, no data mode in llava.py
        shard_map(LLAVA_15, 32)
    assert one_line(e.value) and "vision_config.num_attention_heads=16" in str(e.value)


def saved(hf_class: str, model_type: str, tmp_path, vision: str = "clip_vision_model") -> tuple[dict, dict]:
    """A tiny LLaVA (or LLaVA-NeXT) with a 3-layer CLIP (or SigLIP) tower as transformers saves it, its tower
    renamed to the layout of every released llava-hf checkpoint (vision_tower.vision_model.*: transformers 5
    drops 'vision_model.', which vLLM 0.33's CLIPVisionModel and SiglipVisionModel keep)."""
    cfg = dict(model_type=model_type, tie_word_embeddings=False,
               text_config=dict(model_type="llama", head_dim=16, tie_word_embeddings=False, **TEXT),
               vision_config=dict(model_type=vision, hidden_size=32, num_attention_heads=4,
                                  intermediate_size=48, num_hidden_layers=3, patch_size=4, image_size=16))
    if model_type != "llava":
        cfg["image_grid_pinpoints"] = [[16, 16]]
    model = getattr(transformers, hf_class)(transformers.AutoConfig.for_model(**cfg))
    shapes = written_shapes(model, tmp_path)
    shapes = {n.replace("vision_tower.", "vision_tower.vision_model.", 1): s for n, s in shapes.items()}
    return json.loads((tmp_path / "config.json").read_text()), shapes


@pytest.mark.parametrize("vision", ["clip_vision_model", "siglip_vision_model"])
@pytest.mark.parametrize("hf_class, model_type", [("LlavaForConditionalGeneration", "llava"),
                                                  ("LlavaNextForConditionalGeneration", "llava_next")])
def test_the_tower_names_and_shapes_what_transformers_saves(hf_class, model_type, vision, tmp_path):
    """Every tower, projector (and LLaVA-NeXT image_newline) tensor saved is in the map with its shape, but
    the last layer (vision_feature_layer -2), post_layernorm and SigLIP's pooling head, which vLLM's loader
    skips: the checkpoint check counts them as dropped at load, not as a mismatch."""
    cfg, shapes = saved(hf_class, model_type, tmp_path, vision)
    m = shard_map(cfg, 2, tensor_names=set(shapes), checkpoint_source="tiny")
    planned = {t.name: t.shape for t in tensors(build_plan(m.model)) if t.plan.tower}
    tower = {n: s for n, s in shapes.items() if n.startswith(m.model.tower.prefixes)}
    skipped = {n for n in tower if ".layers.2." in n or "post_layernorm" in n or ".head." in n}
    count = 18 + 11 * (vision == "siglip_vision_model")  # the head: probe, attention, layernorm, mlp
    assert len(skipped) == count and {n: s for n, s in tower.items() if n not in skipped} == planned
    assert ("image_newline" in planned) == (model_type == "llava_next")
    assert m.checkpoint["verified"] and m.checkpoint["dropped"] == count, m.checkpoint


def test_llava_onevision_keeps_every_layer_and_its_projector_whole(tmp_path):
    """llava_onevision.py: SigLIP built to LlavaOnevisionConfig's vision_feature_layer -1 (every layer), its
    projector plain nn.Linears (whole on every GPU), image_newline whole; post_layernorm and the pooling head
    dropped at load (13 tensors)."""
    cfg, shapes = saved("LlavaOnevisionForConditionalGeneration", "llava_onevision", tmp_path,
                        "siglip_vision_model")
    m = shard_map(cfg, 2, tensor_names=set(shapes), checkpoint_source="tiny")
    planned = {t.name: t.shape for t in tensors(build_plan(m.model)) if t.plan.tower}
    tower = {n: s for n, s in shapes.items() if n.startswith(m.model.tower.prefixes)}
    assert m.model.tower.depth == 3 and "image_newline" in planned
    assert {n: s for n, s in tower.items() if "post_layernorm" not in n and ".head." not in n} == planned
    assert m.checkpoint["verified"] and m.checkpoint["dropped"] == 13, m.checkpoint
    projector = [t for t in m.tensors if t.name.startswith("multi_modal_projector.")]
    assert len(projector) == 4 and all(t.split_dim is None for t in projector)
    assert any("siglip.py and llava_onevision.py" in n for n in m.model.notes)


def test_a_siglip_tower_floors_its_patch_grid():
    """SigLIP-SO400M at 384 with patch 14 (siglip.py floors: 27 x 27 = 729 positions, no class token), where
    CLIP's clip.py asserts the division; 27 layers of 1152, 16 heads, MLP 4304; a biased patch kernel."""
    cfg = {**PIXTRAL_12B, "vision_feature_layer": -1,
           "vision_config": {"model_type": "siglip_vision_model", "hidden_size": 1152, "image_size": 384,
                             "intermediate_size": 4304, "num_attention_heads": 16, "num_hidden_layers": 27,
                             "patch_size": 14}}
    m = shard_map(cfg, 2)
    assert m.tensor("vision_tower.vision_model.embeddings.position_embedding.weight").shape == [729, 1152]
    assert m.tensor("vision_tower.vision_model.embeddings.patch_embedding.bias").shape == [1152]
    assert m.model.tower.depth == 27 and any("siglip.py and llava.py" in n for n in m.model.notes)
    cfg["vision_config"] = {**cfg["vision_config"], "model_type": "idefics2_vision"}
    m = shard_map(cfg, 2)  # a tower llava.py does not build: the decoder maps, the tower is named left out
    assert not any(t.tower for t in m.tensors)
    assert any("left out" in n and "vision tower" in n for n in m.model.notes)


def test_a_bad_clip_config_is_one_line():
    for bad, key in (({"image_size": 335}, "image_size"), ({"num_hidden_layers": "24"}, "num_hidden_layers")):
        with pytest.raises(ConfigError) as e:
            load_spec({**LLAVA_15, "vision_config": {**LLAVA_15["vision_config"], **bad}})
        assert one_line(e.value) and key in str(e.value)
    with pytest.raises(ConfigError) as e:
        load_spec({**LLAVA_15, "vision_feature_layer": 24})
    assert one_line(e.value) and "vision_feature_layer=24" in str(e.value)


def test_llava_onevision_7b_preset_by_hand():
    """llava-onevision-qwen2-7b-ov-hf: Qwen2-7B (28 / 4 heads of 128, biased q/k/v, MLP 18944, the vocabulary
    padded to 152128, untied), SigLIP's 26 kept blocks of 1152 (patch conv, 27 x 27 positions, no post-norm:
    require_post_norm=False), the two-linear projector and image_newline; float16."""
    c = presets()["llava-hf/llava-onevision-qwen2-7b-ov-hf"]
    t, v = c["text_config"], c["vision_config"]
    V, h, n, i = t["vocab_size"], t["hidden_size"], t["num_hidden_layers"], t["intermediate_size"]
    kv = t["num_key_value_heads"] * h // t["num_attention_heads"]
    text = 2 * V * h + h + n * (2 * (h * h + h) + 2 * (h * kv + kv) - h + 3 * h * i + 2 * h)
    w, f, p = v["hidden_size"], v["intermediate_size"], v["patch_size"]
    block = 4 * (w * w + w) + 4 * w + (w * f + f) + (f * w + w)
    tower = 3 * p * p * w + w + (v["image_size"] // p) ** 2 * w + v["num_hidden_layers"] * block
    total = text + tower + (w * h + h) + (h * h + h) + h
    m = shard_map("llava-hf/llava-onevision-qwen2-7b-ov-hf", 1)
    assert m.total_weight_bytes == 2 * total and round(total / 1e9, 2) == 8.03
    assert tower_values(m) == tower + (w * h + h) + (h * h + h) + h

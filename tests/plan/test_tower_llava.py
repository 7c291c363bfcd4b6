"""LLaVA (vLLM 0.33 llava.py): a Pixtral tower (Pixtral-12B in HF format) mapped as PixtralHFVisionModel with
llava.py's two-linear projector; a CLIP or SigLIP tower left out and named. Names and shapes against what
transformers saves are in test_tower_checkpoints.py."""
import pytest

from tpviz import shard_map
from tpviz.config.sources import load_spec
from tpviz.errors import TPSizeError
from tpviz.trace.shardmap import numel
from tests.helpers.errors import one_line

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


def test_a_clip_llava_maps_its_decoder_and_names_the_tower_left_out():
    """llava-1.5 (CLIP ViT-L): llava.py's CLIPVisionModel is not modelled: the decoder maps, the note says
    the tower and projector are left out."""
    cfg = {**PIXTRAL_12B, "vision_config": {"model_type": "clip_vision_model", "hidden_size": 1024,
                                            "num_attention_heads": 16, "num_hidden_layers": 24}}
    m = shard_map(cfg, 2)
    assert not any(t.tower for t in m.tensors)
    assert any("left out" in n and "vision tower" in n for n in m.model.notes)

"""The towers vLLM 0.33 builds as transformers' own modules: Gemma-4's vision and audio encoders with their
embedders (gemma4_mm.py) and Gemma-3n's audio encoder with its split embedder (gemma3n_mm.py). Checked against
the checkpoints transformers writes, a hand count of Gemma-4-31B's tower, and by hand at tp 2."""
import json

import pytest
import torch
import transformers

from tests.helpers.checkpoint import written_shapes
from tests.helpers.errors import one_line
from tests.plan.test_tower import TEXT
from tpviz import load_spec, shard_map
from tpviz.config.sources import presets
from tpviz.errors import ConfigError
from tpviz.plan import build_plan
from tpviz.plan.tensors import tensors
from tpviz.render.plots import all_figures

KEY = "google/gemma-4-31B-it"
TOWERS = ("vision_tower.", "embed_vision.", "audio_tower.", "embed_audio.")
GEMMA4 = dict(
    model_type="gemma4", tie_word_embeddings=True,
    text_config=dict(model_type="gemma4_text", head_dim=16, global_head_dim=16, **TEXT),
    vision_config=dict(model_type="gemma4_vision", hidden_size=32, num_attention_heads=4,
                       num_key_value_heads=4, head_dim=8, intermediate_size=48, num_hidden_layers=2,
                       patch_size=4, position_embedding_size=16, standardize=True, use_clipped_linears=True),
    audio_config=dict(model_type="gemma4_audio", hidden_size=32, num_attention_heads=4, num_hidden_layers=2,
                      subsampling_conv_channels=[8, 4], output_proj_dims=48))


def gemma4_saved(folder) -> tuple[dict, dict[str, tuple]]:
    torch.manual_seed(0)
    model = transformers.Gemma4ForConditionalGeneration(transformers.AutoConfig.for_model(**GEMMA4))
    shapes = written_shapes(model, folder)
    return json.loads((folder / "config.json").read_text()), shapes


def tower_shapes(shapes: dict) -> dict:
    return {n[n.index(p):]: s for n, s in shapes.items() for p in TOWERS if f"model.{p}" in n}


def test_gemma4_towers_and_embedders_are_what_transformers_saves(tmp_path):
    """Both towers (clipped linears' scalar bounds, the standardize vectors, the conformer's convolutions) and
    both embedders, name for name and shape for shape; the whole checkpoint verifies."""
    cfg, shapes = gemma4_saved(tmp_path)
    m = shard_map(cfg, 2, tensor_names=set(shapes), checkpoint_source="tiny")
    planned = {t.name: t.shape for t in tensors(build_plan(m.model)) if t.plan.tower}
    saved = tower_shapes(shapes)
    assert saved["vision_tower.encoder.layers.0.self_attn.q_proj.input_min"] == ()
    assert len(saved) > 100 and planned == saved
    assert m.checkpoint["verified"], m.checkpoint
    assert (m.model.tower.kind, m.model.audio.kind) == ("gemma4_vision", "gemma4_audio")


def test_gemma4_31b_tower_is_whole_on_every_gpu_by_hand():
    """27 blocks of 1152 (16 heads of 72, q/k/v/o unbiased, a 4304 gated MLP, q/k norms, four block norms),
    the 2 x 10240 position table, the 768-wide patch projection (3 x 16 x 16), standardize's two vectors and
    embed_vision's 1152 -> 5376 projection: the same bytes on every GPU at any tp."""
    h, i, d = 1152, 4304, 72
    block = 4 * h * h + 3 * h * i + 2 * d + 4 * h
    tower = 27 * block + 2 * h + 2 * 10240 * h + h * 3 * 16 * 16 + h * 5376
    for tp in (1, 2, 8):
        m = shard_map(KEY, tp)
        assert all(r.weight_bytes_by_family["vision"] == tower * 2 for r in m.ranks)
        assert all(t.split_dim is None for t in m.tensors if t.tower)
    m = shard_map(KEY, 4)
    linear = m.tensor("vision_tower.encoder.layers.*.mlp.gate_proj.linear.weight")
    assert linear.layer_class == "ReplicatedLinear" and linear.blocks == 27  # recursive_replace_linear
    assert m.tensor("vision_tower.encoder.layers.*.input_layernorm.weight").layer_class == "Gemma4RMSNorm"
    assert all_figures(m)["vision"].layout.title.text.startswith("Vision tower · whole on every GPU (transf")
    assert any("transformers' own modules, whole on every GPU" in n for n in m.model.notes)
    assert not any("only the text decoder" in n for n in m.model.notes)


def test_a_quantized_gemma4_leaves_its_towers_out_and_says_why():
    cfg = {**presets()[KEY], "quantization_config": {"quant_method": "fp8", "activation_scheme": "dynamic"}}
    spec = load_spec(cfg)
    assert spec.tower is None and spec.audio is None
    assert any("_get_tower_quant_config" in n for n in spec.notes)
    assert any("vision tower (and any projector or audio tower) is left out" in n for n in spec.notes)


GEMMA3N_AUDIO = dict(hidden_size=32, conf_num_attention_heads=4, conf_num_hidden_layers=2,
                     sscp_conv_channel_size=[8, 4], vocab_size=16, input_feat_size=16)


def test_gemma3n_audio_tower_is_transformers_encoder_and_its_embedder_splits(tmp_path):
    """Gemma3nAudioEncoder's tensors as transformers saves them under audio_tower.; embed_audio's table
    vocab-parallel (rows cut), its projection row-parallel over the audio width; the vision tower (timm's
    MobileNet-V5) left out and named."""
    ac = transformers.Gemma3nAudioConfig(**GEMMA3N_AUDIO)
    encoder = {f"audio_tower.{n}": s for n, s in written_shapes(transformers.Gemma3nAudioEncoder(ac),
                                                                tmp_path).items()}
    preset = presets()["google/gemma-3n-E2B-it"]
    cfg = {**preset, "audio_config": {**preset["audio_config"], **GEMMA3N_AUDIO}}
    m = shard_map(cfg, 2)
    hidden = m.model.hidden_size
    planned = {t.name: t.shape for t in tensors(build_plan(m.model)) if t.plan.tower}
    embedder = {"embed_audio.embedding.weight": (16, 32), "embed_audio.hard_embedding_norm.weight": (32,),
                "embed_audio.soft_embedding_norm.weight": (32,),
                "embed_audio.embedding_projection.weight": (hidden, 32)}
    assert planned == {**encoder, **embedder}
    proj = m.tensor("embed_audio.embedding_projection.weight")
    assert proj.split_dim == 1 and [(p.start, p.stop) for p in proj.rank_pieces(1)] == [(16, 32)]
    table = m.tensor("embed_audio.embedding.weight")
    assert table.split_dim == 0 and table.layer_class == "VocabParallelEmbedding"
    left_out = "vision tower (gemma3n_vision, mobilenetv5_300m_enc) is not modelled: it is left out of"
    assert any(left_out in n for n in m.model.notes)
    assert m.model.audio.kind == "gemma3n_audio" and m.model.tower is None
    assert all_figures(m)["audio"].layout.title.text.startswith("Audio tower's embedder · vocab-parallel")


@pytest.mark.parametrize("change, words", [
    ({"vision_config": {"hidden_size": 1152, "num_attention_heads": 0}}, "vision_config: "),
    ({"vision_config": {"hidden_size": "wide"}}, "vision_config: "),
    ({"vision_config": {"num_hidden_layers": -1}}, "vision_config: "),
])
def test_a_bad_gemma4_vision_config_is_one_line(change, words):
    cfg = {**presets()[KEY], **{k: {**presets()[KEY][k], **v} for k, v in change.items()}}
    with pytest.raises(ConfigError) as e:
        shard_map(cfg, 2)
    assert one_line(e.value) and words in str(e.value), str(e.value)


def published_vision(layers: int, hidden: int, heads: int, head: int, inter: int, text: int) -> dict:
    """Gemma-4's vision checkpoint names and shapes as a published checkpoint checker requires them (a
    standardized tower without clipped linears: the 26B's and 31B's)."""
    out = {"vision_tower.patch_embedder.input_proj.weight": (hidden, 3 * 16 * 16),
           "vision_tower.patch_embedder.position_embedding_table": (2, 10240, hidden),
           "vision_tower.std_bias": (hidden,), "vision_tower.std_scale": (hidden,),
           "embed_vision.embedding_projection.weight": (text, hidden)}
    for i in range(layers):
        root = f"vision_tower.encoder.layers.{i}."
        out |= {f"{root}{n}_layernorm.weight": (hidden,)
                for n in ("input", "post_attention", "pre_feedforward", "post_feedforward")}
        out |= {f"{root}{n}.linear.weight": s for n, s in (
            ("self_attn.q_proj", (heads * head, hidden)), ("self_attn.k_proj", (heads * head, hidden)),
            ("self_attn.v_proj", (heads * head, hidden)), ("self_attn.o_proj", (hidden, heads * head)),
            ("mlp.gate_proj", (inter, hidden)), ("mlp.up_proj", (inter, hidden)),
            ("mlp.down_proj", (hidden, inter)))}
        out |= {f"{root}self_attn.{n}_norm.weight": (head,) for n in ("q", "k")}
    return out


# the audio_config of Gemma-4 E2B / E4B as several engines' copies of the released file give it
RELEASED_AUDIO = {"model_type": "gemma4_audio", "attention_chunk_size": 12, "attention_context_left": 13,
                  "attention_context_right": 0, "attention_invalid_logits_value": -1000000000.0,
                  "attention_logit_cap": 50.0, "conv_kernel_size": 5, "gradient_clipping": 10000000000.0,
                  "hidden_size": 1024, "num_attention_heads": 8, "num_hidden_layers": 12,
                  "output_proj_dims": 1536, "residual_weight": 0.5, "rms_norm_eps": 1e-06,
                  "subsampling_conv_channels": [128, 32], "use_clipped_linears": True}


def published_audio() -> set[str]:
    """Gemma-4's audio checkpoint names as the same checker requires them (its output_proj.bias optional)."""
    out = {f"audio_tower.subsample_conv_projection.{n}" for n in (
        "layer0.conv.weight", "layer0.norm.weight", "layer1.conv.weight", "layer1.norm.weight",
        "input_proj_linear.weight")} | {"audio_tower.output_proj.weight", "audio_tower.output_proj.bias",
                                        "embed_audio.embedding_projection.weight"}
    for i in range(12):
        root = f"audio_tower.layers.{i}."
        out |= {f"{root}{n}.weight" for n in (
            "feed_forward1.pre_layer_norm", "feed_forward1.post_layer_norm", "norm_pre_attn",
            "norm_post_attn", "lconv1d.pre_layer_norm", "lconv1d.conv_norm", "feed_forward2.pre_layer_norm",
            "feed_forward2.post_layer_norm", "norm_out", "self_attn.relative_k_proj",
            "lconv1d.depthwise_conv1d")}
        out.add(f"{root}self_attn.per_dim_scale")
        for n in ("feed_forward1.ffw_layer_1", "feed_forward1.ffw_layer_2", "self_attn.q_proj",
                  "self_attn.k_proj", "self_attn.v_proj", "self_attn.post", "lconv1d.linear_start",
                  "lconv1d.linear_end",
                  "feed_forward2.ffw_layer_1", "feed_forward2.ffw_layer_2"):
            out |= {f"{root}{n}.{p}" for p in ("linear.weight", "input_min", "input_max", "output_min",
                                               "output_max")}
    return out


def test_gemma4_tower_names_are_what_a_published_checker_requires():
    """The 31B's vision tower, name for name and shape for shape, and the released audio tower (E2B / E4B),
    name for name, as a checkpoint checker written apart from transformers lists them."""
    planned = {t.name: t.shape for t in tensors(build_plan(load_spec(KEY))) if t.plan.tower}
    assert planned == published_vision(27, 1152, 16, 72, 4304, 5376)
    cfg = {**GEMMA4, "audio_config": RELEASED_AUDIO}
    audio = {t.name for t in tensors(build_plan(load_spec(cfg))) if t.plan.tower == "audio"}
    assert audio == published_audio()

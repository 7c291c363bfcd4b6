"""InternVL's InternViT and mlp1 projector (plan/tower_intern.py) as vLLM 0.33's intern_vit.py and internvl.py
build them: the names a released checkpoint's index lists, the shapes its printed modules give, the bytes by
hand, the tp 2 slices, the attention InternViT-6B's 25 heads leave whole, and the keys it refuses to guess."""
import json

import pytest
import torch
import transformers

from tests.helpers.checkpoint import written_shapes
from tests.helpers.errors import one_line
from tpviz import load_spec, shard_map
from tpviz.config.sources import presets
from tpviz.errors import ConfigError, MissingFieldError, TPSizeError
from tpviz.plan import build_plan
from tpviz.plan.tensors import tensors
from tpviz.trace.shardmap import numel

# OpenGVLab/InternVL2_5-8B's model.safetensors.index.json (a copy in public notes, cuijunjie18/my_notebook
# uv/ICT_note.md; docs/presets.md): every name under vision_model. and mlp1., its 24 layers' alike
# (InternViT-300M, the tower of the InternVL3-1B preset too)
INDEX_LAYER = {f"{part}.{s}" for part in ("attn.proj", "attn.qkv", "mlp.fc1", "mlp.fc2", "norm1", "norm2")
               for s in ("bias", "weight")} | {"ls1", "ls2"}
INDEX_ONCE = {"vision_model.embeddings.class_embedding", "vision_model.embeddings.patch_embedding.bias",
              "vision_model.embeddings.patch_embedding.weight", "vision_model.embeddings.position_embedding",
              *(f"mlp1.{i}.{s}" for i in (0, 1, 3) for s in ("bias", "weight"))}
# the same release's printed modules (InternVL3-1B, shivangjhalani/multicoco InternVL3-1B_data.md): Linear(in,
# out) stores [out, in]
PRINTED = {"attn.qkv.weight": (3072, 1024), "attn.proj.weight": (1024, 1024), "mlp.fc1.weight": (4096, 1024),
           "mlp.fc2.weight": (1024, 4096), "norm1.weight": (1024,), "mlp1.0.weight": (4096,),
           "mlp1.1.weight": (896, 4096), "mlp1.3.weight": (896, 896),
           "vision_model.embeddings.patch_embedding.weight": (1024, 3, 14, 14)}
SIX_B = dict(hidden_size=3200, num_attention_heads=25, intermediate_size=12800, num_hidden_layers=45,
             qkv_bias=False, qk_normalization=True, norm_type="rms_norm")  # InternViT-6B-448px-V2_5


def six_b() -> dict:
    cfg = presets()["OpenGVLab/InternVL3-1B"]
    return {**cfg, "vision_config": {**cfg["vision_config"], **SIX_B}}


def tower_tensors(spec) -> dict:
    return {t.name: t.shape for t in tensors(build_plan(spec)) if t.plan.tower}


def test_internvl_names_equal_a_released_index_and_shapes_its_printed_modules():
    spec = load_spec("OpenGVLab/InternVL3-1B")
    assert spec.model_type == "qwen2" and spec.tower.kind == "internvit" and spec.tower.depth == 24
    drawn = tower_tensors(spec)
    layers = f"{spec.tower.blocks.replace('*.', '')}"
    want = {f"{layers}{i}.{n}" for i in range(24) for n in INDEX_LAYER} | INDEX_ONCE
    assert set(drawn) == want
    for name, shape in PRINTED.items():
        full = name if name.startswith(("mlp1.", "vision_model.")) else f"{layers}0.{name}"
        assert drawn[full] == shape, name
    assert drawn["vision_model.embeddings.position_embedding"] == (1, 1025, 1024)  # (448 / 14)² + 1
    assert drawn["vision_model.embeddings.class_embedding"] == (1, 1, 1024)


# transformers' InternVLForConditionalGeneration (the -hf conversion) names the same parameters otherwise; its
# q_proj / k_proj / v_proj stack, in that order, into the original's fused attn.qkv
HF_NAMES = [("model.vision_tower.embeddings.cls_token", "vision_model.embeddings.class_embedding"),
            ("model.vision_tower.embeddings.position_embeddings",
             "vision_model.embeddings.position_embedding"),
            ("model.vision_tower.embeddings.patch_embeddings.projection",
             "vision_model.embeddings.patch_embedding"),
            ("model.vision_tower.encoder.layer.", "vision_model.encoder.layers."), (".lambda_1", ".ls1"),
            (".lambda_2", ".ls2"), (".attention.projection_layer", ".attn.proj"), (".attention.", ".attn."),
            (".layernorm_before", ".norm1"), (".layernorm_after", ".norm2"),
            ("model.multi_modal_projector.layer_norm", "mlp1.0"),
            ("model.multi_modal_projector.linear_1", "mlp1.1"),
            ("model.multi_modal_projector.linear_2", "mlp1.3")]


@pytest.mark.parametrize("six_b_options", [False, True])
def test_shapes_equal_what_transformers_builds(six_b_options):
    """InternViT-300M's options (LayerNorms, q/k/v biases) and InternViT-6B's (RMSNorms, q/k norms, no q/k/v
    bias) on a tiny tower of 5 heads: every parameter transformers' own InternVL builds, renamed, is the map's
    with its shape."""
    options = dict(use_qk_norm=six_b_options, norm_type="rms_norm" if six_b_options else "layer_norm",
                   attention_bias=not six_b_options)
    text = dict(model_type="qwen2", hidden_size=64, num_hidden_layers=1, num_attention_heads=4,
                num_key_value_heads=2, intermediate_size=96, vocab_size=256)
    config = transformers.InternVLConfig(text_config=text, downsample_ratio=0.5, vision_config=dict(
        hidden_size=40, num_attention_heads=5, intermediate_size=64, num_hidden_layers=2, image_size=[28, 28],
        patch_size=[14, 14], **options))
    with torch.device("meta"):
        built = transformers.InternVLForConditionalGeneration(config)
    want = {}
    for name, p in built.named_parameters():
        if ".language_model." in name:
            continue
        for old, new in HF_NAMES:
            name = name.replace(old, new)
        for part in ("q_proj", "k_proj", "v_proj"):  # stacked into qkv
            if f".attn.{part}." in name:
                name = name.replace(part, "qkv")
                rows = want.get(name, (0,))[0] + p.shape[0]
                p = torch.empty((rows, *p.shape[1:]), device="meta")
        want[name] = tuple(p.shape)
    vision = dict(hidden_size=40, num_attention_heads=5, intermediate_size=64, num_hidden_layers=2,
                  image_size=28, patch_size=14, qkv_bias=not six_b_options, qk_normalization=six_b_options,
                  norm_type=options["norm_type"])
    spec = load_spec({"model_type": "internvl_chat", "architectures": ["InternVLChatModel"],
                      "downsample_ratio": 0.5, "llm_config": text, "vision_config": vision})
    drawn = {t.name: t.shape for t in tensors(build_plan(spec)) if t.plan.tower}
    assert drawn == want


def test_internvl3_1b_bytes_by_hand():
    """InternViT-300M: 24 layers of 12,598,272 values and 1,653,760 in the embeddings; mlp1 4,482,816; the
    Qwen2.5-0.5B decoder, its lm_head untied: 629,697,920 (938,193,024 in all)."""
    layer = (1024 * 3072 + 3072) + (1024 ** 2 + 1024) + (1024 * 4096 + 4096) + (4096 * 1024 + 1024) + 6 * 1024
    embed = 1024 + (1024 * 3 * 14 * 14 + 1024) + 1025 * 1024
    mlp1 = 2 * 4096 + (4096 * 896 + 896) + (896 * 896 + 896)
    assert (layer, embed, mlp1) == (12_598_272, 1_653_760, 4_482_816)
    m = shard_map("OpenGVLab/InternVL3-1B", 1)
    assert sum(p.count * numel(p.shape) for p in m.params if p.tower) == 24 * layer + embed + mlp1
    assert sum(p.count * numel(p.shape) for p in m.params) == 938_193_024


def test_tp2_splits_the_heads_and_mlp_rows_and_keeps_the_rest_whole():
    """16 heads of 64: GPU 1 holds q, k and v rows 512-1024 of each 1024; proj's columns and fc1's rows
    halved; norms, layer scales, embeddings and mlp1 whole."""
    m = shard_map("OpenGVLab/InternVL3-1B", 2)
    qkv = m.tensor("vision_model.encoder.layers.*.attn.qkv.weight")
    assert qkv.blocks == 24 and [(p.start, p.stop) for p in qkv.rank_pieces(1)] == [
        (512, 1024), (1536, 2048), (2560, 3072)]
    assert [(p.start, p.stop) for p in m.tensor("vision_model.encoder.layers.*.attn.proj.weight")
            .rank_pieces(1)] == [(512, 1024)]
    assert [(p.start, p.stop) for p in m.tensor("vision_model.encoder.layers.*.mlp.fc1.weight")
            .rank_pieces(0)] == [(0, 2048)]
    for name in ("vision_model.encoder.layers.*.ls1", "vision_model.encoder.layers.*.norm2.bias",
                 "vision_model.embeddings.position_embedding", "mlp1.1.weight", "mlp1.0.bias"):
        assert m.tensor(name).split_dim is None, name
    split = 24 * (1024 * 3072 + 3072 + 1024 ** 2 + 2 * 1024 * 4096 + 4096)
    assert m.ranks[0].weight_bytes_by_family["vision"] == (308_495_104 - split // 2) * 2


def test_intern_vit_6b_keeps_its_attention_whole_where_25_heads_do_not_divide_tp():
    """internvl.py pads no dummy heads: at tp 2 InternParallelAttention builds qkv and proj with disable_tp,
    so each GPU holds both whole, while fc1 / fc2 stay split; q_norm and k_norm (qk_normalization) are whole
    RMSNorms over all 3200 channels, and norm1 / norm2 RMSNorms without biases. At tp 5 the heads divide."""
    spec = load_spec(six_b())
    m = shard_map(spec, 2)
    qkv = m.tensor("vision_model.encoder.layers.*.attn.qkv.weight")
    assert qkv.shape == [9600, 3200] and all((p.start, p.stop) == (0, 9600) for p in qkv.pieces)
    assert "disable_tp" in qkv.note
    assert [(p.start, p.stop) for p in m.tensor("vision_model.encoder.layers.*.attn.proj.weight")
            .rank_pieces(1)] == [(0, 3200)]
    assert [(p.start, p.stop) for p in m.tensor("vision_model.encoder.layers.*.mlp.fc1.weight")
            .rank_pieces(1)] == [(6400, 12800)]
    assert m.tensor("vision_model.encoder.layers.*.attn.q_norm.weight").shape == [3200]
    assert "vision_model.encoder.layers.*.attn.qkv.bias" not in {t.name for t in m.tensors}
    assert "vision_model.encoder.layers.*.norm1.bias" not in {t.name for t in m.tensors}
    # by hand, one GPU's bf16 bytes of a layer at tp 2: the attention and the small vectors whole, the MLP
    # halved (fc2's bias whole)
    layer = 9600 * 3200 + 3200 ** 2 + 3200 + 2 * 3200 + 2 * 3200 + 2 * 3200 + (12800 * 3200 + 12800) // 2 \
        + 3200 * 12800 // 2 + 3200
    once = 3200 + 3200 * 588 + 3200 + 1025 * 3200 + 2 * 12800 + 12800 * 896 + 896 + 896 * 896 + 896
    assert m.ranks[1].weight_bytes_by_family["vision"] == (45 * layer + once) * 2
    qkv_plan = next(p for p in build_plan(spec) if p.name == "vision_model.encoder.layers.*.attn.qkv.weight")
    assert qkv_plan.build(5, 0)[1].shape[0] == 3 * 5 * 128  # tp 5: five of the heads of 128 per GPU
    assert qkv_plan.build(2, 1)[1].shape[0] == 9600


def test_data_mode_holds_the_whole_tower_and_a_split_mlp_names_its_key():
    """InternVLChatModel supports --mm-encoder-tp-mode data; in weights mode an MLP tp does not divide is
    refused naming vision_config.intermediate_size, with the flag that avoids it."""
    m = shard_map(load_spec(six_b()).served(mm_encoder="data"), 2)
    assert all(t.split_dim is None for t in m.tensors if t.tower)
    whole = sum(p.count * numel(p.shape) for p in m.params if p.tower)
    assert m.ranks[1].weight_bytes_by_family["vision"] == whole * 2
    with pytest.raises(TPSizeError) as e:
        shard_map({**six_b(), "vision_config": {**six_b()["vision_config"], "intermediate_size": 12801}}, 2)
    assert one_line(e.value) and "vision_config.intermediate_size=12801" in str(e.value)
    assert "--mm-encoder-tp-mode data" in str(e.value)


def test_select_layer_builds_the_tower_up_to_it():
    cfg = presets()["OpenGVLab/InternVL3-1B"]
    assert load_spec({**cfg, "select_layer": -4}).tower.depth == 21
    assert load_spec({**cfg, "select_layer": 11}).tower.depth == 12
    for bad in (24, -25, "last"):
        with pytest.raises(ConfigError) as e:
            load_spec({**cfg, "select_layer": bad})
        assert one_line(e.value) and "select_layer" in str(e.value)


def test_keys_only_remote_code_would_default_are_refused_and_a_quantized_tower_left_out():
    cfg = presets()["OpenGVLab/InternVL3-1B"]
    vision = {k: v for k, v in cfg["vision_config"].items() if k != "qk_normalization"}
    with pytest.raises(MissingFieldError) as e:
        load_spec({**cfg, "vision_config": vision})
    assert one_line(e.value) and "qk_normalization" in str(e.value) and e.value.field == "qk_normalization"
    with pytest.raises(ConfigError, match="norm_type='batch_norm'"):
        load_spec({**cfg, "vision_config": {**cfg["vision_config"], "norm_type": "batch_norm"}})
    awq = {"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True, "version": "gemm"}
    spec = load_spec({**cfg, "quantization_config": awq})
    assert spec.tower is None and any("the vision tower" in n and "left out" in n for n in spec.notes)


def test_the_record_names_the_tower_and_never_draws_a_decoder_of_its_own():
    """The internvl_chat record maps the tower; its decoder is llm_config's model_type. A config of that type
    without llm_config, or whose llm_config is of a type no record maps, is refused in one line."""
    flat = {"model_type": "internvl_chat", "architectures": ["InternVLChatModel"], "hidden_size": 64,
            "num_attention_heads": 4, "num_hidden_layers": 2, "intermediate_size": 128, "vocab_size": 128}
    with pytest.raises(MissingFieldError) as e:
        shard_map(flat, 2)
    assert one_line(e.value) and e.value.field == "llm_config"
    cfg = presets()["OpenGVLab/InternVL3-1B"]
    with pytest.raises(ConfigError) as e:
        load_spec({**cfg, "llm_config": {**cfg["llm_config"], "model_type": "no_such_decoder"}})
    assert one_line(e.value) and "no record for" in str(e.value)


@pytest.mark.parametrize("six_b_options", [False, True])
def test_the_transformers_format_maps_as_interns1_builds_it(six_b_options, tmp_path):
    """InternVLForConditionalGeneration checkpoints (OpenGVLab's *-hf) are built by interns1.py: every tensor
    transformers saves is the map's with its shape; q_proj / k_proj / v_proj and projection_layer are plain
    nn.Linear, whole on every GPU, so 5 heads do not limit tp 2, while fc1 / fc2 split; no data mode."""
    text = dict(model_type="qwen2", hidden_size=64, num_hidden_layers=1, num_attention_heads=4,
                num_key_value_heads=2, intermediate_size=96, vocab_size=256)
    config = transformers.InternVLConfig(text_config=text, downsample_ratio=0.5, tie_word_embeddings=False,
                                         vision_config=dict(
        hidden_size=40, num_attention_heads=5, intermediate_size=64, num_hidden_layers=2, image_size=[28, 28],
        patch_size=[14, 14], use_qk_norm=six_b_options, attention_bias=not six_b_options,
        norm_type="rms_norm" if six_b_options else "layer_norm"))
    shapes = written_shapes(transformers.InternVLForConditionalGeneration(config), tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    m = shard_map(cfg, 2, tensor_names=set(shapes), checkpoint_source="tiny")
    assert m.checkpoint["verified"], m.checkpoint
    assert m.model.tower.kind == "interns1"
    planned = {t.name: t.shape for t in tensors(build_plan(m.model)) if t.plan.tower}
    prefixes = m.model.tower.prefixes  # saved as the released -hf checkpoints lay them out
    assert planned == {n[n.index(p):]: s for n, s in shapes.items() for p in prefixes if p in n}
    q = m.tensor("vision_tower.encoder.layer.*.attention.q_proj.weight")
    assert q.split_dim is None and q.layer_class == "ReplicatedLinear"
    assert [(p.start, p.stop) for p in m.tensor("vision_tower.encoder.layer.*.mlp.fc1.weight")
            .rank_pieces(1)] == [(32, 64)]
    spec = load_spec(cfg).served(mm_encoder="data")
    assert not spec.tower.data_parallel and any("falls back to weights" in n for n in spec.notes)

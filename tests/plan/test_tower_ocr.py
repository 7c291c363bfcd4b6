"""DeepSeek-OCR (plan/tower_ocr.py, config/tower_dims.py) as vLLM 0.33's deepseek_ocr.py builds it: the
deepseek_vl_v2 config told apart by architectures, SAM ViT-B and CLIP-L whatever vision_config says, SAM
whole, CLIP's attention and MLP split (by hand at tp 2), the linear projector and the two vectors whole, no
data mode; against the release's published counts (2,710 tensors: 179 SAM, 293 CLIP, 2,231 decoder layers;
3,336,106,240 parameters; 6,672,212,480 bytes), since no index of the release itself was found
(docs/presets.md)."""
from collections import Counter

import pytest

from tpviz import shard_map
from tpviz.config.sources import load_spec, presets
from tpviz.errors import ConfigError, TPSizeError
from tpviz.plan.tensors import tensors
from tpviz.plan.tower import tower_plans
from tpviz.trace.checkpoint import expand
from tpviz.trace.shardmap import numel
from tests.helpers.errors import one_line

OCR = presets()["deepseek-ai/DeepSeek-OCR"]
WINDOWED, GLOBAL = [0, 1, 3, 4, 6, 7, 9, 10], [2, 5, 8, 11]


def _sam(d=768, i=3072, grid=64):
    """SAM ViT-B's values by hand: patch kernel and bias, position table, 12 blocks, their relative-position
    tables (27 rows in a 14 x 14 window, 127 over the whole grid), the neck and net_2 / net_3."""
    block = 4 * d + 3 * d * d + 3 * d + d * d + d + 2 * i * d + i + d
    rel = 2 * 64 * (27 * len(WINDOWED) + 127 * len(GLOBAL))
    neck = 256 * d + 256 * 256 * 9 + 4 * 256 + 512 * 256 * 9 + 1024 * 512 * 9
    return d * 3 * 16 * 16 + d + grid * grid * d + 12 * block + rel + neck


def _clip(d=1024, i=4096):
    """CLIP-L/14 at 224 by hand: class token, patch kernel (no bias), 257 positions, pre_layrnorm, 24
    layers."""
    layer = 3 * d * d + 3 * d + d * d + d + 2 * i * d + i + d + 4 * d
    return d + d * 3 * 14 * 14 + 257 * d + 2 * d + 24 * layer


def test_every_tensor_of_the_release_by_count_and_its_values():
    """The published census, prefix by prefix, and the Hub's parameter count; the decoder is DeepSeek-V2's
    with plain attention (qk head dims 0: DeepseekAttention) under model.*."""
    m = shard_map(OCR, 1)
    names = expand(m)
    parts = Counter(n.split(".")[1] if n.startswith("model.") else n for n in names)
    assert len(names) == 2710
    counts = (parts["sam_model"], parts["vision_model"], parts["layers"], parts["projector"])
    assert counts == (179, 293, 2231, 2)
    assert m.model.model_type == "deepseek_v2" and m.model.kv_lora_rank == 0
    assert m.model.layers[0].mixer.kind == "attention" and m.model.layers[0].mixer.head_dim == 128
    tower = sum(p.count * numel(p.shape) for p in m.params if p.tower)
    assert tower == _sam() + _clip() + 2048 * 1280 + 1280 + 2 * 1280
    assert sum(p.count * numel(p.shape) for p in m.params) == 3_336_106_240
    assert m.total_weight_bytes == 6_672_212_480
    check = shard_map(OCR, 1, tensor_names=set(names), checkpoint_source="names").checkpoint
    assert check["verified"] and check["prefix"] == ""  # the tower's names apart from the decoder's


def test_names_and_shapes_on_disk_by_hand():
    """Each tower tensor's stored shape, as the release's tensor list gives it."""
    shape = {t.name: t.shape for t in tensors(tower_plans(load_spec(OCR), "vllm"))}
    sam, clip = "model.sam_model.", "model.vision_model."
    assert shape[f"{sam}blocks.11.attn.qkv.weight"] == (2304, 768)
    assert shape[f"{sam}blocks.0.mlp.lin1.weight"] == (3072, 768)
    assert shape[f"{sam}blocks.3.mlp.lin2.weight"] == (768, 3072)
    for blocks, rows in ((WINDOWED, 27), (GLOBAL, 127)):
        for b in blocks:
            assert shape[f"{sam}blocks.{b}.attn.rel_pos_h"] == (rows, 64)
            assert shape[f"{sam}blocks.{b}.attn.rel_pos_w"] == (rows, 64)
    assert shape[f"{sam}patch_embed.proj.weight"] == (768, 3, 16, 16)
    assert shape[f"{sam}pos_embed"] == (1, 64, 64, 768)
    assert shape[f"{sam}neck.0.weight"] == (256, 768, 1, 1)
    assert shape[f"{sam}neck.2.weight"] == (256, 256, 3, 3)
    assert shape[f"{sam}net_2.weight"] == (512, 256, 3, 3)
    assert shape[f"{sam}net_3.weight"] == (1024, 512, 3, 3)
    assert shape[f"{clip}transformer.layers.23.self_attn.qkv_proj.weight"] == (3072, 1024)
    assert shape[f"{clip}transformer.layers.0.mlp.fc1.weight"] == (4096, 1024)
    assert shape[f"{clip}embeddings.patch_embedding.weight"] == (1024, 3, 14, 14)
    assert shape[f"{clip}embeddings.position_embedding.weight"] == (257, 1024)
    assert shape["model.projector.layers.weight"] == (1280, 2048)
    assert shape["model.image_newline"] == shape["model.view_seperator"] == (1280,)
    assert f"{clip}post_layernorm.weight" not in shape  # DeepCLIPVisionTransformer has none
    assert f"{clip}transformer.layers.24.mlp.fc1.weight" not in shape


def test_deepseek_ocr_at_tp_2_by_hand():
    """CLIP's fused qkv_proj cut head by head (rank 1: the second 8 heads of q, k and v), out_proj and fc2 by
    columns, fc1 4096 rows in 2048; SAM, the projector and the vectors whole on both GPUs."""
    m = shard_map(OCR, 2)
    clip = "model.vision_model.transformer.layers.*."
    qkv = m.tensor(f"{clip}self_attn.qkv_proj.weight")
    assert [(p.start, p.stop) for p in qkv.rank_pieces(1)] == [(512, 1024), (1536, 2048), (2560, 3072)]
    assert m.tensor(f"{clip}self_attn.out_proj.weight").split_dim == 1
    assert [(p.start, p.stop) for p in m.tensor(f"{clip}mlp.fc1.weight").rank_pieces(1)] == [(2048, 4096)]
    assert m.tensor(f"{clip}mlp.fc2.weight").split_dim == 1
    for name in ("model.sam_model.blocks.*.attn.qkv.weight", "model.sam_model.blocks.*.mlp.lin1.weight",
                 "model.projector.layers.weight", "model.vision_model.embeddings.patch_embedding.weight"):
        assert m.tensor(name).split_dim is None
    d, i = 1024, 4096
    split = 24 * (3 * d * d + 3 * d + d * d + 2 * i * d + i)  # cut in two; the row-parallel biases whole
    tower = _sam() + _clip() + 2048 * 1280 + 1280 + 2 * 1280
    assert m.ranks[1].weight_bytes_by_family["vision"] == 2 * (tower - split // 2)


def test_clip_heads_limit_tp_and_no_data_mode():
    """CLIP's 16 heads, set in deepseek_ocr.py, must divide tp (no fallback); --mm-encoder-tp-mode data falls
    back to weights (DeepseekOCRForCausalLM does not support it)."""
    spec = load_spec(OCR)
    plan = next(p for p in tower_plans(spec, "vllm") if p.name.endswith("qkv_proj.weight"))
    with pytest.raises(TPSizeError) as e:
        plan.build(32, 0)
    assert one_line(e.value) and "deepseek_ocr.py's CLIP-L num_attention_heads=16" in str(e.value)
    assert plan.build(16, 15)[1].shape[0] == 3 * 64
    served = spec.served(mm_encoder="data")
    assert not served.tower.data_parallel and any("falls back to weights" in n for n in served.notes)


def test_projector_types_and_what_vllm_refuses():
    """MlpProjector's downsample_mlp_gelu maps as layers.0 / layers.2; another projector_type, token_pooling
    and DeepSeek-OCR-2 are refused in one line; a quantized checkpoint leaves the tower out, named."""
    mlp = shard_map({**OCR, "projector_config": {"projector_type": "downsample_mlp_gelu", "input_dim": 2048,
                                                 "n_embed": 1280}}, 1)
    assert mlp.tensor("model.projector.layers.0.weight").shape == [1280, 8192]
    assert mlp.tensor("model.projector.layers.2.weight").shape == [1280, 1280]
    for pc, words in (({"projector_type": "identity"}, "projector_type='identity'"),
                      ({"projector_type": "linear", "token_pooling": True}, "token_pooling")):
        with pytest.raises(ConfigError) as e:
            load_spec({**OCR, "projector_config": pc})
        assert one_line(e.value) and words in str(e.value)
    with pytest.raises(ConfigError) as e:
        load_spec({**OCR, "architectures": ["DeepseekOCR2ForCausalLM"]})
    assert one_line(e.value) and "DeepSeek-OCR-2" in str(e.value)
    quant = {**OCR, "quantization_config": {"quant_method": "fp8", "activation_scheme": "dynamic"}}
    spec = load_spec(quant)
    assert spec.tower is None and any("vision tower" in n and "left out" in n for n in spec.notes)

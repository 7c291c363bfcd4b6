"""DeepSeek-VL2 (plan/tower_deepseek.py, archs/vision.py) as vLLM 0.33's deepseek_vl2.py builds it: the
language_config read as DeepseekV2Config, timm's so400m with only its MLPs split (by hand at tp 2), the
projector and the two learned vectors whole, no data mode; against the released deepseek-vl2's index (every
name, and its total_size), whose config leaves out the counts tpviz will not guess."""
import gzip
import json
from pathlib import Path

import pytest

from tpviz import shard_map
from tpviz.config.sources import load_spec
from tpviz.errors import ConfigError, MissingFieldError, TPSizeError
from tpviz.trace.shardmap import numel
from tests.helpers.errors import one_line

CASE = json.loads(gzip.decompress((Path(__file__).resolve().parents[1] / "data" / "indexes" /
                                   "deepseek-ai__deepseek-vl2.json.gz").read_bytes()))
# the counts its checkpoint holds (30 layers; 32 heads, which the stored bytes confirm)
GIVEN = {**CASE["config"], "language_config": {**CASE["config"]["language_config"], "num_hidden_layers": 30,
                                               "num_attention_heads": 32}}


def test_the_release_leaves_out_counts_that_change_with_transformers():
    """DeepseekV2Config's default layer count is 32 in transformers 5.x, the checkpoint holds 30: refused,
    naming the key."""
    with pytest.raises(MissingFieldError) as e:
        load_spec(CASE["config"])
    assert one_line(e.value) and "language_config is missing num_hidden_layers" in str(e.value)


def test_every_tensor_of_the_release_and_its_bytes():
    """6,973 tensors under language.*, vision.*, projector.* and the two vectors, name for name; the bytes
    are the index's total_size but for the router's score bias, which vLLM holds in float32 (29 MoE layers
    of 72, stored in bfloat16)."""
    m = shard_map(GIVEN, 1, tensor_names=set(CASE["tensors"]), checkpoint_source=CASE["repo"])
    assert m.checkpoint["verified"] and m.checkpoint["matched"] == 6973
    assert m.checkpoint["prefix"] == "language."
    assert m.model.model_type == "deepseek_v2" and m.model.kv_lora_rank == 512 and m.model.q_lora_rank == 0
    assert m.total_weight_bytes - CASE["total_size"] == 29 * 72 * 2


def test_deepseek_vl2_at_tp_2_by_hand():
    """attn.qkv [3 × 1152, 1152] and attn.proj whole (plain nn.Linear); every Mlp's fc1 4304 rows in 2152 and
    fc2 by columns, attn_pool's too; the projector (4 × 1152 -> 2560 -> 2560) and the vectors whole."""
    m = shard_map(GIVEN, 2)
    qkv = m.tensor("vision.blocks.*.attn.qkv.weight")
    assert qkv.blocks == 27 and qkv.shape == [3456, 1152] and qkv.split_dim is None
    assert m.tensor("vision.blocks.*.attn.proj.weight").split_dim is None
    for mlp in ("vision.blocks.*.mlp.", "vision.attn_pool.mlp."):
        assert [(p.start, p.stop) for p in m.tensor(f"{mlp}fc1.weight").rank_pieces(1)] == [(2152, 4304)]
        assert m.tensor(f"{mlp}fc2.weight").split_dim == 1
    assert m.tensor("projector.layers.0.weight").shape == [2560, 4608]
    assert m.tensor("projector.layers.2.weight").shape == [2560, 2560]
    assert m.tensor("image_newline").shape == [2560] and m.tensor("vision.pos_embed").shape == [729, 1152]
    d, i, n = 1152, 4304, 2560
    mlp = 2 * i * d + i + d
    block = 3 * d * d + 3 * d + d * d + d + mlp + 4 * d
    pool = d + d * d + d + 2 * d * d + 2 * d + d * d + d + 2 * d + mlp
    once = d * 3 * 14 * 14 + d + 729 * d + 2 * d + pool + 4 * d * n + n + n * n + n + 2 * n
    tower = sum(p.count * numel(p.shape) for p in m.params if p.tower)
    assert tower == 27 * block + once
    assert m.ranks[1].weight_bytes_by_family["vision"] == 2 * (tower - 28 * (i * d + i // 2))


def test_no_head_limit_but_the_mlp_width_and_no_data_mode():
    """Only the MLPs are cut: tp 16 maps (4304 = 16 × 269), tp 32 does not, and --mm-encoder-tp-mode data
    falls back to weights (deepseek_vl2.py does not support it)."""
    assert shard_map(GIVEN, 16).tensor("vision.blocks.*.mlp.fc1.weight").rank_pieces(15)[0].stop == 4304
    with pytest.raises(TPSizeError) as e:
        shard_map(GIVEN, 32)
    assert one_line(e.value) and "4304 is not divisible by tp_size=32" in str(e.value)
    assert "no --mm-encoder-tp-mode data" in str(e.value)
    spec = load_spec(GIVEN).served(mm_encoder="data")
    assert not spec.tower.data_parallel and any("falls back to weights" in n for n in spec.notes)


def test_what_vllm_builds_otherwise_is_refused_or_left_out():
    """DeepSeek-OCR shares the model_type (told apart by architectures): its DeepEncoder is mapped instead
    (tests/plan/test_tower_ocr.py), DeepSeek-OCR-2 refused by name; a tile_tag deepseek_vl2.py raises for
    too; a projector other than downsample_mlp_gelu leaves the tower out, named in the notes, and the
    decoder maps."""
    assert load_spec({**GIVEN, "architectures": ["DeepseekOCRForCausalLM"]}).tower.kind == "deepseek_ocr"
    with pytest.raises(ConfigError) as e:
        load_spec({**GIVEN, "architectures": ["DeepseekOCR2ForCausalLM"]})
    assert one_line(e.value) and "DeepSeek-OCR-2 (deepseek_ocr2.py" in str(e.value)
    with pytest.raises(ConfigError) as e:
        load_spec({**GIVEN, "tile_tag": "1D"})
    assert one_line(e.value) and "tile_tag='1D'" in str(e.value) and "deepseek_vl2.py" in str(e.value)
    with pytest.raises(ConfigError) as e:  # DeepSeek-OCR's own file raises alike
        load_spec({**GIVEN, "tile_tag": "1D", "architectures": ["DeepseekOCRForCausalLM"]})
    assert one_line(e.value) and "deepseek_ocr.py builds 2D alone" in str(e.value)
    spec = load_spec({**GIVEN, "projector_config": {"projector_type": "linear", "n_embed": 2560}})
    assert spec.tower is None and any("vision tower" in n and "left out" in n for n in spec.notes)

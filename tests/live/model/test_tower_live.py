"""Qwen2.5-VL's vision tower split as the map draws it (plan/tower.py), run on 2 gloo ranks with tpviz's TP
layers, against transformers' own tower on one process: the same image embeddings."""
import json
import socket

import pytest
import torch
import torch.multiprocessing as mp
import transformers
from safetensors.torch import load_file, save_file

from tests.helpers.dist_tower import worker
from tpviz.config.sources import load_spec
from tpviz.errors import TpvizError
from tpviz.live.model.tower import VisionTower

VISION = dict(depth=4, hidden_size=64, num_heads=4, intermediate_size=96, out_hidden_size=48, patch_size=14,
              spatial_merge_size=2, window_size=112, fullatt_block_indexes=[1, 3], hidden_act="silu")
CONFIG = dict(model_type="qwen2_5_vl", architectures=["Qwen2_5_VLForConditionalGeneration"],
              text_config=dict(model_type="qwen2_5_vl_text", num_hidden_layers=1, hidden_size=48,
                               num_attention_heads=4, num_key_value_heads=2, intermediate_size=64,
                               vocab_size=256), vision_config=VISION)
GRID = [[1, 16, 24]]  # one image of 16 x 24 patches: several 4 x 4 windows, one of them cut at the border


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def reference(folder) -> torch.Tensor:
    """transformers' tower on one process; its weight-free inputs (window order, rotary angles, spans)
    captured for the ranks."""
    from transformers.vision_utils import get_vision_window_index
    torch.manual_seed(0)
    config = transformers.AutoConfig.for_model(**CONFIG).vision_config
    config._attn_implementation = "eager"
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VisionTransformerPretrainedModel
    model = Qwen2_5_VisionTransformerPretrainedModel(config)
    for p in model.parameters():  # no layer left at its init (norms at 1, biases at 0) hides a wrong split
        p.data.normal_(0, 0.2)
    grid = torch.tensor(GRID)
    pixels = torch.randn(int(grid.prod()), 3 * 2 * 14 * 14)
    seen = []
    hooks = [b.register_forward_pre_hook(lambda m, a, kw: seen.append(kw), with_kwargs=True)
             for b in model.blocks]
    with torch.no_grad():
        want = model(pixels, grid_thw=grid).pooler_output
    for h in hooks:
        h.remove()
    window_index, _ = get_vision_window_index(grid, spatial_merge_size=2, window_size=112, patch_size=14,
                                              kwargs={})
    cos, sin = seen[0]["position_embeddings"]
    inputs = {"pixels": pixels, "window_index": window_index, "cos": cos.contiguous(),
              "sin": sin.contiguous(),
              **{f"spans{i}": kw["cu_seqlens"].clone() for i, kw in enumerate(seen)}}
    save_file(inputs, folder / "inputs.safetensors")
    save_file({f"model.visual.{k}": v.contiguous() for k, v in model.state_dict().items()},
              folder / "model.safetensors")
    (folder / "config.json").write_text(json.dumps(CONFIG))
    return want


def test_the_tower_split_over_two_ranks_matches_transformers(tmp_path):
    want = reference(tmp_path)
    spans = load_file(tmp_path / "inputs.safetensors")
    assert len({len(spans[f"spans{i}"]) for i in range(4)}) == 2  # windowed and full blocks both run
    mp.start_processes(worker, args=(2, free_port(), str(tmp_path)), nprocs=2, join=True,
                       start_method="spawn")
    got = load_file(tmp_path / "rank0.safetensors")
    assert got["qkv_rows"].item() == 3 * 64 // 2  # each rank holds half the vision heads of q, k and v
    n = sum(1 for _ in VisionTower(load_spec(CONFIG), 1, 0).by_plan_name())
    assert got["loaded"].item() == n
    torch.testing.assert_close(got["out"], want, rtol=1e-4, atol=1e-4)


def test_one_rank_matches_too_and_a_wrong_split_does_not(tmp_path):
    """tp 1 equals transformers; a rank that loads the other rank's heads is caught, not averaged away."""
    want = reference(tmp_path)
    inputs = load_file(tmp_path / "inputs.safetensors")
    spans = [inputs[f"spans{i}"].tolist() for i in range(4)]
    tower = VisionTower(load_spec(CONFIG), 1, 0)
    weights = load_file(tmp_path / "model.safetensors")
    tower.load(weights)
    with torch.no_grad():
        got = tower(inputs["pixels"], inputs["window_index"], inputs["cos"], inputs["sin"], spans)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    swapped = dict(weights)  # q and k rows swapped in block 0: the loader puts them where the plan says
    qkv = swapped["model.visual.blocks.0.attn.qkv.weight"]
    swapped["model.visual.blocks.0.attn.qkv.weight"] = torch.cat([qkv[64:128], qkv[:64], qkv[128:]])
    tower.load(swapped)
    with torch.no_grad():
        bad = tower(inputs["pixels"], inputs["window_index"], inputs["cos"], inputs["sin"], spans)
    assert not torch.allclose(bad, want, atol=1e-3)


def test_a_tower_it_does_not_run_is_one_line():
    spec = load_spec("nvidia/Cosmos-Reason2-8B")
    with pytest.raises(TpvizError, match="runs Qwen2.5-VL's"):
        VisionTower(spec, 1, 0)

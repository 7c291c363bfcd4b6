"""Worker for test_tower_live: each rank runs its share of a Qwen2.5-VL vision tower in a real gloo group."""
import os

import torch
import torch.distributed as dist
from safetensors.torch import load_file, save_file


def worker(rank: int, tp: int, port: int, folder: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=tp)
    try:
        import json
        from tpviz.config.sources import load_spec
        from tpviz.live.model.tower import VisionTower
        spec = load_spec(json.loads(open(os.path.join(folder, "config.json")).read()))
        inputs = load_file(os.path.join(folder, "inputs.safetensors"))
        tower = VisionTower(spec, tp, rank)
        loaded = tower.load(load_file(os.path.join(folder, "model.safetensors")))
        spans = [inputs[f"spans{i}"].tolist() for i in range(spec.tower.depth)]
        with torch.no_grad():
            out = tower(inputs["pixels"], inputs["window_index"], inputs["cos"], inputs["sin"], spans)
        if rank == 0:
            save_file({"out": out.contiguous(), "loaded": torch.tensor(loaded),
                       "qkv_rows": torch.tensor(tower.blocks[0].qkv.weight.shape[0])},
                      os.path.join(folder, "rank0.safetensors"))
    finally:
        dist.destroy_process_group()

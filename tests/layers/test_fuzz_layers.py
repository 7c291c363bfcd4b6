"""Mutated hybrid, heterogeneous and classic presets map or fail with one clean line, never a traceback."""
import copy
import random

import pytest

from tpviz import shard_map
from tpviz.errors import TpvizError
from tpviz.config.sources import presets

KEYS = ["Qwen/Qwen3-Next-80B-A3B-Thinking", "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16",
        "nvidia/Llama-3_3-Nemotron-Super-49B-v1", "meta-llama/Llama-4-Scout-17B-16E-Instruct",
        "google/gemma-4-31B-it",
        "Qwen/Qwen3.5-9B", "LiquidAI/LFM2.5-VL-1.6B", "openai-community/gpt2", "bigscience/bloom-560m",
        "tiiuae/falcon-7b", "EleutherAI/pythia-1.4b", "bigcode/starcoderbase-1b", "openai/gpt-oss-20b"]
VALUES = [None, 0, -1, 1, 2, 3, 7, 1.5, "x", [], [1], {}, True, [0, 1], "M*-E", 10**9, [[1]], {"a": 1}]


def mutate(cfg: dict, rng: random.Random) -> dict:
    """One to three fields replaced by odd values, or per-layer lists shortened, lengthened or poked."""
    cfg = copy.deepcopy(cfg)
    target = cfg["text_config"] if "text_config" in cfg and rng.random() < 0.8 else cfg
    for _ in range(rng.randint(1, 3)):
        key = rng.choice(list(target))
        value = target[key]
        if isinstance(value, list) and value and rng.random() < 0.5:
            target[key] = value[:-1] if rng.random() < 0.5 else value + value[:1]
        elif isinstance(value, list) and value and rng.random() < 0.4:
            value[rng.randrange(len(value))] = rng.choice(VALUES)
        else:
            target[key] = rng.choice(VALUES)
    return cfg


@pytest.mark.parametrize("seed", range(4))
def test_mutated_layer_configs_fail_cleanly(seed):
    rng = random.Random(seed)
    for _ in range(60):
        cfg = mutate(presets()[rng.choice(KEYS)], rng)
        try:
            shard_map(cfg, rng.choice([1, 2, 4, 8]))
        except TpvizError as e:
            assert "\n" not in str(e) and str(e)

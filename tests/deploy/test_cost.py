"""Bounded cost: any config that passes validation maps within 2 s and 300 MB at any tp <= 64.

Sizes are drawn up to the plausibility limits (spec.LIMITS, MAX_DIM) on real architectures, the corner
where an index-tagging tracer would be slowest. Margins are generous (2x) so a busy CI core does not flake.
"""
import json
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.helpers.cost import measure
from tpviz import shard_map
from tpviz.config.sources import presets
from tpviz.config.fields import MAX_DIM
from tpviz.config.spec import LIMITS

BASES = ["Qwen/Qwen3-8B", "Qwen/Qwen3-30B-A3B", "deepseek-ai/DeepSeek-V3", "openai/gpt-oss-120b",
         "meta-llama/Llama-3.1-405B", "mistralai/Mixtral-8x7B-v0.1"]
TIME_S, MEMORY_MB = 2.0, 300.0


def near(limit: int):
    return st.sampled_from([limit, limit - 1, limit // 2, limit // 64 * 63])


@st.composite
def extreme_configs(draw):
    cfg = json.loads(json.dumps(presets()[draw(st.sampled_from([b for b in BASES if b in presets()]))]))
    target = cfg.get("text_config", cfg)
    for key in draw(st.sets(st.sampled_from(["vocab_size", "hidden_size", "intermediate_size",
                                             "moe_intermediate_size", "num_experts", "num_local_experts",
                                             "n_routed_experts", "num_hidden_layers"]),
                            min_size=1, max_size=4)):
        limit = LIMITS.get({"num_local_experts": "num_experts",
                            "n_routed_experts": "num_experts"}.get(key, key),
                           MAX_DIM)
        target[key] = draw(near(limit))
    return cfg


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cfg=extreme_configs(), tp=st.sampled_from([1, 2, 4, 8, 16, 32, 64]))
def test_any_valid_config_maps_within_the_cost_bound(cfg, tp):
    took, grew, out = measure(lambda: shard_map(cfg, tp))
    assert took <= 2 * TIME_S, f"{took:.2f} s at tp={tp}"
    if grew is not None:
        assert grew <= 2 * MEMORY_MB, f"{grew:.0f} MB more peak memory at tp={tp}"
    assert not isinstance(out, ValueError) or "\n" not in str(out)


def test_the_measure_sees_memory_and_time():
    """The bound can fail: a 400 MB allocation shows up as peak growth (where the kernel resets the peak)."""
    took, grew, out = measure(lambda: len(bytearray(400 << 20)))
    assert out == 400 << 20 and took >= 0
    if Path("/proc/self/clear_refs").exists() and grew is not None:
        assert grew >= 350

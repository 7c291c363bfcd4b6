"""Zamba2 against the tiny checkpoint transformers itself writes, against hand computation, and against the
rows vLLM 0.33's own Zamba2ForCausalLM loads on each rank (run rank by rank on CPU: the expectations below
are what its loaders placed)."""
from pathlib import Path

import pytest
import transformers

from tests.helpers.checkpoint import written_shapes
from tpviz import shard_map
from tpviz.config.sources import load_spec
from tpviz.deploy.sizing import Sizer
from tpviz.errors import ConfigError, TpvizError
from tpviz.plan import build_plan
from tpviz.plan.tensors import tensors
from tpviz.rules import Layout
from tpviz.trace.collectives import collectives
from tpviz.trace.validity import split_error

ZAMBA2_27B, ST = "Zyphra/Zamba2-2.7B", "model.layers.*.shared_transformer."
# 6 layers, hybrid at 1, 3 and 5; two shared blocks (stored in layers 1 and 3; layer 5 runs block 0 again);
# attention 128 wide (2 x hidden) in 4 heads of 32; 8 Mamba2 heads of 16 in 2 groups
TINY = dict(hidden_size=64, num_hidden_layers=6, layers_block_type=["mamba", "hybrid"] * 3, num_mem_blocks=2,
            use_shared_attention_adapter=True, adapter_rank=8, num_attention_heads=4, n_mamba_heads=8,
            mamba_ngroups=2, mamba_d_state=16, mamba_d_conv=4, mamba_expand=2, intermediate_size=128,
            vocab_size=256)
CFG = {**TINY, "model_type": "zamba2", "architectures": ["Zamba2ForCausalLM"]}


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> dict[str, tuple]:
    model = transformers.Zamba2ForCausalLM(transformers.Zamba2Config(**TINY))
    return written_shapes(model, Path(tmp_path_factory.mktemp("zamba2")))


def pieces(m, name: str, rank: int) -> list[tuple[int, int, int]]:
    t = next(t for t in m.tensors if t.name == name)
    return [(p.start, p.stop, p.param_start) for p in t.pieces if p.rank == rank]


def test_names_and_shapes_are_what_transformers_saves(written):
    """Every tensor, shared blocks under layers 1 and 3 only, each hybrid layer's adapters in its block's
    lists; no lm_head (tied)."""
    plans = build_plan(load_spec(CFG))
    assert {t.name: tuple(t.shape) for t in tensors(plans)} == written
    assert "model.layers.1.shared_transformer.feed_forward.gate_up_proj_adapter_list.2.1.weight" in written
    m = shard_map(CFG, 2, tensor_names=set(written), checkpoint_source="tiny")
    assert m.checkpoint["verified"], m.checkpoint


def test_tp2_rows_are_what_vllms_loaders_place():
    """Rank 1 at tp 2, as vLLM 0.33's classes loaded it: q/k/v by heads into one qkv_proj, the fused gate_up
    and adapter B cut per half, adapter A by its rank rows (then gathered), o_proj by columns; `linear`
    and the 128-wide norm whole."""
    m = shard_map(CFG, 2)
    assert pieces(m, ST + "self_attn.q_proj.weight", 1) == [(64, 128, 0)]
    assert pieces(m, ST + "self_attn.v_proj.weight", 1) == [(64, 128, 128)]
    assert pieces(m, ST + "feed_forward.gate_up_proj.weight", 1) == [(64, 128, 0), (192, 256, 64)]
    lists = ST + "feed_forward.gate_up_proj_adapter_list.*."
    assert pieces(m, lists + "1.weight", 1) == [(64, 128, 0), (192, 256, 64)]
    assert pieces(m, lists + "0.weight", 1) == [(4, 8, 0)]
    assert pieces(m, ST + "self_attn.linear_q_adapter_list.*.1.weight", 1) == [(64, 128, 0)]
    assert pieces(m, ST + "self_attn.o_proj.weight", 1) == [(64, 128, 0)]
    assert pieces(m, "model.layers.*.mamba_decoder.mamba.in_proj.weight", 1) == [
        (64, 128, 0), (192, 256, 64), (272, 288, 128), (304, 320, 144), (324, 328, 160)]  # z x B C dt
    for name in ("model.layers.*.linear.weight", ST + "input_layernorm.weight"):
        assert next(t for t in m.tensors if t.name == name).split_dim is None
    param = next(p for p in m.params if p.name == ST + "self_attn.qkv_proj.weight")
    assert param.layers == [1, 3] and param.runs == [1, 3, 5] and param.local_shapes[1] == [192, 128]


def test_tp_limits_name_the_config_key():
    """vLLM 0.33's MambaMixer2 asserts that tp divides mamba_ngroups unless it is 1; the adapters' rank
    rows and the heads are cut too."""
    spec = load_spec(CFG)
    assert "mamba_ngroups" in str(split_error(spec, 4)[0])
    assert split_error(load_spec({**CFG, "mamba_ngroups": 1}), 4)[0] is None
    assert "adapter_rank=8" in str(split_error(load_spec({**CFG, "mamba_ngroups": 1, "n_mamba_heads": 16,
                                                           "num_attention_heads": 16}), 16)[0])


def test_zamba2_2_7b_by_hand():
    """Zamba2-2.7B: 54 Mamba2 layers (80 heads of 64, one group of 64 states), 9 of them hybrid; two shared
    blocks of attention over 5120 (32 heads of 160, no fewer KV heads) and a gelu MLP of 10240; a gate_up
    adapter of rank 128 per hybrid layer; a tied 32000 vocabulary: 2,662,214,560 values, with A_log held in
    float32 as vLLM keeps it."""
    h, inner, heads = 2560, 5120, 80
    mamba = (2 * inner + 2 * 64 + heads) * h + (inner + 2 * 64) * 5 + 3 * heads + inner + h * inner + h
    block = 2 * h + h + 3 * (2 * h) ** 2 + h * 2 * h + 3 * h * 10240
    hybrid = h * h + 128 * h + 2 * 10240 * 128
    values = 54 * mamba + 2 * block + 9 * hybrid + 32000 * h + h
    assert values == 2_662_214_560  # the published count
    m = shard_map(ZAMBA2_27B, 1)
    assert m.total_weight_bytes == 2 * values + 2 * 54 * heads
    assert m.ranks[0].kv_cache_bytes_per_token == 9 * 2 * 32 * 160 * 2  # a cache per hybrid layer
    spec = load_spec(ZAMBA2_27B)
    assert [tp for tp in range(1, 65) if split_error(spec, tp)[0] is None] == [1, 2, 4, 8, 16]
    assert "n_mamba_heads=80" in str(split_error(spec, 32)[0])


def test_shared_blocks_are_read_by_every_hybrid_layer():
    """The speed bound reads a shared block's weights at each of the 9 hybrid layers that run it, not twice;
    and counts 63 mixer all-reduces (54 Mamba2, 9 attention), 9 MLP ones and 9 adapter gathers."""
    spec = Sizer(load_spec(ZAMBA2_27B))
    once = sum(max(spec.rank_bytes(p, 1)) for p in spec.plans if p.runs)  # one block's copy
    cost = spec.stage_cost(Layout(1), set(range(54)), True, True)
    rest = sum(max(spec.rank_bytes(p, 1)) * len(p.layers) for p in spec.plans if p.layers and not p.runs)
    wide = sum(max(spec.rank_bytes(p, 1)) for p in spec.plans if p.layers is None)  # tied head, final norm
    assert cost.weights == rest + 9 * once + wide  # each hybrid layer reads one block's copy
    ops = {(c.op, c.where.split(" (")[0]): c.count for c in collectives(shard_map(ZAMBA2_27B, 2))}
    assert ops[("all-reduce", "after o_proj / out_proj")] == 63
    assert ops[("all-reduce", "after down_proj")] == 9
    assert ops[("all-gather", "after each LoRA adapter's A")] == 9


@pytest.mark.parametrize("change, match", [
    ({"num_key_value_heads": 2}, "one KV head per query head"),
    ({"hidden_act": "silu"}, "gelu only"),
    ({"add_bias_linear": True}, "linear-layer biases"),
    ({"use_shared_mlp_adapter": False}, "always builds the gate_up adapters"),
    ({"num_mem_blocks": 4}, "only 3 hybrid layers"),
    ({"num_mem_blocks": 0}, "num_mem_blocks"),
    ({"layers_block_type": ["mamba"] * 6}, "no hybrid layer"),
    ({"quantization_config": {"quant_method": "fp8"}}, "quantized Zamba2"),
    ({"layers_block_type": ["mamba", "hybrid"]}, "each of the 6 layers"),
    ({"hybrid_layer_ids": [1, 3, 4]}, "does not list layers_block_type's hybrid layers"),
])
def test_what_vllm_cannot_build_is_refused_in_one_line(change, match):
    with pytest.raises(ConfigError, match=match):
        load_spec({**CFG, **change})


def test_pipeline_parallel_is_refused():
    """Zamba2ForCausalLM does not support pipeline parallelism in vLLM 0.33 (no SupportsPP)."""
    with pytest.raises(TpvizError, match="pipeline"):
        shard_map(CFG, 1, layout=Layout(1, pp=2))

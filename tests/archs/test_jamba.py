"""Jamba as vLLM 0.33 models/jamba.py builds it: Mamba1 mixers (layers/mamba/mamba_mixer.py) and attention
layers, each with a dense MLP or routed experts. Names and shapes against a tiny checkpoint transformers
writes; every rank's slices, the counts, the state and KV bytes and the collectives computed by hand here."""
import math

import pytest
import torch
import transformers
from tests.helpers.checkpoint import written_shapes

from tpviz import shard_map
from tpviz.config.normalize import normalize
from tpviz.config.sources import presets
from tpviz.deploy.traffic import comm_per_token
from tpviz.errors import ConfigError, TPSizeError
from tpviz.layers.ssm import MambaMixer
from tpviz.plan import build_plan
from tpviz.plan.tensors import tensors
from tpviz.rules import Layout
from tpviz.trace.collectives import collectives
from tpviz.trace.validity import split_problem

MINI = "ai21labs/AI21-Jamba-Mini-1.5"
# attention on layers 1 and 3, experts on layers 0 and 2: every kind of layer, inner 128, dt_rank 6, state 8
TINY = dict(vocab_size=96, hidden_size=64, intermediate_size=48, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2, num_experts=4, num_experts_per_tok=2, attn_layer_period=2,
            attn_layer_offset=1, expert_layer_period=2, expert_layer_offset=0, mamba_d_state=8,
            mamba_d_conv=3, mamba_expand=2, mamba_dt_rank=6)


def tiny_config() -> dict:
    return {**transformers.JambaConfig(**TINY).to_dict(), "architectures": ["JambaForCausalLM"]}


def test_names_and_shapes_are_what_transformers_saves(tmp_path):
    torch.manual_seed(0)
    written = written_shapes(transformers.JambaForCausalLM(transformers.JambaConfig(**TINY)), tmp_path)
    m = shard_map(tiny_config(), 2, tensor_names=set(written), checkpoint_source="tiny")
    assert m.checkpoint["verified"], m.checkpoint
    assert {t.name: tuple(t.shape) for t in tensors(build_plan(m.model))} == written
    assert [layer.label for layer in m.model.layers] == [
        "Mamba1 + MoE 4×48", "full attention, no RoPE + dense MLP 48",
        "Mamba1 + MoE 4×48", "full attention, no RoPE + dense MLP 48"]


@pytest.mark.parametrize("rank", [0, 1])
def test_each_rank_takes_its_channels_at_tp2(rank):
    """MambaMixer's loaders at tp 2 (inner 128 -> 64 a rank): in_proj's x and gate halves each cut by rank
    (MergedColumnParallelLinear), conv1d / dt_proj / A / D by rows, x_proj and out_proj by columns
    (RowParallelLinear), the dt / B / C norms whole."""
    m = shard_map(tiny_config(), 2)
    own = (64 * rank, 64 * rank + 64)
    want = {"in_proj.weight": [own, (128 + own[0], 128 + own[1])], "conv1d.weight": [own],
            "conv1d.bias": [own], "x_proj.weight": [own], "dt_proj.weight": [own], "dt_proj.bias": [own],
            "A_log": [own], "D": [own], "out_proj.weight": [own], "dt_layernorm.weight": [(0, 6)],
            "b_layernorm.weight": [(0, 8)], "c_layernorm.weight": [(0, 8)]}
    got = {t.name.removeprefix("model.layers.*.mamba."): [(p.start, p.stop) for p in t.rank_pieces(rank)]
           for t in m.tensors if ".mamba." in t.name}
    assert got == want
    local = {p.name.removeprefix("model.layers.*.mamba."): p.local_shapes[rank] for p in m.params
             if ".mamba." in p.name}
    assert local == {"in_proj.weight": [128, 64], "conv1d.weight": [64, 1, 3], "conv1d.bias": [64],
                     "x_proj.weight": [22, 64], "dt_proj.weight": [64, 6], "dt_proj.bias": [64],
                     "A_log": [64, 8], "D": [64], "out_proj.weight": [64, 64], "dt_layernorm.weight": [6],
                     "b_layernorm.weight": [8], "c_layernorm.weight": [8]}


def test_mini_stores_what_its_card_counts():
    """32 layers (4 attention, 28 Mamba1; 16 MoE of 16 experts, 16 dense MLPs), 65536 vocab untied: the card's
    52B total and 12B active. On the GPU A is float32 (vLLM builds it so), 2 more bytes per value."""
    hidden, inner, mlp, n, rank = 4096, 8192, 3 * 14336 * 4096, 16, 256
    mamba = (2 * inner * hidden + inner * 4 + inner + (rank + 2 * n) * inner + inner * rank + inner
             + inner * n + inner + hidden * inner + rank + 2 * n)
    attention = hidden * (4096 + 1024 + 1024) + 4096 * hidden
    experts = 16 * 16 * mlp
    total = (2 * 65536 * hidden + hidden + 32 * 2 * hidden + 28 * mamba + 4 * attention + 16 * mlp
             + 16 * 16 * hidden + experts)
    assert total == 51_570_323_328
    assert abs(total - 52e9) / 52e9 < 0.01
    assert round((total - experts + 16 * 2 * mlp) / 1e9) == 12  # top-2 of 16 experts: 12B active
    m = shard_map(presets()[MINI], 1)
    assert sum(math.prod(t.shape) for t in tensors(build_plan(m.model))) == total
    assert m.total_weight_bytes == 2 * total + 2 * 28 * inner * n


@pytest.mark.parametrize("tp", [1, 2, 8])
def test_state_and_kv_cache_by_hand(tp):
    """vLLM's mamba1_state_shape: conv [inner/tp, kernel-1] and ssm [inner/tp, state], in the model dtype;
    the 4 attention layers cache 8 KV heads of 128, replicated past tp 8."""
    r = shard_map(presets()[MINI], tp).ranks[0]
    assert r.state_bytes_per_sequence == 28 * (8192 // tp) * (3 + 16) * 2
    assert r.kv_cache_bytes_per_token == 4 * 2 * max(1, 8 // tp) * 128 * 2


def test_x_proj_all_reduces_beside_each_mixer():
    """x_proj is RowParallelLinear: every Mamba1 layer sums dt | B | C (256 + 2 x 16 values) over the GPUs
    before dt_proj, beside its out_proj's all-reduce."""
    m = shard_map(presets()[MINI], 4)
    reduces = {c.where.split(" (")[0]: (c.count, c.bytes_per_token) for c in collectives(m)}
    assert reduces["after Mamba1's x_proj"] == (28, 576)
    assert reduces["after o_proj / out_proj"] == (32, 8192) and reduces["after down_proj"] == (32, 8192)
    comm = comm_per_token(m.model, Layout(4))
    ring = 2 * 3 / 4
    assert comm["tp_all_reduce"] == pytest.approx(ring * (48 * 8192 + 28 * 576))


def test_valid_tp_sizes():
    spec = normalize(presets()[MINI])
    assert [tp for tp in (1, 2, 4, 8, 16, 32) if split_problem(spec, tp)[0] is None] == [1, 2, 4, 8, 16, 32]
    assert split_problem(spec, 3)[0] == "num_attention_heads=32 is not divisible by tp_size=3"
    assert split_problem(spec, 64)[0] == "num_attention_heads=32 is not divisible by tp_size=64"
    # SGLang 0.5.23 has no jamba.py: it would try its Transformers backend
    assert "model registry has no JambaForCausalLM" in split_problem(spec, 2, "sglang")[0]


def test_inner_channels_must_divide_tp():
    """vLLM's column layers and mamba1_state_shape divide mamba_expand x hidden_size by tp."""
    with pytest.raises(TPSizeError, match=r"mamba_expand \* hidden_size=6 is not divisible by tp_size=4"):
        MambaMixer(4, 6, 2, 2, 3, 4, 0)


def test_refusals():
    with pytest.raises(ConfigError, match="mamba_proj_bias=True: jamba's Mamba1 in_proj/out_proj biases"):
        normalize({**presets()[MINI], "mamba_proj_bias": True})
    with pytest.raises(ConfigError, match="attn_layer_offset=8 must be smaller than attn_layer_period=8"):
        normalize({**presets()[MINI], "attn_layer_offset": 8})


def test_one_expert_is_a_dense_mlp():
    """layers_num_experts above one makes a MoE block (JambaMoE); num_experts 1 leaves every layer dense."""
    spec = normalize({**presets()[MINI], "num_experts": 1})
    assert {layer.ffn.label for layer in spec.layers} == {"dense MLP 14336"} and not spec.is_moe


def test_every_pipeline_stage_holds_the_embedding_and_the_head():
    """jamba.py builds embed_tokens and lm_head with no pipeline-stage guard (vLLM 0.28 and 0.33): at tp 2 x
    pp 4 each stage holds 8 layers (1 attention, 7 Mamba1; 4 dense MLPs, 4 MoE) and both tables' halves."""
    from tpviz.deploy.deployment import deploy
    spec = normalize(presets()[MINI])
    h, inner, n, rank, mlp = 4096, 8192, 16, 256, 3 * 14336 * 4096
    # a Mamba1 layer's cut tensors at tp 2, bf16: in_proj, conv1d + bias, x_proj, dt_proj + bias, D, out_proj
    mamba = (2 * inner * h + inner * 5 + (rank + 2 * n) * inner + inner * rank + 2 * inner
             + h * inner) // 2 * 2
    mamba += inner * n // 2 * 4 + rank * 2 + 2 * n * 2  # A in float32; the dt / B / C norms whole
    stage = (7 * mamba + (6 * 1024 * h + h * h) // 2 * 2 + 4 * mlp // 2 * 2 + 4 * 16 * mlp // 2 * 2
             + 4 * 16 * h * 2 + 8 * 2 * h * 2)
    tables = 2 * 65536 // 2 * h * 2
    d = deploy(spec, Layout(2, pp=4), "vllm")
    assert [g.weight_bytes for g in d.gpus if g.pp in (0, 1, 2)] == [stage + tables] * 6
    assert [g.weight_bytes for g in d.gpus if g.pp == 3] == [stage + tables + h * 2] * 2  # + final norm
    assert any("embed_tokens and lm_head on every pipeline stage" in w for w in d.warnings)

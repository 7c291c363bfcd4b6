"""Falcon-H1 as vLLM 0.33 models/falcon_h1.py builds it: attention and a Mamba2 mixer side by side in every
layer, then a gated MLP. Names and shapes against tiny checkpoints transformers writes; every rank's slices,
the counts, the state and KV bytes and the collectives computed by hand here."""
import math

import pytest
import torch
import transformers
from tests.helpers.checkpoint import written_shapes

from tpviz import shard_map
from tpviz.config.normalize import normalize
from tpviz.config.sources import presets
from tpviz.deploy.fit import sizing_notes
from tpviz.deploy.traffic import comm_per_token
from tpviz.errors import ConfigError
from tpviz.plan import build_plan
from tpviz.plan.tensors import tensors
from tpviz.render.summary import cache_sentences
from tpviz.rules import Layout
from tpviz.trace.collectives import collectives
from tpviz.trace.validity import split_problem

H1 = "tiiuae/Falcon-H1-0.5B-Instruct"
TINY = dict(vocab_size=96, hidden_size=64, intermediate_size=48, num_hidden_layers=3, num_attention_heads=4,
            num_key_value_heads=2, head_dim=8, mamba_d_ssm=48, mamba_n_heads=6, mamba_d_head=8,
            mamba_d_state=4, mamba_d_conv=3)


def tiny_config(**changes) -> dict:
    config = transformers.FalconH1Config(**TINY, **changes)
    return {**config.to_dict(), "architectures": ["FalconH1ForCausalLM"]}


@pytest.mark.parametrize("changes", [{}, {"mamba_rms_norm": True, "mamba_n_groups": 2}])
def test_names_and_shapes_are_what_transformers_saves(tmp_path, changes):
    """mamba_rms_norm decides whether the gated norm has a weight (Mixer2RMSNormGated registers none
    without it), on disk and in vLLM."""
    torch.manual_seed(0)
    model = transformers.FalconH1ForCausalLM(transformers.FalconH1Config(**TINY, **changes))
    written = written_shapes(model, tmp_path)
    m = shard_map(tiny_config(**changes), 2, tensor_names=set(written), checkpoint_source="tiny")
    assert m.checkpoint["verified"], m.checkpoint
    assert {t.name: tuple(t.shape) for t in tensors(build_plan(m.model))} == written
    assert ("model.layers.0.mamba.norm.weight" in written) == bool(changes)
    assert {layer.label for layer in m.model.layers} == {"full attention ‖ Mamba2 + dense MLP 48"}


def test_each_rank_takes_its_heads_at_tp2():
    """0.5B at tp 2: 4 of 8 query heads and 1 of 2 KV heads of 64; 12 of 24 Mamba heads of 64, with the one
    group's B and C (128 each) on both ranks (in_proj [z | x | B | C | dt] 768 + 768 + 128 + 128 + 12 rows);
    the MLP's 2048 split in halves."""
    m = shard_map(presets()[H1], 2)
    local = {p.name.removeprefix("model.layers.*."): p.local_shapes for p in m.params if ".*." in p.name}
    assert local["self_attn.qkv_proj.weight"] == [[384, 1024]] * 2
    assert local["mamba.in_proj.weight"] == [[1804, 1024]] * 2
    assert local["mamba.conv1d.weight"] == [[1024, 1, 4]] * 2
    assert local["mamba.out_proj.weight"] == [[1024, 768]] * 2
    assert local["mamba.A_log"] == local["mamba.D"] == local["mamba.dt_bias"] == [[12]] * 2
    assert local["feed_forward.gate_up_proj.weight"] == [[2048, 1024]] * 2
    assert "mamba.norm.weight" not in local  # mamba_rms_norm false
    in_proj = next(t for t in m.tensors if t.name.endswith("mamba.in_proj.weight"))
    b = 2 * 1536  # rank 1: its z and x halves, then B and C whole (one run with x), then its 12 dt rows
    assert [(p.start, p.stop) for p in in_proj.rank_pieces(1)] == [
        (768, 1536), (1536 + 768, b + 256), (b + 256 + 12, b + 256 + 24)]


def test_05b_stores_what_its_release_counts():
    """36 layers, each: q/k/v/o, the Mamba2 mixer (no norm weight), the MLP of 2048 and two norms; 32784
    vocab untied; the release's 0.5B. vLLM holds each mixer's A (24 heads) in float32, 2 bytes more a head."""
    h, d_ssm, n, heads = 1024, 1536, 128, 24
    attention = h * (8 * 64 + 2 * 2 * 64) + 8 * 64 * h
    mamba = (2 * d_ssm + 2 * n + heads) * h + (d_ssm + 2 * n) * (4 + 1) + 3 * heads + h * d_ssm
    per_layer = attention + mamba + 3 * 2048 * h + 2 * h
    total = 2 * 32784 * h + h + 36 * per_layer
    assert total == 521_411_104
    assert abs(total - 0.5e9) / 0.5e9 < 0.05
    m = shard_map(presets()[H1], 1)
    assert sum(math.prod(t.shape) for t in tensors(build_plan(m.model))) == total
    assert m.total_weight_bytes == 2 * total + 36 * heads * 2


@pytest.mark.parametrize("tp", [1, 2, 4, 8])
def test_state_and_kv_cache_by_hand(tp):
    """vLLM's mamba2_state_shape: the one group extended to one a GPU, conv [(1536 + 2 x groups x 128) / tp,
    3] and ssm [24 / tp heads, 64, 128]; every layer also caches 2 KV heads of 64, replicated past tp 2."""
    r = shard_map(presets()[H1], tp).ranks[0]
    groups = max(1, tp)
    assert r.state_bytes_per_sequence == 36 * ((1536 + 2 * groups * 128) // tp * 3 + 24 // tp * 64 * 128) * 2
    assert r.kv_cache_bytes_per_token == 36 * 2 * max(1, 2 // tp) * 64 * 2


def test_attention_and_mamba_reduce_apart():
    """o_proj and the Mamba2 out_proj are each RowParallelLinear with reduce_results: two all-reduces a layer
    before the MLP's; no gated-norm all-reduce without its weight, one per layer with it (one group)."""
    m = shard_map(presets()[H1], 2)
    reduces = {c.where.split(" (")[0]: c.count for c in collectives(m) if c.op == "all-reduce"}
    assert reduces == {"after o_proj / out_proj": 72, "after down_proj": 36, "after embed_tokens": 1}
    assert comm_per_token(m.model, Layout(2))["tp_all_reduce"] == pytest.approx(108 * 2048)
    normed = shard_map({**presets()[H1], "mamba_rms_norm": True}, 2)
    assert [c.count for c in collectives(normed) if "Mamba2 gated norm" in c.where] == [36]


def test_valid_tp_sizes_and_notes():
    spec = normalize(presets()[H1])
    assert [tp for tp in (1, 2, 4, 8) if split_problem(spec, tp)[0] is None] == [1, 2, 4, 8]
    assert split_problem(spec, 3)[0] == "num_attention_heads=8 is not divisible by tp_size=3"
    assert split_problem(spec, 16)[0] == "num_attention_heads=8 is not divisible by tp_size=16"
    assert "falcon_h1 model file" in split_problem(spec, 2, "sglang")[0]
    assert sizing_notes(spec)  # a hybrid: vLLM pads its attention pages to the Mamba state
    assert any(s.startswith("Mamba2 layers keep a fixed state") for s in cache_sentences(shard_map(spec, 2)))


def test_refusals():
    with pytest.raises(ConfigError, match="mamba_proj_bias=True: falcon_h1's Mamba2 in_proj/out_proj biases"):
        normalize({**presets()[H1], "mamba_proj_bias": True})
    with pytest.raises(ConfigError, match="hidden_act='gelu'"):
        normalize({**presets()[H1], "hidden_act": "gelu"})
    with pytest.raises(ConfigError, match="mamba_n_heads=24 x mamba_d_head=64 is not mamba_d_ssm=2048"):
        normalize({**presets()[H1], "mamba_d_ssm": 2048})

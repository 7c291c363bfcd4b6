"""Total weight bytes at tp 1 of the hybrid and classic presets, against parameter counts written out by hand
from the raw config numbers (never with tpviz's own readers)."""
import pytest

from tpviz import shard_map
from tests.config.test_preset_layers import P, nbytes, text


def params_qwen3_next(c):
    h, V, n, k = c["hidden_size"], c["vocab_size"], c["num_hidden_layers"], c["full_attention_interval"]
    d, H, kv = c["head_dim"], c["num_attention_heads"], c["num_key_value_heads"]
    kd, vd = (c["linear_num_key_heads"] * c["linear_key_head_dim"],
              c["linear_num_value_heads"] * c["linear_value_head_dim"])
    nv, E, mi = c["linear_num_value_heads"], c["num_experts"], c["moe_intermediate_size"]
    si = c["shared_expert_intermediate_size"]
    full = h * 2 * H * d + 2 * h * kv * d + H * d * h + 2 * d
    gdn = (h * (2 * kd + 2 * vd) + h * 2 * nv + (2 * kd + vd) * c["linear_conv_kernel_dim"] + 2 * nv
           # in_proj_qkvz, in_proj_ba, conv1d, A_log + dt_bias, norm, out_proj
           + c["linear_value_head_dim"] + vd * h)
    moe = h * E + E * 3 * h * mi + 3 * h * si + h
    n_full = n // k
    return 2 * V * h + h + n * (2 * h + moe) + n_full * full + (n - n_full) * gdn


def params_nemotron_h(c):
    h, V, pat = c["hidden_size"], c["vocab_size"], c["hybrid_override_pattern"]
    hh, p, g, ns = c["mamba_num_heads"], c["mamba_head_dim"], c["n_groups"], c["ssm_state_size"]
    inner, conv = hh * p, hh * p + 2 * g * ns
    d, H, kv = c["attention_head_dim"], c["num_attention_heads"], c["num_key_value_heads"]
    per = {"M": h * (inner + conv + hh) + conv * c["conv_kernel"] + conv + 3 * hh + inner + inner * h,
           "*": 2 * h * H * d + 2 * h * kv * d, "-": 2 * h * c["intermediate_size"]}
    return 2 * V * h + h + sum(per[ch] + h for ch in pat)


def params_nemotron_nas(c):
    h, V, H = c["hidden_size"], c["vocab_size"], c["num_attention_heads"]
    total = 2 * V * h + h
    for b in c["block_configs"]:
        if not b["attention"]["no_op"]:
            total += 2 * h * h + 2 * h * (H // b["attention"]["n_heads_in_group"]) * (h // H) + h
        if not b["ffn"]["no_op"]:
            size = int(2 * b["ffn"]["ffn_mult"] * h / 3)
            total += 3 * h * (size + -size % 256) + h
    return total


def params_gpt2(c):
    h, V, n = c["n_embd"], c["vocab_size"], c["n_layer"]
    return V * h + c["n_positions"] * h + 2 * h + n * (4 * h + 3 * h * h + 3 * h + h * h + h
                                                       + 8 * h * h + 5 * h)


def params_neox(c):
    h, V, n, i = c["hidden_size"], c["vocab_size"], c["num_hidden_layers"], c["intermediate_size"]
    return 2 * V * h + 2 * h + n * (4 * h + 3 * h * h + 3 * h + h * h + h + 2 * h * i + i + h)


@pytest.mark.parametrize("key, count, nominal", [
    ("Qwen/Qwen3-Next-80B-A3B-Thinking", params_qwen3_next, 80e9),
    ("nvidia/Nemotron-H-56B-Base-8K", params_nemotron_h, 56e9),
    ("nvidia/Llama-3_3-Nemotron-Super-49B-v1", params_nemotron_nas, 49.9e9),
    ("openai-community/gpt2", params_gpt2, 124.4e6),
    ("EleutherAI/pythia-1.4b", params_neox, 1.41e9)])
def test_total_weight_bytes(key, count, nominal):
    n = count(P[key])
    assert n == pytest.approx(nominal, rel=0.01)  # the independent count is itself the advertised size
    m = shard_map(key, 1)
    assert m.total_weight_bytes == pytest.approx(n * nbytes(text(P[key])), rel=0.01)
    # plus vocab padding only
    assert m.ranks[0].weight_bytes == pytest.approx(n * nbytes(text(P[key])), rel=0.01)

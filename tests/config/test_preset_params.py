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


def params_glm_moe_dsa(c, mtp=0):
    """MLA with its lightning indexer (wq_b, wk, k_norm weight and bias, weights_proj) on every layer; `mtp`
    adds the next-token layer the checkpoint also holds (one more MoE layer, eh_proj and three norms)."""
    h, V, n, H = c["hidden_size"], c["vocab_size"], c["num_hidden_layers"], c["num_attention_heads"]
    ql, kvr, nope, rope = c["q_lora_rank"], c["kv_lora_rank"], c["qk_nope_head_dim"], c["qk_rope_head_dim"]
    v, ni, nd = c["v_head_dim"], c["index_n_heads"], c["index_head_dim"]
    E, mi = c["n_routed_experts"], c["moe_intermediate_size"]
    attn = (h * ql + ql + ql * H * (nope + rope) + h * (kvr + rope) + kvr + kvr * H * (nope + v) + H * v * h
            + ql * ni * nd + h * nd + 2 * nd + h * ni + 2 * h)
    moe = h * E + E + (E + c["n_shared_experts"]) * 3 * h * mi  # router, its bias, experts and shared experts
    k = c["first_k_dense_replace"]
    return (2 * V * h + h + n * attn + k * 3 * h * c["intermediate_size"] + (n - k) * moe
            + mtp * (attn + moe + 2 * h * h + 3 * h))


def tower_block(w, m):
    """One ViT block with biases everywhere: q/k/v/o, fc1/fc2 and two LayerNorms."""
    return 4 * w * w + 4 * w + 2 * w * m + m + w + 4 * w


def params_llama4(c):
    t, v = c["text_config"], c["vision_config"]
    h, V, n, d = t["hidden_size"], t["vocab_size"], t["num_hidden_layers"], t["head_dim"]
    E = t["num_local_experts"]
    # q/k/v/o and two norms (the q/k norm, where use_qk_norm, has no weight)
    attn = 2 * h * t["num_attention_heads"] * d + 2 * h * t["num_key_value_heads"] * d + 2 * h
    moe = h * E + (E + 1) * 3 * h * t["intermediate_size"]  # router, experts and the shared expert
    n_moe = sum((i + 1) % t["interleave_moe_layer_step"] == 0 for i in range(n))
    text = 2 * V * h + h + n * attn + n_moe * moe + (n - n_moe) * 3 * h * t["intermediate_size_mlp"]
    w, p, i = v["hidden_size"], v["patch_size"], v["projector_input_dim"]
    adapter = int(w / v["pixel_shuffle_ratio"] ** 2) * i + i * v["projector_output_dim"]
    tower = (v["num_hidden_layers"] * tower_block(w, v["intermediate_size"]) + w * v["num_channels"] * p * p
             + w + ((v["image_size"] // p) ** 2 + 1) * w + 4 * w + adapter)  # class token, positions, 2 norms
    return text + tower + v["vision_output_dim"] * h


def params_qwen3_vl_moe(c):
    t, v = c["text_config"], c["vision_config"]
    h, V, n, d = t["hidden_size"], t["vocab_size"], t["num_hidden_layers"], t["head_dim"]
    E = t["num_experts"]
    attn = 2 * h * t["num_attention_heads"] * d + 2 * h * t["num_key_value_heads"] * d + 2 * d + 2 * h
    text = 2 * V * h + h + n * (attn + h * E + E * 3 * h * t["moe_intermediate_size"])
    w, p, out = v["hidden_size"], v["patch_size"], v["out_hidden_size"]
    wide = w * v["spatial_merge_size"] ** 2
    merger = wide * wide + wide + wide * out + out
    tower = (v["depth"] * tower_block(w, v["intermediate_size"])
             + w * v["in_channels"] * v["temporal_patch_size"] * p * p + w + v["num_position_embeddings"] * w
             + 2 * w + merger + len(v["deepstack_visual_indexes"]) * (2 * wide + merger))
    return text + tower


def params_hunyuan_moe(c):
    """HunYuan-MoE: q/k/v/o with per-head q/k norms, in every layer a router, num_experts experts and one
    shared MLP, all intermediate_size wide (the per-layer lists name one size and one shared expert); tied."""
    h, V, n, d = c["hidden_size"], c["vocab_size"], c["num_hidden_layers"], c["attention_head_dim"]
    E, i = c["num_experts"], c["intermediate_size"]
    assert set(c["moe_intermediate_size"]) == {i} and set(c["num_shared_expert"]) == {1}
    attn = 2 * h * c["num_attention_heads"] * d + 2 * h * c["num_key_value_heads"] * d + 2 * d + 2 * h
    return V * h + h + n * (attn + h * E + (E + 1) * 3 * h * i)


@pytest.mark.parametrize("key, count, nominal", [
    ("tencent/Hunyuan-A13B-Instruct", params_hunyuan_moe, 80e9),  # the card's 80B total parameters
    ("Qwen/Qwen3-Next-80B-A3B-Thinking", params_qwen3_next, 80e9),
    ("nvidia/Nemotron-H-56B-Base-8K", params_nemotron_h, 56e9),
    ("nvidia/Llama-3_3-Nemotron-Super-49B-v1", params_nemotron_nas, 49.9e9),
    ("openai-community/gpt2", params_gpt2, 124.4e6),
    ("EleutherAI/pythia-1.4b", params_neox, 1.41e9),
    ("meta-llama/Llama-4-Scout-17B-16E-Instruct", params_llama4, 109e9),
    ("meta-llama/Llama-4-Maverick-17B-128E-Instruct", params_llama4, 400e9),
    ("Qwen/Qwen3-VL-235B-A22B-Instruct", params_qwen3_vl_moe, 235e9),
    ("zai-org/GLM-5", params_glm_moe_dsa, 744e9)])
def test_total_weight_bytes(key, count, nominal):
    n = count(P[key])
    assert n == pytest.approx(nominal, rel=0.01)  # the independent count is itself the advertised size
    m = shard_map(key, 1)
    assert m.total_weight_bytes == pytest.approx(n * nbytes(text(P[key])), rel=0.01)
    # plus vocab padding only
    assert m.ranks[0].weight_bytes == pytest.approx(n * nbytes(text(P[key])), rel=0.01)


# The published checkpoints' own counts: Scout's and Maverick's tensors on the hub (108,641,793,536 and
# 401,583,781,376, the figures a published parameter inventory and a provider's billing export give),
# Qwen3-VL-235B-A22B-Instruct's 1,388 tensors in a model report of the release, and Qwen3-VL-30B-A3B's
# index total_size (62,141,508,064 bytes of bf16, tests/data/indexes).
@pytest.mark.parametrize("key, count, published", [
    ("meta-llama/Llama-4-Scout-17B-16E-Instruct", params_llama4, 108_641_793_536),
    ("meta-llama/Llama-4-Maverick-17B-128E-Instruct", params_llama4, 401_583_781_376),
    ("Qwen/Qwen3-VL-235B-A22B-Instruct", params_qwen3_vl_moe, 235_670_022_896),
    ("Qwen/Qwen3-VL-30B-A3B-Instruct", params_qwen3_vl_moe, 62_141_508_064 // 2)])
def test_published_vlm_totals(key, count, published):
    assert count(P[key]) == published
    assert shard_map(key, 1).total_weight_bytes == published * 2  # bf16, vocabularies multiples of 64: no pad


def test_glm5_with_its_mtp_layer_is_glm51s_checkpoint():
    # GLM-5.1's config.json has GLM-5's numbers; a model report of its checkpoint lists 753,864,139,008 values
    assert params_glm_moe_dsa(P["zai-org/GLM-5"], mtp=1) == 753_864_139_008


def test_backend_presets_by_hand():
    """AFM-4.5B: q/k/v/o at 20 / 4 heads of 128, a gateless ReLU² MLP (up and down), untied: 4,619,184,640,
    the hub page's 4.6B. Hy-MT2-7B: Hunyuan-7B's q/k/v/o at 32 / 8 heads with per-head q/k norms, a SwiGLU
    MLP, tied: 7,504,568,320."""
    c = P["arcee-ai/AFM-4.5B"]
    h, V, n, i = c["hidden_size"], c["vocab_size"], c["num_hidden_layers"], c["intermediate_size"]
    afm = 2 * V * h + h + n * (2 * h * 20 * 128 + 2 * h * 4 * 128 + 2 * h * i + 2 * h)
    assert afm == 4_619_184_640 == shard_map("arcee-ai/AFM-4.5B", 1).total_weight_bytes // 2
    c = P["tencent/Hy-MT2-7B"]
    h, V, n, i = c["hidden_size"], c["vocab_size"], c["num_hidden_layers"], c["intermediate_size"]
    hy = V * h + h + n * (2 * h * 32 * 128 + 2 * h * 8 * 128 + 2 * 128 + 3 * h * i + 2 * h)
    assert hy == 7_504_568_320 == shard_map("tencent/Hy-MT2-7B", 1).total_weight_bytes // 2


def params_olmo(c, experts: int = 0):
    """OLMo-2/3's decoder: q/k norms over the whole projection, two post-norms a layer, untied; experts: that
    many SwiGLU experts of intermediate_size and a router a layer (FlexOlmo) in place of the dense MLP."""
    h, V, n, i = c["hidden_size"], c["vocab_size"], c["num_hidden_layers"], c["intermediate_size"]
    mlp = h * experts + experts * 3 * h * i if experts else 3 * h * i
    return 2 * V * h + h + n * (4 * h * h + 2 * h + mlp + 2 * h)


def test_classic_presets_by_hand():
    """StarCoder2-3B: LayerNorms and every projection biased, 24 / 2 heads of 128, an ungated c_fc / c_proj
    MLP, tied: 3,030,371,328 (the hub's 3.03B; untied would be 3.18B). OLMo-2-7B: q/k norms over the whole
    projection, two post-norms a layer, untied. Gemma-2B: 8 / 1 heads of 256, GeGLU, tied."""
    c = P["bigcode/starcoder2-3b"]
    h, V, n, i = c["hidden_size"], c["vocab_size"], c["num_hidden_layers"], c["intermediate_size"]
    kv = c["num_key_value_heads"] * h // c["num_attention_heads"]
    sc = V * h + 2 * h + n * (2 * (h * h + h) + 2 * (h * kv + kv) + 2 * h * i + i + h + 4 * h)
    assert sc == 3_030_371_328 == shard_map("bigcode/starcoder2-3b", 1).total_weight_bytes // 2
    olmo = params_olmo(P["allenai/OLMo-2-1124-7B"])
    assert olmo == 7_298_617_344 == shard_map("allenai/OLMo-2-1124-7B", 1).total_weight_bytes // 2
    c = P["google/gemma-2b"]
    h, V, n, i = c["hidden_size"], c["vocab_size"], c["num_hidden_layers"], c["intermediate_size"]
    d = c["head_dim"]
    gemma = V * h + h + n * (2 * h * 8 * d + 2 * h * d + 3 * h * i + 2 * h)
    assert gemma == 2_506_172_416 == shard_map("google/gemma-2b", 1).total_weight_bytes // 2


def test_qwen35_moe_with_its_mtp_layer_is_the_release_count():
    """Qwen3.5-35B-A3B: Qwen3-Next's text stack (Gated DeltaNet three layers in four, gated full attention in
    the fourth, 256 experts and a gated shared expert in every layer) and Qwen3-VL's tower without deepstack
    mergers; with the one next-token layer the checkpoint also holds (an MoE full-attention layer, its fc over
    [h | h] and three norms), the hub's 35.95B."""
    c = P["Qwen/Qwen3.5-35B-A3B"]
    t, v = c["text_config"], c["vision_config"]
    text = params_qwen3_next(t)
    w, p, out, m = v["hidden_size"], v["patch_size"], v["out_hidden_size"], v["intermediate_size"]
    wide = w * v["spatial_merge_size"] ** 2
    tower = (v["depth"] * tower_block(w, m) + w * v["in_channels"] * v["temporal_patch_size"] * p * p + w
             + v["num_position_embeddings"] * w + 2 * w + wide * wide + wide + wide * out + out)
    gdn = t["num_hidden_layers"] - t["num_hidden_layers"] // t["full_attention_interval"]
    # bf16, but each Gated DeltaNet layer's A_log, which vLLM 0.33 holds in float32 (2 bytes more a value)
    assert shard_map("Qwen/Qwen3.5-35B-A3B", 1).total_weight_bytes == (text + tower) * 2 + gdn * t[
        "linear_num_value_heads"] * 2
    h, H, kv, d, E, mi = (t["hidden_size"], t["num_attention_heads"], t["num_key_value_heads"], t["head_dim"],
                          t["num_experts"], t["moe_intermediate_size"])
    # gated q, k, v, o, q/k norms, two norms; the MoE and its shared expert (and gate)
    mtp = (2 * h * H * d + 2 * h * kv * d + H * d * h + 2 * d + 2 * h
           + h * E + E * 3 * h * mi + 3 * h * t["shared_expert_intermediate_size"] + h
           + 2 * h * h + 3 * h)
    assert round((text + tower + mtp) / 1e9, 2) == 35.95


def test_olmo3_flexolmo_and_jais2_by_hand():
    """OLMo-3-7B: OLMo-2's layer (whole-projection q/k norms, two post-norms), untied. FlexOlmo-7x7B: the same
    attention, seven 11008-wide SwiGLU experts and a router a layer: the card's 33B. Jais-2-8B: biased q/k/v/o
    and up / down, two LayerNorms a layer and a final one, untied: the hub's 8.09B."""
    olmo3 = params_olmo(P["allenai/Olmo-3-1025-7B"])
    assert olmo3 == 7_298_011_136 == shard_map("allenai/Olmo-3-1025-7B", 1).total_weight_bytes // 2
    c = P["allenai/FlexOlmo-7x7B-1T"]
    flex = params_olmo(c, experts=c["num_experts"])
    assert flex == 33_270_665_216 == shard_map("allenai/FlexOlmo-7x7B-1T", 1).total_weight_bytes // 2
    c = P["inceptionai/Jais-2-8B-Chat"]
    h, V, n, i = c["hidden_size"], c["vocab_size"], c["num_hidden_layers"], c["intermediate_size"]
    jais = 2 * V * h + 2 * h + n * (4 * (h * h + h) + 2 * h * i + i + h + 4 * h)
    assert jais == 8_090_401_280 == shard_map("inceptionai/Jais-2-8B-Chat", 1).total_weight_bytes // 2


def test_gemma3_4b_takes_its_class_defaults_as_vllm_does():
    """gemma-3-4b-it's text_config gives width, MLP and layers alone: Gemma3TextConfig's 8 heads, 4 KV heads
    of 256 and 262208 tokens fill the rest, as vLLM builds it; the map is the card's 4.3B (4,300,079,472)."""
    m = shard_map("google/gemma-3-4b-it", 1)
    assert (m.model.num_attention_heads, m.model.num_key_value_heads, m.model.head_dim) == (8, 4, 256)
    assert m.total_weight_bytes == 4_300_079_472 * 2
    assert any("num_key_value_heads (4), head_dim (256)" in n for n in m.model.notes)


def test_minicpm3_by_hand():
    """MiniCPM3-4B: q_a (768) and its norm, q_b to 40 heads of 96, kv_a_proj_with_mqa (256 + 32) and its norm,
    kv_b to 40 heads of 64 + 64, o_proj from 40 x 64, a SwiGLU MLP, two norms; tied: 4,073,875,968."""
    c = P["openbmb/MiniCPM3-4B"]
    h, V, n, i, H = c["hidden_size"], c["vocab_size"], c["num_hidden_layers"], c["intermediate_size"], \
        c["num_attention_heads"]
    ql, kvr, nope, rope = c["q_lora_rank"], c["kv_lora_rank"], c["qk_nope_head_dim"], c["qk_rope_head_dim"]
    v = h // H
    attn = h * ql + ql + ql * H * (nope + rope) + h * (kvr + rope) + kvr + kvr * H * (nope + v) + H * v * h
    assert V * h + h + n * (attn + 3 * h * i + 2 * h) == 4_073_875_968
    assert shard_map("openbmb/MiniCPM3-4B", 1).total_weight_bytes == 4_073_875_968 * 2


def test_deepseek_v2_lite_is_its_index_total():
    """DeepSeek-V2-Lite-Chat's model.safetensors.index.json reports total_size 31,412,968,448 bytes (bf16):
    MLA with a plain q_proj (q_lora_rank null), layer 0 dense, 26 MoE layers of 64 experts and a 2 x 1408
    shared MLP."""
    c = P["deepseek-ai/DeepSeek-V2-Lite-Chat"]
    h, V, i = 2048, c["vocab_size"], c["intermediate_size"]
    m, E = c["moe_intermediate_size"], c["n_routed_experts"]
    attn = h * 16 * 192 + h * 576 + 512 + 512 * 16 * 256 + 16 * 128 * h
    moe = h * E + E * 3 * h * m + 3 * h * 2 * m
    total = 2 * V * h + h + 27 * (attn + 2 * h) + 3 * h * i + 26 * moe
    assert 2 * total == 31_412_968_448 == shard_map("deepseek-ai/DeepSeek-V2-Lite-Chat", 1).total_weight_bytes

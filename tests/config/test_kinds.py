"""Config readers: every per-layer field turned into each layer's mixer and FFN, as vLLM 0.33 reads them
(research: per-layer rules). Bad or unmodelled configs are refused with one ConfigError line naming the
part."""
import json

import pytest

from tpviz import ConfigError
from tpviz.config.normalize import normalize

BASE = dict(hidden_size=16, num_attention_heads=4, num_key_value_heads=2, intermediate_size=32, vocab_size=64,
            num_hidden_layers=4)
GDN = dict(linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=4, linear_value_head_dim=3,
           linear_conv_kernel_dim=4)
MAMBA = dict(mamba_num_heads=4, mamba_head_dim=4, n_groups=2, ssm_state_size=8, conv_kernel=4)


def mixers(spec):
    return [layer.mixer.kind for layer in spec.layers]


def ffns(spec):
    return [(layer.ffn.kind, layer.ffn.size) for layer in spec.layers]


def refused(cfg, *words):
    """normalize(cfg) raises one ConfigError line containing every word."""
    with pytest.raises(ConfigError) as e:
        normalize(cfg)
    msg = str(e.value)
    assert "\n" not in msg and all(w in msg for w in words), msg
    return msg


# --- layer_types ---

def test_layer_types():
    s = normalize(dict(BASE, model_type="olmo3", sliding_window=8,
                       layer_types=["sliding_attention", "full_attention",
                                    "sliding_attention", "full_attention"]))
    assert mixers(s) == ["sliding_attention", "attention"] * 2
    assert [layer.mixer.window for layer in s.layers] == [8, 0, 8, 0]
    s = normalize(dict(BASE, **GDN, model_type="qwen3_next",
                       layer_types=["linear_attention"] * 3 + ["full_attention"]))
    assert mixers(s) == ["gated_deltanet"] * 3 + ["attention"]


def test_layer_types_refused():
    refused(dict(BASE, model_type="qwen3", layer_types=["full_attention"] * 3), "layer_types", "3", "4")
    refused(dict(BASE, model_type="qwen3", layer_types=["full_attention"] * 3 + ["banana"]),
            "layer_types", "banana")
    refused(dict(BASE, model_type="qwen3", layer_types="full_attention"), "layer_types")
    # no window
    refused(dict(BASE, model_type="llama", layer_types=["sliding_attention"] * 4), "sliding_window")
    # transformers' Olmo3Config, which vLLM reads it with, gives a window the config leaves out: 4096
    s = normalize(dict(BASE, model_type="olmo3", layer_types=["sliding_attention"] * 4))
    assert [layer.mixer.window for layer in s.layers] == [4096] * 4


# --- Qwen3-Next: full_attention_interval ---

def test_full_attention_interval():
    s = normalize(dict(BASE, **GDN, model_type="qwen3_next", num_hidden_layers=12, full_attention_interval=4))
    # every 4th layer ((i + 1) % 4 == 0) is full attention, the rest Gated DeltaNet
    assert [i for i, k in enumerate(mixers(s)) if k == "attention"] == [3, 7, 11]
    gdn = s.layers[0].mixer
    assert (gdn.heads, gdn.head_dim, gdn.groups, gdn.key_dim, gdn.conv_kernel) == (4, 3, 2, 4, 4)
    assert s.layers[3].mixer.output_gate  # Qwen3-Next's gated q_proj


def test_full_attention_interval_default_is_4():
    s = normalize(dict(BASE, **GDN, model_type="qwen3_next", num_hidden_layers=8))
    assert [i for i, k in enumerate(mixers(s)) if k == "attention"] == [3, 7]


# --- Nemotron-H: hybrid_override_pattern ---

NH = dict(BASE, **MAMBA, model_type="nemotron_h", n_routed_experts=4, num_experts_per_tok=2,
          moe_intermediate_size=8)


def test_hybrid_override_pattern():
    s = normalize(dict(NH, hybrid_override_pattern="M*-E"))
    assert mixers(s) == ["mamba2", "attention", "none", "none"]
    assert [f[0] for f in ffns(s)] == ["none", "none", "dense", "moe"]
    assert not s.layers[1].mixer.rope  # Nemotron-H attention has no RoPE
    m = s.layers[0].mixer
    assert (m.heads, m.head_dim, m.groups, m.state, m.conv_kernel) == (4, 4, 2, 8, 4)
    assert s.layers[2].ffn.size == 32 and s.layers[3].ffn.size == 8


def test_hybrid_override_pattern_per_mlp_sizes():
    # intermediate_size as a list: one entry per '-' layer, by its ordinal among the '-' layers
    s = normalize(dict(NH, hybrid_override_pattern="-M--", intermediate_size=[8, 16, 24]))
    assert ffns(s) == [("dense", 8), ("none", 0), ("dense", 16), ("dense", 24)]
    # transformers' NemotronHConfig takes one size: read as given, with a note (a checkpoint's own config code
    # can)
    assert any("NemotronHConfig" in n and "read as given" in n for n in s.notes)
    s = normalize(dict(NH, hybrid_override_pattern="-M--", intermediate_size=[40]))  # one entry serves all
    assert ffns(s) == [("dense", 40), ("none", 0), ("dense", 40), ("dense", 40)]
    refused(dict(NH, hybrid_override_pattern="-M--", intermediate_size=[8, 16]), "intermediate_size", "3")


def test_hybrid_override_pattern_refused():
    refused(dict(NH, hybrid_override_pattern="M*-"), "hybrid_override_pattern", "4")
    refused(dict(NH, hybrid_override_pattern="M*-X"), "hybrid_override_pattern", "'X'")
    refused(dict(NH, hybrid_override_pattern="M*-E", n_routed_experts=None), "hybrid_override_pattern", "'E'")


# --- Nemotron-NAS (DeciLM): block_configs ---

def block(attn, ffn):
    return {"attention": attn, "ffn": ffn}


NAS = dict(BASE, model_type="nemotron-nas", hidden_size=1024, num_attention_heads=8, num_key_value_heads=None,
           intermediate_size=None)


def test_block_configs():
    s = normalize(dict(NAS, block_configs=[
        block({"n_heads_in_group": 2, "no_op": False}, {"ffn_mult": 1.3, "no_op": False}),
        block({"n_heads_in_group": None, "no_op": True}, {"ffn_mult": 2.625}),
        block({"n_heads_in_group": 8}, {"no_op": True, "ffn_mult": None}),
        block({"n_heads_in_group": 1}, {"ffn_mult": 5.25})]))
    assert mixers(s) == ["attention", "none", "attention", "attention"]
    assert [layer.mixer.kv_heads for layer in s.layers] == [4, 0, 1, 8]  # 8 // n_heads_in_group
    # int(2 * mult * 1024 / 3), rounded up to a multiple of 256: 887 -> 1024, 1792 stays, 3584 stays
    assert ffns(s) == [("dense", 1024), ("dense", 1792), ("none", 0), ("dense", 3584)]


def test_block_configs_refused():
    good = block({"n_heads_in_group": 2}, {"ffn_mult": 1.0})
    refused(dict(NAS, block_configs=[good, {"attention": {"n_heads_in_group": 2}}, good, good]),
            "block_configs[1]", "ffn")
    refused(dict(NAS, block_configs=[good] * 3), "block_configs")
    refused(dict(NAS, block_configs=[good, good, block({"n_heads_in_group": 3}, {"ffn_mult": 1.0}), good]),
            "block_configs[2]", "n_heads_in_group")
    refused(dict(NAS,
                 block_configs=[good, block({"replace_with_linear": True}, {"ffn_mult": 1.0}), good, good]),
            "block_configs[1].attention.replace_with_linear")


# --- Llama-4 ---

L4 = dict(BASE, model_type="llama4_text", num_local_experts=4, num_experts_per_tok=1, intermediate_size=8,
          intermediate_size_mlp=24, attention_chunk_size=32)


def test_llama4():
    s = normalize(dict(L4, interleave_moe_layer_step=2, no_rope_layers=[1, 1, 1, 0]))
    # no_rope_layers: 1 = RoPE (chunked local attention), 0 = NoPE (global attention)
    assert mixers(s) == ["chunked_attention"] * 3 + ["attention"]
    assert [layer.mixer.window for layer in s.layers] == [32, 32, 32, 0]
    assert [layer.mixer.rope for layer in s.layers] == [True, True, True, False]
    # MoE iff (i + 1) % step == 0; experts and the shared expert use intermediate_size, dense
    # intermediate_size_mlp
    assert ffns(s) == [("dense", 24), ("moe", 8), ("dense", 24), ("moe", 8)]
    assert s.layers[1].ffn.shared == 8 and s.layers[1].ffn.experts == 4
    refused(dict(L4, no_rope_layers=[1, 0]), "no_rope_layers", "2")


def test_llama4_defaults():
    # HF default: no_rope_layers[i] = int((i + 1) % 4 != 0), so layers 3 and 7 are NoPE; step 1: every layer
    # MoE
    s = normalize(dict(L4, num_hidden_layers=8))
    assert [i for i, layer in enumerate(s.layers) if not layer.mixer.rope] == [3, 7]
    assert mixers(s)[3] == "attention" and mixers(s)[0] == "chunked_attention"
    assert {f[0] for f in ffns(s)} == {"moe"}


def test_llama4_default_chunk():
    cfg = {k: v for k, v in L4.items() if k != "attention_chunk_size"}
    s = normalize(dict(cfg, no_rope_layers=[1, 1, 1, 0]))
    assert mixers(s)[0] == "chunked_attention" and s.layers[0].mixer.window == 8192


# --- which layers carry experts ---

def test_first_k_dense_replace_and_freq():
    cfg = dict(BASE, model_type="deepseek_v3", num_hidden_layers=6, n_routed_experts=4, num_experts_per_tok=2,
               moe_intermediate_size=8, first_k_dense_replace=2)
    assert [f[0] for f in ffns(normalize(cfg))] == ["dense"] * 2 + ["moe"] * 4
    assert [f[0] for f in ffns(normalize(dict(cfg, moe_layer_freq=2)))] == ["dense", "dense",
                                                                            "moe", "dense", "moe",
                                                                          "dense"]


def test_more_experts_per_token_than_experts_is_refused():
    refused(dict(BASE, model_type="qwen3_moe", num_experts=4, num_experts_per_tok=5, moe_intermediate_size=8),
            "num_experts_per_tok=5", "4 experts")


def test_mlp_only_layers_and_sparse_step():
    cfg = dict(BASE, model_type="qwen3_moe", num_hidden_layers=6, num_experts=4, num_experts_per_tok=2,
               moe_intermediate_size=8)
    assert ffns(normalize(dict(cfg, mlp_only_layers=[0, 4]))) == [("dense", 32)] + [("moe", 8)] * 3 + [
        ("dense", 32), ("moe", 8)]
    # decoder_sparse_step 2: MoE iff (i + 1) % 2 == 0, and not in mlp_only_layers
    assert [f[0] for f in ffns(normalize(dict(cfg, decoder_sparse_step=2, mlp_only_layers=[3])))] == [
        "dense", "moe", "dense", "dense", "dense", "moe"]
    refused(dict(cfg, mlp_only_layers=[9]), "mlp_only_layers")


# --- LFM2 ---

def test_lfm2_layers_and_ff_dim():
    s = normalize(dict(BASE, model_type="lfm2", layer_types=["conv", "full_attention", "conv", "conv"],
                       block_ff_dim=12288, conv_L_cache=3))
    assert mixers(s) == ["short_conv", "attention", "short_conv", "short_conv"]
    assert s.layers[0].mixer.conv_kernel == 3
    # auto adjust: int(2 * 12288 / 3) = 8192, already a multiple of 256; every layer dense
    assert set(ffns(s)) == {("dense", 8192)}
    s = normalize(dict(BASE, model_type="lfm2", full_attn_idxs=[1], block_ff_dim=1000,
                       block_ffn_dim_multiplier=1.5))
    assert mixers(s) == ["short_conv", "attention", "short_conv", "short_conv"]
    assert s.intermediate_size == 1024  # int(1.5 * int(2000 / 3)) = 999 -> 1024
    assert normalize(dict(BASE, model_type="lfm2", layer_types=["conv"] * 4, block_ff_dim=100,
                          block_auto_adjust_ff_dim=False)).intermediate_size == 100


# --- unknown and unmodelled model types ---

@pytest.mark.parametrize("field, value", [("mamba_d_state", 16), ("ssm_cfg", {}),
                                          ("attn_type_list", [0, 1, 0, 1])])
def test_unknown_type_with_hybrid_field_is_refused(field, value):
    refused(dict(BASE, model_type="some_hybrid", **{field: value}), "some_hybrid", field)


def test_unknown_llama_like_type_maps_with_a_note():
    s = normalize(dict(BASE, model_type="my_llama"))
    assert mixers(s) == ["attention"] * 4 and set(ffns(s)) == {("dense", 32)}
    assert any("my_llama" in n and "Llama" in n for n in s.notes)


@pytest.mark.parametrize("model_type, part", [("rwkv", "RWKV"), ("minimax_m1", "lightning attention"),
                                              ("bamba", "Bamba")])
def test_unmodelled_types_are_refused(model_type, part):
    refused(dict(BASE, model_type=model_type), model_type, part)


@pytest.mark.parametrize("cls, part", [("BambaForCausalLM", "Bamba"),
                                       ("MiniMaxText01ForCausalLM", "lightning attention")])
def test_an_unmodelled_class_vllm_retired_says_both(cls, part):
    """Bamba and MiniMax-Text-01 are also in vLLM 0.33's _PREVIOUSLY_SUPPORTED_MODELS (last served by 0.23.0):
    the one line names the part and the release."""
    model_type = {"BambaForCausalLM": "bamba"}.get(cls, "minimax_text_01")
    with pytest.raises(ConfigError) as e:
        normalize(dict(BASE, model_type=model_type, architectures=[cls]))
    assert part in str(e.value) and f"vLLM served {cls} until 0.23.0" in str(e.value)
    assert "\n" not in str(e.value)


def test_an_unmodelled_class_vllm_does_not_serve_says_so():
    """RWKV and RecurrentGemma are in no vLLM 0.33 registry; Zamba2 is (zamba2.py): only tpviz lacks it."""
    for model_type, cls, served in (("rwkv", "RwkvForCausalLM", False),
                                    ("recurrent_gemma", "RecurrentGemmaForCausalLM", False),
                                    ("zamba2", "Zamba2ForCausalLM", True)):
        with pytest.raises(ConfigError) as e:
            normalize(dict(BASE, model_type=model_type, architectures=[cls]))
        assert (f"nor does vLLM 0.33 serve {cls}" in str(e.value)) is not served, str(e.value)


def test_voxtral_is_refused_as_the_form_vllm_does_not_serve():
    """A Hugging Face Voxtral config (transformers' own, with its text_config a Llama): vLLM 0.33's class
    reads audio_config.downsample_factor, which only its Mistral-format adapter sets; one line names the
    flags."""
    from transformers import VoxtralConfig
    cfg = json.loads(VoxtralConfig().to_json_string())
    with pytest.raises(ConfigError) as e:
        normalize(cfg)
    assert str(e.value).startswith("voxtral: vLLM 0.33 serves it only from Mistral's own format")
    assert "--config-format mistral" in str(e.value) and "\n" not in str(e.value)

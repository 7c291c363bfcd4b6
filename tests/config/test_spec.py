"""Config normalization: the many shapes real config.json files take, and every malformed one."""
import json
import resource
import subprocess
import sys

import pytest

from tpviz import ConfigError, shard_map
from tpviz.config.normalize import normalize
from tpviz.errors import MissingFieldError
from tests.paths import ROOT

LLAMA = {"model_type": "llama", "hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8,
         "intermediate_size": 14336, "vocab_size": 128256, "num_hidden_layers": 32, "torch_dtype": "bfloat16"}


def one_line_error(cfg, match: str | None = None) -> str:
    with pytest.raises(ConfigError) as err:
        normalize(cfg)
    msg = str(err.value)
    assert msg and "\n" not in msg
    if match:
        assert match in msg, msg
    return msg


def test_plain_llama():
    s = normalize(LLAMA, "x")
    assert (s.name, s.hidden_size, s.num_attention_heads, s.num_key_value_heads,
            s.head_dim) == ("x", 4096, 32, 8, 128)
    assert (s.intermediate_size, s.vocab_size, s.num_hidden_layers) == (14336, 128256, 32)
    assert (s.tie_word_embeddings, s.attention_bias, s.num_experts) == (False, False, 0)
    assert not s.is_moe and not s.is_mla
    assert s.dtype == "bfloat16" and s.dtype_bytes == 2 and s.notes == []
    assert s.to_dict()["name"] == "x"


def test_a_text_config_that_leaves_sizes_to_its_class_takes_them_as_vllm_does():
    """LLaVA-1.5's released text_config gives no hidden_size, heads or layers: vLLM 0.33 builds the decoder
    from LlavaConfig's reading, LlamaConfig's defaults (4096 / 32 / 32, 11008 MLP), and so does tpviz, naming
    each default in a note. A config read as given (InternVL's llm_config: no transformers class) still names
    the missing size, as does a top-level config without one."""
    llava = {"model_type": "llava", "architectures": ["LlavaForConditionalGeneration"],
             "text_config": {"model_type": "llama", "vocab_size": 32064, "max_position_embeddings": 4096},
             "vision_config": {"model_type": "clip_vision_model", "hidden_size": 1024,
                               "num_attention_heads": 16, "num_hidden_layers": 24, "patch_size": 14,
                               "image_size": 336}}
    s = normalize(llava)
    dims = (s.hidden_size, s.num_attention_heads, s.num_hidden_layers, s.intermediate_size)
    assert dims == (4096, 32, 32, 11008)
    assert s.num_key_value_heads == 32 and s.vocab_size == 32064
    note = next(n for n in s.notes if n.startswith("text_config leaves"))
    assert "hidden_size (4096)" in note and "LlamaConfig's defaults" in note and "vocab_size" not in note
    given = normalize({**llava, "text_config": {**llava["text_config"], "hidden_size": 2048,
                                                "num_attention_heads": 16, "num_hidden_layers": 4,
                                                "intermediate_size": 5632}})
    assert given.hidden_size == 2048 and not any(n.startswith("text_config leaves") for n in given.notes)
    with pytest.raises(MissingFieldError) as e:
        normalize({"model_type": "llama", "vocab_size": 32000})
    assert str(e.value).startswith("config is missing hidden_size")
    intern = {"model_type": "internvl_chat", "architectures": ["InternVLChatModel"],
              "llm_config": {"model_type": "qwen2", "vocab_size": 151674}}
    with pytest.raises(MissingFieldError) as e:
        normalize(intern)
    assert "\n" not in str(e.value) and str(e.value).startswith("llm_config is missing hidden_size")


def test_nested_text_config():
    cfg = {"model_type": "gemma3", "torch_dtype": "float32",
           "text_config": {"model_type": "gemma3_text", "hidden_size": 5376, "num_attention_heads": 32,
                           "num_key_value_heads": 16, "head_dim": 128, "intermediate_size": 21504,
                           "vocab_size": 262208, "num_hidden_layers": 62},
           "vision_config": {"hidden_size": 1152, "num_attention_heads": 16}}
    s = normalize(cfg)
    assert (s.model_type, s.hidden_size, s.num_key_value_heads, s.head_dim) == ("gemma3_text", 5376, 16, 128)
    assert s.tie_word_embeddings is True  # gemma ties by default
    # the outer dtype applies; vLLM's auto serves bf16
    assert s.config_dtype == "float32" and s.dtype == "bfloat16"
    assert s.qk_norm


def test_head_dim_explicit_wins():
    s = normalize({**LLAMA, "hidden_size": 1024, "num_attention_heads": 16, "head_dim": 128})
    assert s.head_dim == 128  # not 1024 / 16 = 64
    assert normalize({**LLAMA, "head_dim": None}).head_dim == 128
    assert normalize({k: v for k, v in LLAMA.items()}).head_dim == 128
    one_line_error({**LLAMA, "hidden_size": 4000, "num_attention_heads": 48}, "hidden_size=4000")


def test_mha_without_num_key_value_heads():
    cfg = {k: v for k, v in LLAMA.items() if k != "num_key_value_heads"}
    assert normalize(cfg).num_key_value_heads == 32


def test_tie_word_embeddings_default():
    base = {k: v for k, v in LLAMA.items()}
    assert normalize(base).tie_word_embeddings is False  # llama: untied unless it says so
    for mt in ("gemma", "gemma2", "gemma3_text"):
        assert normalize({**base, "model_type": mt}).tie_word_embeddings is True
    assert normalize({**base, "model_type": "gemma2",
                      "tie_word_embeddings": False}).tie_word_embeddings is False
    assert normalize({**base, "tie_word_embeddings": True}).tie_word_embeddings is True


def test_legacy_names():
    gpt = {"model_type": "gpt_bigcode", "n_embd": 2048, "n_head": 16, "multi_query": True, "n_inner": 8192,
           "vocab_size": 49152, "n_layer": 24, "n_positions": 8192}
    s = normalize(gpt)
    assert (s.hidden_size, s.num_attention_heads, s.num_key_value_heads, s.intermediate_size,
            s.num_hidden_layers) == (
        2048, 16, 1, 8192, 24)
    assert not s.notes and not s.gated_mlp and s.max_positions == 8192  # a classic decoder tpviz knows
    falcon = {"model_type": "falcon", "hidden_size": 4544, "num_attention_heads": 71, "num_kv_heads": 1,
              "ffn_hidden_size": 18176, "vocab_size": 65024, "num_hidden_layers": 32}
    s = normalize(falcon)
    assert (s.num_key_value_heads, s.intermediate_size, s.head_dim) == (1, 18176, 64)
    glm = {"model_type": "chatglm", "hidden_size": 4096, "num_attention_heads": 32,
           "multi_query_attention": True,
           "multi_query_group_num": 2, "kv_channels": 128, "ffn_hidden_size": 13696,
           "padded_vocab_size": 65024, "num_layers": 28, "add_qkv_bias": True}
    s = normalize(glm)
    assert (s.num_key_value_heads, s.head_dim, s.intermediate_size, s.vocab_size, s.num_hidden_layers) == (
        2, 128, 13696, 65024, 28)
    assert s.attention_bias and not s.o_proj_bias
    assert normalize({**glm, "multi_query_attention": False}).num_key_value_heads == 32


def test_multi_query_false_keeps_kv_heads():
    cfg = {**LLAMA, "multi_query": False}
    assert normalize(cfg).num_key_value_heads == 8


@pytest.mark.parametrize("key, value", [("num_local_experts", 8), ("num_experts", 128),
                                        ("n_routed_experts", 256)])
def test_moe_names(key, value):
    s = normalize({**LLAMA, key: value, "moe_intermediate_size": 768, "num_experts_per_tok": 8})
    assert (s.num_experts, s.moe_intermediate_size, s.num_experts_per_tok) == (value, 768, 8)
    assert s.is_moe and s.moe_layers == list(range(32)) and s.dense_layers == []


def test_moe_intermediate_defaults_to_intermediate_size():
    # Mixtral has no moe_intermediate_size
    s = normalize({**LLAMA, "model_type": "mixtral", "num_local_experts": 8})
    assert s.moe_intermediate_size == 14336


def test_moe_layer_selection():
    ds = normalize({**LLAMA, "n_routed_experts": 16, "moe_intermediate_size": 64, "first_k_dense_replace": 3,
                    "n_shared_experts": 2})
    assert ds.moe_layers == list(range(3, 32)) and ds.dense_layers == [0, 1, 2]
    assert ds.shared_expert_intermediate_size == 128
    q = normalize({**LLAMA, "num_experts": 4, "moe_intermediate_size": 64, "decoder_sparse_step": 2,
                   "mlp_only_layers": [3]})
    assert q.moe_layers == [i for i in range(32) if (i + 1) % 2 == 0 and i != 3]
    one_line_error({**LLAMA, "num_experts": 4, "mlp_only_layers": "3"}, "mlp_only_layers")
    one_line_error({**LLAMA, "n_routed_experts": 4, "first_k_dense_replace": -1}, "first_k_dense_replace")
    one_line_error({**LLAMA, "n_routed_experts": 4, "moe_layer_freq": 0}, "moe_layer_freq")


def test_moe_without_dense_layers_needs_no_intermediate_size():
    cfg = {k: v for k, v in LLAMA.items() if k != "intermediate_size"}
    s = normalize({**cfg, "num_experts": 4, "moe_intermediate_size": 64})
    assert s.intermediate_size == 0 and s.moe_intermediate_size == 64
    one_line_error({**cfg, "n_routed_experts": 4, "moe_intermediate_size": 64, "first_k_dense_replace": 1},
                   "intermediate_size")


def test_moe_intermediate_size_zero_is_a_config_error():
    """Experts with moe_intermediate_size=0 cannot be mapped: it must be a ConfigError (or TPSizeError)
    line."""
    cfg = {**LLAMA, "model_type": "mixtral", "num_local_experts": 8, "moe_intermediate_size": 0}
    with pytest.raises(ValueError) as err:
        shard_map(cfg, 2)
    assert "moe_intermediate_size" in str(err.value) and "\n" not in str(err.value)


def test_mla_fields():
    s = normalize({**LLAMA, "kv_lora_rank": 512, "q_lora_rank": 1536, "qk_nope_head_dim": 128,
                   "qk_rope_head_dim": 64, "v_head_dim": 128})
    assert s.is_mla and (s.kv_lora_rank, s.q_lora_rank) == (512, 1536)
    one_line_error({**LLAMA, "kv_lora_rank": 512}, "kv_lora_rank")


def test_attention_bias():
    assert normalize({**LLAMA, "model_type": "qwen2"}).attention_bias  # qwen2 always has q/k/v bias
    assert not normalize({**LLAMA, "model_type": "qwen2"}).o_proj_bias
    s = normalize({**LLAMA, "attention_bias": True})
    assert s.attention_bias and s.o_proj_bias


def test_dtype_names():
    assert normalize({**LLAMA, "torch_dtype": "torch.float16"}).dtype == "float16"
    fp32 = normalize({**LLAMA, "torch_dtype": None, "dtype": "float32"})
    assert fp32.dtype_bytes == 2 and any("dtype=auto" in n for n in fp32.notes)  # vLLM serves float32 in bf16
    assert fp32.served("float32").dtype_bytes == 4 and fp32.served("auto", "fp8").kv_bytes == 1
    s = normalize({**LLAMA, "torch_dtype": "int4_weird"})
    assert s.dtype_bytes == 2 and any("int4_weird" in n for n in s.notes)


@pytest.mark.parametrize("key", ["hidden_size", "num_attention_heads", "vocab_size", "num_hidden_layers",
                                 "intermediate_size"])
def test_missing_fields(key):
    cfg = {k: v for k, v in LLAMA.items() if k != key}
    one_line_error(cfg, key)


@pytest.mark.parametrize("key, value", [
    ("hidden_size", "4096"), ("hidden_size", 4096.0), ("hidden_size", 0), ("hidden_size", -1),
    ("hidden_size", True), ("num_attention_heads", [32]), ("num_key_value_heads", 0),
    ("num_key_value_heads", 5), ("num_key_value_heads", 64), ("vocab_size", "128256"),
    ("num_hidden_layers", -3), ("intermediate_size", {"a": 1}), ("head_dim", "128"), ("head_dim", 0),
    ("tie_word_embeddings", "yes"), ("rope_theta", "big"), ("rms_norm_eps", [1e-6]),
    ("num_local_experts", -1), ("num_local_experts", "8"), ("moe_intermediate_size", -5),
])
def test_wrong_types_and_values(key, value):
    one_line_error({**LLAMA, key: value})


@pytest.mark.parametrize("key", ["vocab_size", "hidden_size", "intermediate_size", "num_attention_heads",
                                 "head_dim", "num_local_experts"])
@pytest.mark.parametrize("value", [2**40, 2**62, 10**30])
def test_huge_values_are_refused_cleanly(key, value):
    one_line_error({**LLAMA, key: value,
                    **({"num_key_value_heads": value} if key == "num_attention_heads" else {})})


@pytest.mark.parametrize("cfg", [None, [], [LLAMA], "config", 3, 2.5])
def test_not_an_object(cfg):
    one_line_error(cfg, "JSON object")


def test_heterogeneous_block_configs_refused():
    one_line_error({**LLAMA, "block_configs": [{}]}, "block_configs")


@pytest.mark.parametrize("experts", [0, 8])
def test_huge_layer_count_fails_fast(experts):
    """num_hidden_layers=2**40 must be refused at once, with or without experts (run in a child with a memory
    cap and a time limit, so a layer loop over 2**40 layers cannot take the test machine down)."""
    cfg = {**LLAMA, "num_hidden_layers": 2**40, "num_local_experts": experts, "model_type": "mixtral"}
    code = ("import sys, json\nfrom tpviz.config.normalize import normalize\ntry:\n    "
            "normalize(json.loads(sys.argv[1]))\nexcept ValueError as e:\n    print('ValueError:', e)\n")

    def cap():  # 3 GiB of address space: plenty for Python + torch, far below the machine's memory
        resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))

    try:
        out = subprocess.run([sys.executable, "-c", code, json.dumps(cfg)], capture_output=True, text=True,
                             timeout=5, preexec_fn=cap, cwd=ROOT)
    except subprocess.TimeoutExpired:
        pytest.fail("normalize() did not finish within 5 s for num_hidden_layers=2**40, "
                    f"num_local_experts={experts}")
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr[-500:]
    assert out.stdout.startswith("ValueError: num_hidden_layers="), out.stdout


@pytest.mark.parametrize("key, value", [("vocab_size", (1 << 20) + 1), ("hidden_size", (1 << 17) + 64),
                                        ("num_local_experts", (1 << 14) + 1),
                                        ("num_hidden_layers", (1 << 12) + 1),
                                        ("intermediate_size", (1 << 19) + 1)])
def test_implausible_sizes_are_refused_naming_the_limit(key, value):
    cfg = ({**LLAMA, key: value, "num_experts_per_tok": 1, "moe_intermediate_size": 64}
           if "experts" in key else {
        **LLAMA, key: value})
    with pytest.raises(ConfigError) as e:
        normalize(cfg)
    assert "is larger than" in str(e.value) and "real model config" in str(e.value)


def test_a_config_at_the_limits_maps_quickly():
    """The bounded cost the limits buy: vocab and MLP at their limits map in well under two seconds."""
    import time
    from tpviz import shard_map
    cfg = {**LLAMA, "vocab_size": 1 << 20, "intermediate_size": 1 << 19, "num_hidden_layers": 2}
    t = time.perf_counter()
    shard_map(cfg, 8)
    assert time.perf_counter() - t < 4  # measured ~0.6 s on 2 cores; the margin covers a busy CI machine

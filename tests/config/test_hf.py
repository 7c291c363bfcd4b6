"""tpviz.config.hf: configs read through transformers' config classes, as vLLM reads them (attribute maps and
the classes' defaults), from JSON alone; tpviz's own readers for what has no class; refusals and
dimensions."""
import json
import os
import subprocess
import sys

import pytest

import tpviz
from tpviz.archs import REGISTRY
from tpviz.config import hf
from tpviz.config.hf import config_class, through_transformers
from tpviz.config.sources import presets
from tpviz.config.normalize import normalize
from tpviz.errors import ConfigError, MissingFieldError
from tpviz.trace.checkpoint import compare

# bigscience/bloom's config.json as published (transformers 4.21 wrote it): `n_embed`, not hidden_size
BLOOM = {"apply_residual_connection_post_layernorm": False, "attention_dropout": 0.0,
         "architectures": ["BloomForCausalLM"], "attention_softmax_in_fp32": True, "pad_token_id": 3,
         "bos_token_id": 1, "eos_token_id": 2, "hidden_dropout": 0.0, "initializer_range": 0.02,
         "layer_norm_epsilon": 1e-05, "masked_softmax_fusion": True, "model_type": "bloom", "n_embed": 14336,
         "n_layer": 70, "num_attention_heads": 112, "pretraining_tp": 4, "slow_but_exact": False,
         "transformers_version": "4.21.0", "use_cache": True, "vocab_size": 250880}
BLOOM_TOTAL = 352494542848  # its model.safetensors.index.json's metadata.total_size


def bloom_names() -> set[str]:
    """bigscience/bloom's tensor names, as its model.safetensors.index.json lists them (h.N.*, no prefix)."""
    layer = ["input_layernorm.bias", "input_layernorm.weight", "mlp.dense_4h_to_h.bias",
             "mlp.dense_4h_to_h.weight",
             "mlp.dense_h_to_4h.bias", "mlp.dense_h_to_4h.weight", "post_attention_layernorm.bias",
             "post_attention_layernorm.weight", "self_attention.dense.bias", "self_attention.dense.weight",
             "self_attention.query_key_value.bias", "self_attention.query_key_value.weight"]
    return {f"h.{i}.{n}" for i in range(70) for n in layer} | {
        "word_embeddings.weight", "word_embeddings_layernorm.bias",
        "word_embeddings_layernorm.weight", "ln_f.bias", "ln_f.weight"}


def test_the_published_bloom_config_maps_and_matches_its_checkpoint():
    """BLOOM-176B stores n_embed, which BloomConfig reads as hidden_size (tpviz once refused it)."""
    m = tpviz.shard_map(BLOOM, 8)
    assert (m.model.hidden_size, m.model.num_hidden_layers, m.model.tie_word_embeddings) == (14336, 70, True)
    check = compare(m, bloom_names(), "bigscience/bloom")
    assert check["verified"] and check["matched"] == 845
    assert abs(m.total_weight_bytes - BLOOM_TOTAL) / BLOOM_TOTAL < 0.01  # bf16, as its index counts it


def test_gpt2_without_n_positions_takes_the_class_default():
    gpt2 = {k: v for k, v in presets()["openai-community/gpt2"].items() if k != "n_positions"}
    spec = normalize(gpt2)
    assert spec.max_positions == 1024 and spec.max_model_len == 1024  # GPT2Config's n_positions
    assert tpviz.shard_map(gpt2, 4).tensor("wpe.weight").shape == [1024, 768]


@pytest.mark.parametrize("cfg, read", [
    # Mistral without sliding_window: MistralConfig's 4096, as vLLM serves it (every layer windowed)
    ({**presets()["mistralai/Mistral-7B-Instruct-v0.3"], "sliding_window": None},
     lambda s: s.layers[0].mixer.window == 0),
    ({k: v for k, v in presets()["mistralai/Mistral-7B-Instruct-v0.3"].items() if k != "sliding_window"},
     lambda s: {x.mixer.window for x in s.layers} == {4096}),
    # Falcon without max_position_embeddings: FalconConfig's 2048 is its max_model_len
    (presets()["tiiuae/falcon-7b"], lambda s: s.max_model_len == 2048),
    # Gemma without tie_word_embeddings: GemmaConfig ties them
    ({k: v for k, v in presets()["google/gemma-2-9b-it"].items() if k != "tie_word_embeddings"},
     lambda s: s.tie_word_embeddings),
])
def test_a_default_tpviz_takes_from_the_config_class(cfg, read):
    assert read(normalize(cfg))


def test_a_class_default_vllm_cannot_run_is_refused_as_it_would_be():
    """Qwen2Config's num_key_value_heads is 32 when a config leaves it out: 28 heads cannot group into 32."""
    qwen = {k: v for k, v in presets()["Qwen/Qwen2.5-7B-Instruct"].items() if k != "num_key_value_heads"}
    assert config_class("qwen2")().num_key_value_heads == 32
    with pytest.raises(ConfigError,
                       match="num_attention_heads=28 is not a multiple of num_key_value_heads=32"):
        normalize(qwen)


def test_dimensions_are_never_taken_from_a_class_default():
    """LlamaConfig would give a config without hidden_size 4096 and draw another model: refused, naming it."""
    llama = {k: v for k, v in presets()["meta-llama/Llama-2-7b-hf"].items() if k != "hidden_size"}
    with pytest.raises(MissingFieldError) as e:
        normalize(llama)
    assert e.value.field == "hidden_size"
    # before the class
    with pytest.raises(ConfigError, match="num_hidden_layers=1099511627776 is larger than"):
        normalize({**presets()["meta-llama/Llama-2-7b-hf"], "num_hidden_layers": 2**40})


def test_what_transformers_has_no_class_for_is_read_as_given():
    assert config_class("chatglm") is None and config_class(None) is None
    cfg = {"model_type": "chatglm", "hidden_size": 64}
    assert through_transformers(cfg) == (cfg, None)
    assert all(config_class(t) is None for t in ("nemotron-nas", "no_such_arch"))
    assert REGISTRY["chatglm"].known  # read by tpviz's own record


def test_a_config_the_class_refuses_is_read_as_given_and_said():
    """The class's words in one note: vLLM reads it only through the checkpoint's own config code."""
    spec = normalize({**presets()["meta-llama/Llama-2-7b-hf"], "torch_dtype": "torch.float16"})
    assert spec.dtype == "float16"
    note, = [n for n in spec.notes if "LlamaConfig" in n]
    assert "refuses it" in note and "read as given" in note and "\n" not in note


def test_the_reading_never_runs_code_and_leaves_the_input_alone():
    cfg = {**presets()["Qwen/Qwen3-0.6B"], "auto_map": {"AutoConfig": "evil.EvilConfig"}}
    before = dict(cfg)
    read, refusal = through_transformers(cfg)
    assert refusal is None and read["hidden_size"] == 1024 and cfg == before  # transformers' own Qwen3Config
    read["hidden_size"] = 1
    assert through_transformers(cfg)[0]["hidden_size"] == 1024  # a cached reading is handed out as a copy


READ_TWICE = """
import json, sys
from tpviz import load_spec
spec = load_spec("Qwen/Qwen3-8B")
print(json.dumps({"transformers": "transformers" in sys.modules, "spec": spec.to_dict()}))
"""


def test_a_config_read_once_is_read_back_without_transformers(tmp_path):
    """Importing transformers' config classes costs seconds: the second process reads the stored reading."""
    env = {**os.environ, "TPVIZ_CACHE": str(tmp_path)}
    runs = [json.loads(subprocess.run([sys.executable, "-c", READ_TWICE], env=env, check=True,
                                      capture_output=True, text=True).stdout) for _ in range(2)]
    assert [r["transformers"] for r in runs] == [True, False]
    assert runs[0]["spec"] == runs[1]["spec"]
    stored, = (tmp_path / "configs").glob("*.json")
    assert set(json.loads(stored.read_text())) == {"read", "refusal"}


def test_a_damaged_or_unwritable_store_reads_afresh(tmp_path, monkeypatch):
    cfg = presets()["openai-community/gpt2"]
    monkeypatch.setenv("TPVIZ_CACHE", str(tmp_path))
    hf._read.cache_clear()
    first = through_transformers(cfg)[0]
    stored, = (tmp_path / "configs").glob("*.json")
    stored.write_text("{not json")  # a torn write, a disk error
    hf._read.cache_clear()
    assert through_transformers(cfg)[0] == first and json.loads(stored.read_text())["read"] == first
    monkeypatch.setenv("TPVIZ_CACHE", str(tmp_path / "file"))
    (tmp_path / "file").write_text("")  # the cache folder cannot be made: read, not kept, no error
    hf._read.cache_clear()
    assert through_transformers(cfg)[0] == first
    hf._read.cache_clear()

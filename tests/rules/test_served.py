"""Architectures as vLLM 0.33's model registry serves them: a class it retired is refused naming the last
version that served it, a class it builds with its own model file is never drawn as a Llama, a class it builds
as LlamaForCausalLM is, and a class tpviz has a record for is mapped by that record whatever the
model_type."""
import pytest

from tpviz import load_spec, shard_map
from tpviz.errors import ConfigError
from tpviz.rules.served import registry, retired_in, unserved
from tpviz.trace.validity import split_problem
from tests.helpers.errors import one_line

TINY = {"hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128,
        "vocab_size": 128, "num_hidden_layers": 2}


def custom(model_type: str, cls: str) -> dict:
    return {**TINY, "model_type": model_type, "architectures": [cls]}


def test_the_registry_is_vllm_0_33s():
    reg = registry()
    assert reg["version"] == "0.33.0" and reg["retired"]["QWenLMHeadModel"] == "0.23.0"
    assert reg["models"]["DeepseekV3ForCausalLM"] == ["deepseek_v2", "DeepseekV3ForCausalLM"]
    assert reg["models"]["PhiForCausalLM"] == ["transformers", "TransformersForCausalLM"]
    assert reg["models"]["InternLM3ForCausalLM"] == ["llama", "LlamaForCausalLM"]
    assert retired_in("MPTForCausalLM", "0.33.0") == "0.28.0"
    assert retired_in("MPTForCausalLM", "0.28.0") is None


@pytest.mark.parametrize("model_type, cls, said", [
    ("qwen", "QWenLMHeadModel", "vLLM served QWenLMHeadModel until 0.23.0"),
    ("baichuan", "BaichuanForCausalLM", "vLLM served BaichuanForCausalLM until 0.23.0"),
    ("minimax_text_01_x", "MiniMaxText01ForCausalLM", "until 0.23.0"),
    ("granitemoeshared", "GraniteMoeSharedForCausalLM", "models/granitemoeshared.py"),
    ("cohere2_moe", "Cohere2MoeForCausalLM", "own model file (models/cohere2_moe.py)"),
    ("mellum", "MellumForCausalLM", "through its Transformers backend"),
    ("h2ovl_chat", "H2OVLChatModel", "own model file (models/h2ovl.py)")])
def test_an_unknown_type_vllm_serves_otherwise_is_refused_never_drawn_as_llama(model_type, cls, said):
    with pytest.raises(ConfigError) as e:
        shard_map(custom(model_type, cls), 2)
    assert one_line(e.value) and said in str(e.value) and repr(model_type) in str(e.value)


def test_a_class_vllm_builds_as_llama_is_mapped_as_llama():
    m = shard_map(custom("internlm3", "InternLM3ForCausalLM"), 2)
    assert m.tensor("model.layers.*.self_attn.q_proj.weight").layer_class == "QKVParallelLinear"
    assert unserved("InternLM3ForCausalLM") is None and unserved("") is None


def test_a_class_tpviz_has_a_record_for_is_mapped_by_it():
    """Kimi-K2 (model_type kimi_k2) is DeepseekV3ForCausalLM to vLLM: shared_experts, as DeepSeek-V3."""
    cfg = {**load_spec("deepseek-ai/DeepSeek-V3").config, "model_type": "kimi_k2"}
    m = shard_map(cfg, 8)
    names = {t.name for t in m.tensors}
    assert "model.layers.*.mlp.shared_experts.down_proj.weight" in names
    assert not any(".shared_expert." in n for n in names)
    assert m.model.model_type == "deepseek_v3" and any("kimi_k2" in n for n in m.model.notes)


def test_a_retired_class_under_a_known_type_is_refused_by_the_release_that_retired_it():
    """Old Falcon checkpoints name RWForCausalLM, which vLLM served until 0.28.0."""
    cfg = {**TINY, "model_type": "falcon", "architectures": ["RWForCausalLM"], "num_key_value_heads": 4}
    problem, _ = split_problem(load_spec(cfg), 2, "vllm")
    assert problem == 'vLLM served RWForCausalLM until 0.28.0; vLLM 0.33 refuses it ("not supported anymore")'
    assert split_problem(load_spec(cfg), 2, "vllm-0.28")[0] is None
    assert split_problem(load_spec({**cfg, "architectures": ["FalconForCausalLM"]}), 2, "vllm")[0] is None


def test_a_nested_custom_config_says_where_its_decoder_is():
    """DeepSeek-VL2's language_config: vLLM reads it through its own config class, tpviz does not."""
    with pytest.raises(ConfigError) as e:
        load_spec({"model_type": "custom_vl", "language_config": TINY, "vision_config": {"hidden_size": 32}})
    assert one_line(e.value) and "its text decoder is in 'language_config'" in str(e.value)
    assert "missing" not in str(e.value)


def test_llm_config_is_read_as_text_config_and_the_tower_named_as_left_out():
    """An InternVL-style llm_config (H2OVL's): vLLM 0.33 renames it text_config for every config
    (_CONFIG_ATTRS_MAPPING), so its decoder maps, and the note names the tower and projector it leaves out
    (InternVL's own tower is mapped: tests/plan/test_tower_intern.py)."""
    spec = load_spec({"architectures": ["H2OVLChatModel"], "model_type": "h2ovl_chat",
                      "llm_config": {**TINY, "model_type": "qwen2"}, "vision_config": {"hidden_size": 32}})
    assert spec.model_type == "qwen2" and spec.tower is None
    assert any("only the text decoder is mapped; the vision tower" in n for n in spec.notes)

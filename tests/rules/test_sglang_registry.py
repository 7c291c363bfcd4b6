"""SGLang 0.5.23's model registry (sglang_registry.json): a class it has no model file for falls back to its
Transformers backend, which tpviz does not model under SGLang rules: refused in one line, never drawn with
another file's groups."""
import importlib.util

import pytest

from tpviz import load_spec, shard_map
from tpviz.config.sources import presets
from tpviz.errors import TpvizError
from tpviz.rules import Layout, ruleset
from tpviz.rules.served import architecture
from tpviz.rules.sglang_files import native_classes, transformers_served
from tests.paths import ROOT

SGL = ruleset("sglang")
FALLBACK = ["llava-hf/llava-v1.6-mistral-7b-hf", "OpenGVLab/InternVL3-1B-hf",
            "llava-hf/llava-onevision-qwen2-7b-ov-hf"]


@pytest.mark.parametrize("model", FALLBACK)
def test_a_class_sglang_serves_through_transformers_is_refused_in_one_line(model):
    spec = load_spec(model)
    problem = SGL.layout_problem(Layout(2), spec)
    assert problem.startswith(f"SGLang 0.5.23's model registry has no {architecture(spec.config)}, so SGLang "
                              "would try its Transformers backend")
    assert problem.endswith("choose vLLM rules for it") and "\n" not in problem
    with pytest.raises(TpvizError, match="model registry has no"):
        shard_map(spec, 2, rules="sglang")
    assert shard_map(spec, 2).tensors  # vLLM serves it with its own files


def test_every_preset_sglang_maps_is_a_class_it_builds_natively():
    mapped = []
    for name in presets():
        spec = load_spec(name)
        try:
            shard_map(spec, 1, rules="sglang")
        except TpvizError:
            continue
        mapped.append(name)
        assert architecture(spec.config) in native_classes(), name
    assert len(mapped) > 30 and "Qwen/Qwen3-VL-235B-A22B-Instruct" in mapped


def test_a_config_naming_no_class_is_read_by_its_model_type_and_any_native_entry_wins():
    cfg = {"model_type": "llama", "hidden_size": 512, "intermediate_size": 1024, "num_attention_heads": 8,
           "num_key_value_heads": 8, "num_hidden_layers": 2, "vocab_size": 32000}
    assert shard_map(load_spec(cfg), 2, rules="sglang").tensors
    odd = {**cfg, "architectures": ["MyLlamaForCausalLM"]}
    with pytest.raises(TpvizError, match="model registry has no MyLlamaForCausalLM"):
        shard_map(load_spec(odd), 2, rules="sglang")
    both = {**cfg, "architectures": ["MyLlamaForCausalLM", "LlamaForCausalLM"]}  # SGLang takes the native
    assert shard_map(load_spec(both), 2, rules="sglang").tensors
    # SGLang has no falcon file: the registry's reason, before the groups tpviz has not read
    assert "registry has no FalconForCausalLM" in SGL.layout_problem(Layout(2), load_spec("tiiuae/falcon-7b"))
    # a class SGLang has a file for, whose groups tpviz has not read, says that
    with pytest.raises(TpvizError, match="tpviz does not model SGLang 0.5.23's phi3 model file"):
        SGL.layout_problem(Layout(2), load_spec("microsoft/Phi-3-mini-128k-instruct"))
    # DeepSeek-VL2's config class renames its class to one SGLang builds: not the Transformers backend
    vl2 = {"model_type": "deepseek_vl_v2", "architectures": ["DeepseekVLV2ForCausalLM"]}
    assert transformers_served(vl2) is None
    assert transformers_served({**vl2, "model_type": "other"}) == "DeepseekVLV2ForCausalLM"


def test_the_registry_reader_takes_each_entry_class_by_its_own_name():
    path = ROOT / "scripts" / "sglang_registry.py"
    module = importlib.util.module_from_spec(importlib.util.spec_from_file_location("sglang_registry", path))
    module.__spec__.loader.exec_module(module)
    source = ("from x import Foo as Bar, Baz\nclass A: pass\n_is_npu = False\n"
              "EntryClass = [A, Bar] if not _is_npu else [Baz]\n")
    assert module.entry_classes(source) == {"A", "Foo", "Baz"}
    assert module.entry_classes("EntryClass = Qwen3ForCausalLM\n") == {"Qwen3ForCausalLM"}
    assert module.entry_classes("x = 1\n") == set()
    config = ('class VL2Config:\n    model_type = "deepseek_vl_v2"\n    def __init__(self):\n'
              '        self.architectures = ["DeepseekVL2ForCausalLM"]\n'
              '        self.text_config.architectures = ["X"]\n')  # a nested config's: not the model's
    assert module.renames(config) == {"deepseek_vl_v2": ["DeepseekVL2ForCausalLM"]}

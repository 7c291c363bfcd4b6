"""The architecture registry: one record per model_type, and what every stage derives from it agrees.

For every architecture tpviz maps, the shard map's checkpoint names are exactly the plan's tensors (the list
Run live writes for random weights and the explorer compares checkpoints with); for every one Run live runs,
the plan's loading map lands every tensor on a parameter of the live model and fills every parameter."""
import json

import pytest
import torch

from tests.paths import SHARED_CONFIGS
from tpviz import shard_map
from tpviz.archs import REGISTRY, arch_of, known_types
from tpviz.config.sources import load_spec, presets
from tpviz.live.load.source import live_config
from tpviz.live.load.targets import LoadingMap
from tpviz.live.model.causal_lm import LiveForCausalLM
from tpviz.live.model.config import live_types
from tpviz.plan import build_plan
from tpviz.plan.tensors import tensors
from tpviz.trace.checkpoint import expand

# architectures no preset or shared config has, as a sibling's config retyped (and what the retyping needs)
SIBLINGS = {"deepseek_v2": ("deepseek-ai/DeepSeek-V3", {"topk_method": "greedy", "scoring_func": "softmax"}),
            "qwen3_5_moe_text": ("Qwen/Qwen3-30B-A3B", {"layer_types": None})}
# the Transformers backend's decoders with no preset (archs/backend.py): a Llama, or Qwen3-MoE's experts at
# intermediate_size (their transformers classes have no moe_intermediate_size)
SIBLINGS |= {t: ("meta-llama/Llama-3.2-1B", {}) for t in ("cwm",)}
SIBLINGS |= {t: ("Qwen/Qwen3-30B-A3B", {"moe_intermediate_size": None, "intermediate_size": 768})
             for t in ("hunyuan_v1_moe",)}
# GLM-5 (no preset): DeepSeek-V3.2's config under its own class
SIBLINGS["glm_moe_dsa"] = ("deepseek-ai/DeepSeek-V3.2", {"architectures": ["GlmMoeDsaForCausalLM"]})
# Step-3's decoder (no preset: no release config found), retyped
SIBLINGS["step3_text"] = ("Qwen/Qwen3-30B-A3B", {"architectures": ["Step3TextForCausalLM"],
                                                 "moe_layers_enum": "1,2"})
SIBLINGS["qwen2_5_omni_text"] = ("Qwen/Qwen2.5-7B-Instruct", {})  # Qwen2.5-Omni's thinker decoder: a Qwen2
SIBLINGS["minicpmv_2_5_text"] = ("meta-llama/Llama-3.2-1B", {})  # MiniCPM-V 2.5's decoder (archs/vision.py)
# DeepSeek-OCR's preset reads as a deepseek_v2 decoder of plain attention, which the live model refuses (it
# runs DeepSeek with MLA alone): the retyped DeepSeek-V3 stands for deepseek_v2 still
OVER_PRESETS = ("deepseek_v2",)
SMALL = dict(num_hidden_layers=3, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
             intermediate_size=96, vocab_size=1000)


def configs() -> dict[str, dict]:
    """A config of every architecture tpviz maps: the presets', the shared ones', then siblings retyped."""
    out = {}
    shared = sorted(SHARED_CONFIGS.glob("*.json")) if SHARED_CONFIGS.is_dir() else []
    sources = [*presets().values(), *(json.loads(p.read_text()) for p in shared
                                      if not p.name.endswith(".index.json"))]
    for cfg in sources:
        out.setdefault(load_spec(cfg).model_type, cfg)
    for model_type, (sibling, extra) in SIBLINGS.items():
        if model_type not in out or model_type in OVER_PRESETS:
            raw = presets()[sibling]
            raw = {**raw.get("text_config", {}), **{k: v for k, v in raw.items() if k != "text_config"}}
            out[model_type] = {**raw, **extra, "model_type": model_type}
    return out


def test_one_record_per_model_type():
    assert all(model_type == a.model_type for model_type, a in REGISTRY.items())
    unknown = arch_of("no_such_arch")
    assert not unknown.known and unknown.names == arch_of("llama").names  # read as a Llama-like decoder
    assert all(not a.known and a.refused for a in REGISTRY.values() if a.refused)


@pytest.mark.parametrize("model_type", known_types())
def test_the_map_names_exactly_the_plans_tensors(model_type):
    cfg = configs().get(model_type)
    if cfg is None:  # a multimodal wrapper: its configs read as their text decoder's model_type
        assert REGISTRY[model_type].text_model or REGISTRY[model_type].decoder, model_type
        return
    spec = load_spec(cfg)
    plan_names = {t.name for t in tensors(build_plan(spec))}
    m = shard_map(spec, 1)
    assert set(expand(m)) == plan_names
    assert shard_map(spec, 1, tensor_names=plan_names).checkpoint["verified"]


@pytest.mark.parametrize("model_type", live_types())
def test_the_loading_map_fills_every_live_parameter(model_type):
    cfg = {**(configs().get(model_type) or configs()[REGISTRY[model_type].text_model]), **SMALL}
    cfg.pop("quantization_config", None)
    if isinstance(cfg.get("layer_types"), list):  # one kind per layer kept (OLMo-3's sliding and full)
        cfg["layer_types"] = cfg["layer_types"][-SMALL["num_hidden_layers"]:]
    spec = load_spec(cfg)
    live = live_config(spec)
    with torch.device("meta"):
        params = set(dict(LiveForCausalLM(live, 1, 0).named_parameters()))
    targets = LoadingMap(live.spec)
    loaded = {targets.target(t.name)[0] for t in tensors(build_plan(live.spec))}
    tied = {"lm_head.weight"} if live.spec.tie_word_embeddings else set()
    assert loaded == params - tied, (model_type, sorted(loaded ^ (params - tied))[:6])

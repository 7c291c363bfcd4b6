"""Checks on tpviz/config/presets.json: shape, required entries, and agreement with real configs."""

import json
from pathlib import Path

import pytest
from tests.paths import ROOT, SHARED_CONFIGS

PRESETS_PATH = ROOT / "tpviz" / "config" / "presets.json"

REQUIRED = [
    "meta-llama/Llama-3.1-8B",
    "meta-llama/Llama-3.1-70B",
    "meta-llama/Llama-3.1-405B",
    "meta-llama/Llama-3.2-1B",
    "Qwen/Qwen3-0.6B",
    "Qwen/Qwen3-8B",
    "Qwen/Qwen3-32B",
    "Qwen/Qwen3-30B-A3B",
    "Qwen/Qwen2.5-7B-Instruct",
    "mistralai/Mistral-7B-Instruct-v0.3",
    "mistralai/Mixtral-8x7B-v0.1",
    "google/gemma-2-9b-it",
    "microsoft/Phi-3-mini-128k-instruct",
    "openai/gpt-oss-20b",
    "deepseek-ai/DeepSeek-V3",
    "Qwen/Qwen2.5-0.5B",
    "TinyLlama/TinyLlama-1.1B-Chat-v1.0",
    "meta-llama/Llama-2-7b-hf",
    "01-ai/Yi-6B-Chat",
    "Qwen/Qwen1.5-MoE-A2.7B",
    "google/gemma-3-27b-it",
]

# Shared files whose name is not the preset's repo id (older repo name, or the
# Instruct sibling, which has identical architecture numbers).
SHARED_NAME = {
    "meta-llama/Llama-3.1-8B": "meta-llama__Meta-Llama-3.1-8B.json",
    "meta-llama/Llama-3.1-70B": "meta-llama__Meta-Llama-3.1-70B.json",
    "meta-llama/Llama-3.2-1B": "meta-llama__Llama-3.2-1B-Instruct.json",
}

ARCH_KEYS = [
    "model_type",
    "hidden_size",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "intermediate_size",
    "vocab_size",
    "num_hidden_layers",
    "tie_word_embeddings",
    "attention_bias",
    "num_local_experts",
    "num_experts",
    "num_experts_per_tok",
    "n_routed_experts",
    "n_shared_experts",
    "moe_intermediate_size",
    "first_k_dense_replace",
    "decoder_sparse_step",
    "mlp_only_layers",
    "shared_expert_intermediate_size",
    "q_lora_rank",
    "kv_lora_rank",
    "qk_nope_head_dim",
    "qk_rope_head_dim",
    "v_head_dim",
]


def load_presets() -> dict:
    """Parse presets.json."""
    return json.loads(PRESETS_PATH.read_text(encoding="utf-8"))


def text_part(cfg: dict) -> dict:
    """The dict holding the language-model numbers (text_config for multimodal configs)."""
    return cfg.get("text_config", cfg)


def shared_file(repo_id: str) -> Path:
    """Path of the shared real config that corresponds to a preset."""
    name = SHARED_NAME.get(repo_id, repo_id.replace("/", "__") + ".json")
    return SHARED_CONFIGS / name


def test_file_parses_to_object_of_objects():
    presets = load_presets()
    assert isinstance(presets, dict)
    assert all(isinstance(v, dict) for v in presets.values())


def test_required_entries_present():
    presets = load_presets()
    assert len(presets) >= 15
    missing = [r for r in REQUIRED if r not in presets]
    assert not missing, missing


def test_every_preset_has_model_type_and_architectures():
    for repo, cfg in load_presets().items():
        assert isinstance(cfg.get("model_type"), str) and cfg["model_type"], repo
        assert isinstance(cfg.get("architectures"), list) and cfg["architectures"], repo


def test_keys_are_repo_ids():
    for repo in load_presets():
        owner, _, name = repo.partition("/")
        assert owner and name and "/" not in name, repo


@pytest.mark.parametrize("repo", REQUIRED)
def test_core_numbers_are_consistent(repo):
    cfg = text_part(load_presets()[repo])
    for key in ("hidden_size", "num_attention_heads", "intermediate_size", "vocab_size", "num_hidden_layers"):
        assert isinstance(cfg.get(key), int) and cfg[key] > 0, (repo, key)
    heads = cfg["num_attention_heads"]
    kv = cfg.get("num_key_value_heads", heads)
    assert heads % kv == 0, repo
    if "head_dim" not in cfg and "kv_lora_rank" not in cfg:
        assert cfg["hidden_size"] % heads == 0, repo


def test_moe_and_mla_presets_carry_their_keys():
    presets = load_presets()
    assert presets["mistralai/Mixtral-8x7B-v0.1"]["num_local_experts"] == 8
    assert presets["openai/gpt-oss-20b"]["num_local_experts"] == 32
    assert presets["Qwen/Qwen3-30B-A3B"]["num_experts"] == 128
    qmoe = presets["Qwen/Qwen1.5-MoE-A2.7B"]
    assert (qmoe["num_experts"], qmoe["moe_intermediate_size"], qmoe["shared_expert_intermediate_size"]) == (
        60,
        1408,
        5632,
    )
    ds = presets["deepseek-ai/DeepSeek-V3"]
    assert (ds["n_routed_experts"], ds["n_shared_experts"], ds["first_k_dense_replace"]) == (256, 1, 3)
    assert (ds["q_lora_rank"], ds["kv_lora_rank"], ds["qk_rope_head_dim"]) == (1536, 512, 64)


def test_gemma3_is_nested_like_the_real_config():
    cfg = load_presets()["google/gemma-3-27b-it"]
    assert cfg["model_type"] == "gemma3"
    assert "hidden_size" not in cfg
    text = cfg["text_config"]
    assert (text["hidden_size"], text["num_attention_heads"], text["num_key_value_heads"]) == (5376, 32, 16)
    assert (text["head_dim"], text["intermediate_size"], text["num_hidden_layers"]) == (128, 21504, 62)
    assert text["vocab_size"] == 262208


def test_gemma_omits_tie_word_embeddings():
    presets = load_presets()
    for repo in ("google/gemma-2-9b-it", "google/gemma-3-27b-it"):
        assert "tie_word_embeddings" not in text_part(presets[repo]), repo


def _with_shared() -> list[str]:
    """Presets that have a real config in /work/shared/configs (empty when shared is absent)."""
    if not SHARED_CONFIGS.is_dir():
        return []
    return [r for r in load_presets() if shared_file(r).is_file()]


def test_shared_configs_cover_some_presets():
    if not SHARED_CONFIGS.is_dir():
        pytest.skip("shared configs not available")
    assert len(_with_shared()) >= 10


@pytest.mark.parametrize("repo", _with_shared() or ["<no shared configs>"])
def test_architecture_keys_match_real_config(repo):
    if not SHARED_CONFIGS.is_dir() or repo == "<no shared configs>":
        pytest.skip("shared configs not available")
    preset = text_part(load_presets()[repo])
    real = text_part(json.loads(shared_file(repo).read_text(encoding="utf-8")))
    checked = [k for k in ARCH_KEYS if k in preset and k in real]
    assert len(checked) >= 6, (repo, checked)
    diffs = {k: (preset[k], real[k]) for k in checked if preset[k] != real[k]}
    assert not diffs, (repo, diffs)
    # A key the real config has must not be dropped, except a head_dim that equals
    # hidden/heads (re-saved copies write it out; the Hub original omits it).
    derivable = real.get("head_dim") == real["hidden_size"] // real["num_attention_heads"]
    dropped = [k for k in ARCH_KEYS if k in real and k not in preset and not (k == "head_dim" and derivable)]
    assert not dropped, (repo, dropped)

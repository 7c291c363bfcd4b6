"""Checkpoint comparison beyond a local folder's own names: unknown model types verified or refused, the real
indexes in ../shared, DeepSeek's MTP layer, and the hub index offline (fake HF cache)."""
import json
import time

import pytest

from tpviz import shard_map
from tpviz.trace.checkpoint import compare, expand
from tpviz.trace.model_map import hub_checkpoint, hub_tensor_names
from tpviz.errors import ConfigError
from tests.helpers.checkpoint import NAMES, TINY, check, folder, names_only
from tests.helpers.errors import one_line
from tests.helpers.hub import add_to_cache
from tests.paths import SHARED_CONFIGS


MYSTERY = {**TINY, "model_type": "mystery_lm"}


def test_unknown_model_type_verified_by_checkpoint(tmp_path):
    m = shard_map(MYSTERY, 1)  # nothing at hand: mapped as Llama-like, with a note saying so
    assert m.checkpoint is None and any("mapped as a Llama-like decoder" in n for n in m.model.notes)
    f = folder(tmp_path, NAMES | {"model.layers.0.self_attn.rotary_emb.inv_freq"}, MYSTERY)
    m = shard_map(str(f), 2)
    assert names_only(m.checkpoint) == check(f, tensors=22)
    notes = [n for n in m.model.notes if "mystery_lm" in n]
    assert (notes
            == ["model_type 'mystery_lm' is not one tpviz knows; mapped as a Llama-like "
                "decoder, and every tensor "
                     f"name was verified against {f.resolve()}"])
    m = shard_map(MYSTERY, 1, tensor_names=NAMES, checkpoint_source="org/mystery")
    assert m.checkpoint["verified"] and m.model.notes[-1].endswith("verified against org/mystery")


@pytest.mark.parametrize("names", [NAMES - {"model.layers.1.mlp.up_proj.weight"},
                                   NAMES | {"model.layers.0.mixer.A_log"},
                                   {"transformer.blocks.0.attn.Wqkv.weight", "transformer.wte.weight"}])
def test_unknown_model_type_not_matching_is_refused(tmp_path, names):
    f = folder(tmp_path, names, MYSTERY)
    with pytest.raises(ConfigError) as e:
        shard_map(str(f), 1)
    assert (one_line(e.value) and "'mystery_lm' is not one tpviz knows" in str(e.value)
            and "refusing" in str(e.value))
    with pytest.raises(ConfigError):
        shard_map(MYSTERY, 1, tensor_names=names)
    known = shard_map(TINY, 1, tensor_names=names)  # a known type is only reported, never refused
    assert known.checkpoint["verified"] is False


@pytest.mark.parametrize("extra", [{"mamba_d_state": 16}, {"layer_types": ["linear_attention"] * 2},
                                   {"attn_layer_period": 8}, {"ssm_cfg": {}}])
def test_unknown_hybrid_config_refused_even_with_matching_checkpoint(tmp_path, extra):
    f = folder(tmp_path, NAMES, {**MYSTERY, **extra})
    for source in (str(f), {**MYSTERY, **extra}):
        with pytest.raises(ConfigError) as e:
            shard_map(source, 1)
        assert one_line(e.value) and next(iter(extra)) in str(e.value)


REAL = ["google__gemma-2-9b-it", "microsoft__Phi-3-mini-128k-instruct", "mistralai__Mistral-7B-Instruct-v0.3"]


@pytest.mark.parametrize("stem", REAL)
def test_real_indexes_verify(stem, shared_configs, tmp_path):
    shared = SHARED_CONFIGS  # as tests/conftest.py finds it
    index = json.loads((shared / f"{stem}.index.json").read_text())
    names = set(index["weight_map"])
    m = shard_map(shared_configs[stem], 1, tensor_names=names, checkpoint_source=stem)
    real = {n for n in names if not n.endswith("rotary_emb.inv_freq")}
    assert names_only(m.checkpoint) == {"source": stem, "tensors": len(names),
                                        "matched": len(real), "prefix": "",
                            "missing_in_checkpoint": [], "missing_in_map": [],
                                        "quantization_tensors": 0, "verified": True}
    f = folder(tmp_path, None, shared_configs[stem])  # the same through a local folder holding config + index
    (f / "model.safetensors.index.json").write_text(json.dumps(index))
    assert names_only(shard_map(str(f), 2).checkpoint) == {**names_only(m.checkpoint),
                                                           "source": str(f.resolve())}


def test_deepseek_mtp_layer_ignored():
    m = shard_map("deepseek-ai/DeepSeek-V3", 1)
    names = set(expand(m))
    mtp = {n.replace("layers.60.", "layers.61.") for n in names if "layers.60." in n} | {
        "model.layers.61." + s for s in ("eh_proj.weight", "enorm.weight", "hnorm.weight",
                                         "shared_head.head.weight",
                                         "shared_head.norm.weight", "embed_tokens.weight")}
    assert compare(m, names | mtp, "ds")["verified"]


@pytest.mark.parametrize("buffer", ["transformer.rotary_pos_emb.inv_freq",  # ChatGLM / GLM
                                    "model.layers.0.self_attn.rotary_emb.cos_cached",
                                    "model.layers.0.self_attn.rotary_emb.sin_cached"])
def test_rotary_buffers_vllm_drops_are_not_mismatches(buffer):
    """vLLM 0.33's AutoWeightsLoader drops these four rotary buffers some checkpoints saved."""
    chatglm = {"model_type": "chatglm", "hidden_size": 256, "num_attention_heads": 8, "num_layers": 2,
               "multi_query_attention": True, "multi_query_group_num": 2, "ffn_hidden_size": 512,
               "padded_vocab_size": 1024, "kv_channels": 32}
    m = shard_map(chatglm, 2)
    result = compare(m, set(expand(m)) | {buffer}, "glm")
    assert result["verified"] and not result.get("extra"), result


def test_qwen3_5_moe_maps_its_shared_expert_gate():
    """Qwen3.5-MoE builds Qwen3-Next's MoE block: one [1, hidden] sigmoid gate per layer, replicated."""
    cfg = {"model_type": "qwen3_5_moe_text", "hidden_size": 64, "num_attention_heads": 4,
           "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 128, "num_hidden_layers": 4,
           "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
           "shared_expert_intermediate_size": 32, "full_attention_interval": 4, "linear_num_key_heads": 2,
           "linear_num_value_heads": 4, "linear_key_head_dim": 16, "linear_value_head_dim": 16,
           "linear_conv_kernel_dim": 4}
    gate = shard_map(cfg, 2).tensor("model.layers.*.mlp.shared_expert_gate.weight")
    assert (gate.shape, gate.split_dim, gate.layers) == ([1, 64], None, [0, 1, 2, 3])


# ---- hub index, offline
# ---------------------------------------------------------------------------------------------

@pytest.fixture
def offline_hub(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    for name in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    return tmp_path / "hf" / "hub"


def test_hub_offline_empty_cache_is_none_quickly(offline_hub):
    t = time.monotonic()
    assert hub_checkpoint("some-org/some-model") is None
    assert hub_tensor_names("some-org/some-model") is None
    assert time.monotonic() - t < 5


def test_hub_cached_index_gives_names(offline_hub, tmp_path):
    index = {"metadata": {"total_size": 1},
             "weight_map": {n: "model-00001-of-00001.safetensors" for n in NAMES}}
    add_to_cache(offline_hub, "some-org/cached-model", {"config.json": json.dumps(TINY),
                                                         "model.safetensors.index.json": json.dumps(index)})
    add_to_cache(offline_hub, "some-org/no-weight-map", {"model.safetensors.index.json": '{"metadata": {}}'})
    found = hub_checkpoint(" some-org/cached-model ", sizes=False)
    assert found.names == NAMES and found.source == "some-org/cached-model (model.safetensors.index.json)"
    m = shard_map("some-org/cached-model", 1, tensor_names=found.names, checkpoint_source=found.source)
    assert m.checkpoint["verified"] and m.checkpoint["matched"] == 21
    assert hub_tensor_names("some-org/no-weight-map") is None


def test_no_hub_checkpoint_for_other_sources(tmp_path):
    f = folder(tmp_path)
    for source in ("meta-llama/Llama-3.1-8B", "qwen/qwen3-8b", str(f), "./ckpt", TINY,
                   b"{}", "not a repo id"):
        assert hub_checkpoint(source) is None, source

"""Property-based tests: generated and mutated configs, random tp and rules. Each either gives a valid shard
map (checked with the coverage invariants of tests/conftest.py) or raises a ValueError with a one-line
message. Never another exception."""
import json
import os

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tpviz import shard_map
from tpviz.rules import RULES
from tpviz.config.sources import presets
from tpviz.archs import known_types
from tests.paths import SHARED_CONFIGS



def _bases() -> list[tuple[str, dict]]:
    bases = [(k, v) for k, v in presets().items()]
    if SHARED_CONFIGS.is_dir():
        bases += [(p.stem, json.loads(p.read_text(encoding="utf-8")))
                  for p in sorted(SHARED_CONFIGS.glob("*.json")) if not p.name.endswith(".index.json")]
    return bases


BASES = _bases()
LAYER_KEYS = ["num_hidden_layers", "n_layer", "num_layers"]
SIZE_KEYS = ["hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim", "intermediate_size",
             "vocab_size", "num_local_experts", "num_experts", "n_routed_experts", "moe_intermediate_size",
             "num_experts_per_tok", "first_k_dense_replace", "decoder_sparse_step", "moe_layer_freq",
             "shared_expert_intermediate_size", "n_shared_experts", "q_lora_rank", "kv_lora_rank",
             "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "n_embd", "n_head", "num_kv_heads",
             "ffn_hidden_size", "kv_channels", "multi_query_group_num", "padded_vocab_size", "n_inner",
             "num_heads", "d_model"]
OTHER_KEYS = ["model_type", "torch_dtype", "dtype", "tie_word_embeddings", "attention_bias", "multi_query",
              "multi_query_attention", "add_qkv_bias", "mlp_only_layers", "rope_theta", "rms_norm_eps",
              "layer_norm_epsilon", "text_config", "quantization_config", "hidden_act", "block_configs",
              "_name_or_path"]
ALL_KEYS = LAYER_KEYS + SIZE_KEYS + OTHER_KEYS

small_ints = st.integers(-3, 70)
sizes = st.sampled_from([0, 1, 2, 3, 4, 6, 7, 8, 12, 14, 16, 24, 32, 48, 64, 96, 100, 128,
                         768, 1000, 1024, 4096, 14336, 32000, 32064, 151936])
# beyond any real model: each must be refused at once. (Huge layer counts are tested on their own in
# test_spec.py::test_huge_layer_count_fails_fast, in a memory-capped child process.)
huge = st.sampled_from([2**26 + 1, 2**31, 2**40, 2**53, 2**62, 2**63, 10**30, -(2**63)])
junk = st.one_of(st.none(), st.booleans(), st.floats(allow_nan=True, allow_infinity=True),
                 st.text(max_size=6), st.lists(st.integers(-2, 40), max_size=4),
                 st.dictionaries(st.text(max_size=4), st.integers(),
                                                                            max_size=2))
model_types = st.sampled_from(sorted(known_types()) + ["unknown_arch", ""])
tps = st.one_of(st.sampled_from([1, 2, 4, 8, 16, 32, 64]), st.integers(1, 64))


@st.composite
def value_for(draw, key):
    if key in LAYER_KEYS:
        return draw(st.one_of(small_ints, st.sampled_from([0, 1, 2, 61, 126]), junk))
    if key in SIZE_KEYS:
        return draw(st.one_of(small_ints, sizes, huge, junk))
    if key == "model_type":
        return draw(st.one_of(model_types, junk))
    if key == "mlp_only_layers":
        return draw(st.one_of(st.lists(st.integers(-1, 70), max_size=5), junk))
    if key == "text_config":
        return draw(st.one_of(st.sampled_from([dict(c) for _, c in BASES[:6]]), junk))
    return draw(st.one_of(junk, small_ints, st.sampled_from(["bfloat16", "float32", "torch.float16", "fp8"])))


@st.composite
def mutated_configs(draw):
    name, base = draw(st.sampled_from(BASES))
    cfg = json.loads(json.dumps(base))
    target = cfg["text_config"] if isinstance(cfg.get("text_config"), dict) and draw(st.booleans()) else cfg
    for _ in range(draw(st.integers(1, 4))):
        present = sorted(set(target) & set(SIZE_KEYS + LAYER_KEYS))
        key = draw(st.sampled_from(present)) if present and draw(st.booleans()) else draw(
            st.sampled_from(sorted(set(target) | set(ALL_KEYS))))
        if draw(st.integers(0, 3)) == 0:
            target.pop(key, None)
        else:
            target[key] = draw(value_for(key))
    return cfg


@st.composite
def generated_configs(draw):
    """Plausible decoder configs from scratch, most of them mappable at some tp."""
    heads = draw(st.sampled_from([1, 2, 3, 4, 6, 8, 12, 16, 32, 64]))
    kv = draw(st.sampled_from([d for d in range(1, heads + 1) if heads % d == 0]))
    head_dim = draw(st.sampled_from([1, 2, 8, 16, 64, 128]))
    cfg = {"model_type": draw(model_types), "num_attention_heads": heads, "num_key_value_heads": kv,
           "hidden_size": draw(st.sampled_from([heads * head_dim, 64, 100, 4096])),
           "intermediate_size": draw(st.sampled_from([64, 96, 128, 1000, 14336])),
           "vocab_size": draw(st.one_of(st.sampled_from([64, 1000, 32000, 32064, 151936]),
                                        st.integers(1, 5000))),
           "num_hidden_layers": draw(st.integers(1, 8))}
    if draw(st.booleans()):
        cfg["head_dim"] = head_dim
    if draw(st.booleans()):
        cfg["tie_word_embeddings"] = draw(st.booleans())
    if draw(st.booleans()):
        cfg["attention_bias"] = draw(st.booleans())
    if draw(st.integers(0, 2)) == 0:
        cfg[draw(st.sampled_from(["num_local_experts", "num_experts",
                                  "n_routed_experts"]))] = draw(st.integers(1, 16))
        cfg["moe_intermediate_size"] = draw(st.sampled_from([16, 64, 96, 768]))
        if draw(st.booleans()):
            cfg["first_k_dense_replace"] = draw(st.integers(0, 3))
        if draw(st.booleans()):
            cfg["n_shared_experts"] = draw(st.integers(0, 2))
    if draw(st.integers(0, 4)) == 0:
        cfg.update(kv_lora_rank=draw(st.sampled_from([16, 512])), q_lora_rank=draw(st.sampled_from([0, 32])),
                   qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16)
    if draw(st.integers(0, 5)) == 0:
        cfg = {"model_type": "multimodal", "torch_dtype": "float16", "text_config": cfg}
    return cfg


@pytest.fixture(scope="module", autouse=True)
def offline():
    """Sources that look like hub ids must fail fast, never touch the network."""
    saved = {k: os.environ.get(k) for k in ("HF_HUB_OFFLINE", "TPVIZ_LOCAL_ROOT")}
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ.pop("TPVIZ_LOCAL_ROOT", None)
    yield
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def map_or_clear_error(source, tp, rules, invariants):
    """The property: a valid map satisfying the invariants, or one ValueError line. Returns the map or
    None."""
    try:
        m = shard_map(source, tp, rules)
    except ValueError as e:
        msg = str(e)
        assert msg.strip() and "\n" not in msg, repr(msg)
        assert "Traceback" not in msg
        return None
    invariants(m)
    json.dumps(m.to_dict())
    return m


SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


MIXTRAL = presets()["mistralai/Mixtral-8x7B-v0.1"]


@settings(max_examples=800, **SETTINGS)
@given(cfg=mutated_configs(), tp=tps, rules=st.sampled_from(RULES))
@example(cfg={**MIXTRAL, "moe_intermediate_size": 0}, tp=2, rules="vllm")
@example(cfg={**MIXTRAL, "vocab_size": 2**62}, tp=1, rules="vllm")
@example(cfg={**MIXTRAL, "intermediate_size": 2**62}, tp=8, rules="nano-vllm")
@example(cfg={**MIXTRAL, "num_local_experts": 0}, tp=8, rules="vllm")
def test_mutated_configs(cfg, tp, rules, shard_map_invariants):
    map_or_clear_error(cfg, tp, rules, shard_map_invariants)


@settings(max_examples=500, **SETTINGS)
@given(cfg=generated_configs(), tp=tps, rules=st.sampled_from(RULES))
def test_generated_configs(cfg, tp, rules, shard_map_invariants):
    m = map_or_clear_error(cfg, tp, rules, shard_map_invariants)
    # class defaults may leave no attention layer
    if m is None or m.model.is_mla or not m.model.attention_layers:
        return
    # KV head mapping by hand: rank r holds heads [r*kv/tp, ...) or, replicated, head r // (tp/kv)
    kv = m.model.num_key_value_heads
    expected = [[r // (tp // kv)] if tp > kv
                else list(range(r * kv // tp, (r + 1) * kv // tp)) for r in range(tp)]
    assert [r.kv_heads for r in m.ranks] == expected


@settings(max_examples=150, **SETTINGS)
@given(cfg=generated_configs(), data=st.data())
def test_generated_configs_as_uploaded_bytes(cfg, data, shard_map_invariants):
    """The same configs through the bytes path (uploads) behave the same as the dict path."""
    tp = data.draw(tps)
    via_dict = via_bytes = None
    try:
        via_dict = shard_map(cfg, tp).to_dict()
    except ValueError as e:
        via_dict = ("error", str(e))
    try:
        via_bytes = shard_map(json.dumps(cfg).encode(), tp).to_dict()
    except ValueError as e:
        via_bytes = ("error", str(e))
    if isinstance(via_dict, dict):
        via_dict["model"]["name"] = via_bytes["model"]["name"] = "x"
    assert via_dict == via_bytes


@settings(max_examples=300, **SETTINGS)
@given(source=st.one_of(st.text(max_size=30), st.binary(max_size=60), st.integers(), st.none(), st.floats(),
                        st.lists(st.integers(), max_size=3),
                        st.dictionaries(st.text(max_size=5), junk, max_size=4)),
       tp=st.one_of(tps, st.integers(-5, 0), st.sampled_from([2**40, 1.5, "4", None, True])),
       rules=st.one_of(st.sampled_from(RULES), st.text(max_size=8), st.none()))
def test_arbitrary_sources_tp_and_rules(source, tp, rules, shard_map_invariants):
    map_or_clear_error(source, tp, rules, shard_map_invariants)

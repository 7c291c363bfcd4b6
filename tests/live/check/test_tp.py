"""TP runs over spawned gloo ranks on CPU match tp=1: KV replication, vocabs not divisible by tp, tied
heads."""
import threading

import pytest

from tpviz import shard_map
from tpviz.live import verify
from tpviz.trace.collectives import collectives

from tests.live.conftest import FAMILIES

# KV heads are 2 (mistral: 1), so tp=4 (mistral: tp=2 already) replicates them; every vocab is odd
CASES = [(family, tp) for family in FAMILIES for tp in (2, 4) if (family, tp) != ("mistral", 4)]


@pytest.mark.slow
@pytest.mark.parametrize("family, tp", CASES, ids=[f"{f}-tp{t}" for f, t in CASES])
def test_tp_matches_tp1_fp32(tiny, family, tp):
    folder, hf_model = tiny[family]
    # qwen3 at tp=2 has no row-parallel bias and no replicated KV head: both injections must be no-ops, and
    # say so
    inject = ["bias-all-ranks", "wrong-kv-head"] if (family, tp) == ("qwen3", 2) else []
    result, logits = verify(folder, tp, device="cpu", seq_len=12, inject=inject, timeout=120)
    assert result.passed, result.summary()
    assert [n.split(":")[0] for n in result.notes if n.startswith("--inject")] == [
        f"--inject {name} has no effect here" for name in inject]
    assert result.max_abs_diff < 1e-4 and result.argmax_agreement == 1.0 and result.diverges_at is None
    vocab = hf_model.config.vocab_size
    assert vocab % tp and list(logits.shape) == [2, 12, vocab]  # padding trimmed after the gather
    assert [r.rank for r in result.ranks] == list(range(tp))
    cfg = hf_model.config
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    kv_local = max(1, cfg.num_key_value_heads // tp)  # replicated: one KV head per rank
    # the explorer's collectives table counts the all-reduces the ranks issued, and their size per token
    m = shard_map(str(folder), tp)
    table = [c for c in collectives(m) if c.op == "all-reduce"]
    values = sum(c.count * c.bytes_per_token // m.model_dtype_bytes for c in table)  # per token
    for r in result.ranks:
        reduced = r.collectives["all_reduce"]
        assert sum(c.count for c in table) == reduced["count"]
        assert values * 2 * 12 * 4 == reduced["bytes"]  # [2, 12] tokens, run in float32
        qkv = r.param_shapes["model.layers.0.self_attn.qkv_proj.weight"]
        assert qkv == [(cfg.num_attention_heads // tp + 2 * kv_local) * head_dim, cfg.hidden_size]
        # embedding all-reduce, then o_proj and down_proj per layer; one lm_head gather
        assert r.collectives["all_reduce"]["count"] == 1 + 2 * cfg.num_hidden_layers
        assert r.collectives["gather"]["count"] == 1
        assert 0 < r.bytes_read < r.checkpoint_bytes
    assert {"spawn", "load", "forward", "compare", "total"} <= set(result.phases)


@pytest.mark.slow
def test_bf16_is_judged_against_the_measured_noise_floor(tiny_config):
    result, _ = verify(tiny_config, 2, device="cpu", dtype="bfloat16", seq_len=16, timeout=120)
    assert result.passed, result.summary()
    assert result.noise_floor > 0 and result.tolerance == pytest.approx(4 * result.noise_floor)
    assert "noise floor" in result.tolerance_rule and all(d.floor is not None for d in result.layers)


@pytest.mark.slow
def test_two_concurrent_runs_do_not_collide(tiny_config):
    results, errors = [], []

    def run(seed):
        try:
            results.append(verify(tiny_config, 2, device="cpu", seq_len=8, seed=seed, timeout=120)[0])
        except Exception as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(s,)) for s in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(results) == 2 and all(r.passed for r in results)

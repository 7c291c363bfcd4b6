"""Every injected TP bug is detected and located where it has an effect, and called out where it has none."""
import pytest

from tpviz.live import verify
from tpviz.live.check.inject import describe_injections
from tpviz.live.load.source import resolve_model


def _effects(folder, tp):
    cfg = resolve_model(folder).cfg
    return {i.name: i for i in describe_injections(["bias-all-ranks", "skip-allreduce",
                                                    "wrong-kv-head"], cfg, tp)}


def test_injections_say_when_they_cannot_have_an_effect(tiny):
    qwen3 = _effects(tiny["qwen3"][0], 2)  # no row-parallel bias; 2 KV heads split evenly at tp=2
    assert (not qwen3["bias-all-ranks"].has_effect
            and "no row-parallel layer" in qwen3["bias-all-ranks"].reason)
    assert (not qwen3["wrong-kv-head"].has_effect
            and "no KV head is replicated" in qwen3["wrong-kv-head"].reason)
    assert qwen3["skip-allreduce"].has_effect
    mistral = _effects(tiny["mistral"][0], 4)  # a single KV head: every rank holds it either way
    assert not mistral["wrong-kv-head"].has_effect and "same one" in mistral["wrong-kv-head"].reason
    assert not any(i.has_effect for i in _effects(tiny["llama"][0], 1).values())  # tp=1: nothing to get wrong
    llama = _effects(tiny["llama"][0], 2)
    assert llama["bias-all-ranks"].has_effect and "o_proj and down_proj" in llama["bias-all-ranks"].reason


CASES = [("bias-all-ranks", "llama", 2), ("skip-allreduce", "qwen3", 2), ("wrong-kv-head", "qwen2", 4)]


@pytest.mark.slow
@pytest.mark.parametrize("inject, family, tp", CASES, ids=[c[0] for c in CASES])
def test_injected_bug_is_detected_and_located(tiny, inject, family, tp):
    result, _ = verify(tiny[family][0], tp, device="cpu", seq_len=12, inject=[inject], timeout=120)
    assert not result.passed and result.verdict == "MISMATCH"
    assert result.max_abs_diff > 100 * result.tolerance
    assert result.diverges_at == "layer 0"  # the first layer already differs
    assert result.layers[0].name == "embed" and not result.layers[0].exceeds
    assert [i.has_effect for i in result.injections] == [True]


@pytest.mark.slow
def test_bf16_still_catches_a_skipped_allreduce(tiny_config):
    result, _ = verify(tiny_config, 2, device="cpu", dtype="bfloat16", seq_len=16, inject=["skip-allreduce"],
                       timeout=120)
    assert not result.passed and result.max_abs_diff > 10 * result.noise_floor

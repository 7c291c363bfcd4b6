"""tpviz.trace.collectives: the collectives of a TP forward pass, per layer kind, under each rule set."""
from functools import lru_cache

import pytest

from tpviz import load_spec, shard_map as _shard_map
from tpviz.deploy.traffic import comm_per_token
from tpviz.rules import Layout
from tpviz.trace.collectives import collectives, norm_collectives
from tpviz.config.sources import presets

QWEN8, LLAMA8 = "Qwen/Qwen3-8B", "meta-llama/Llama-3.1-8B"


def padded_config(vocab: int = 32001) -> str:
    return f"vocab{vocab}"


@lru_cache(maxsize=None)
def shard_map(model: str, tp: int, rules: str = "vllm"):
    """Shard maps are read-only here, so tests share them; 'vocabN' is Llama-2-7B with vocab_size=N."""
    if model.startswith("vocab"):
        return _shard_map(dict(presets()["meta-llama/Llama-2-7b-hf"], vocab_size=int(model[5:])), tp, rules)
    return _shard_map(model, tp, rules)


def test_collectives_dense():
    """vLLM 0.33 all-gathers the logits (LogitsProcessor, Platform.use_all_gather on CUDA); nano-vllm's
    ParallelLMHead gathers them to GPU 0."""
    m = shard_map(QWEN8, 4)
    attn, mlp, embed, head = collectives(m)
    assert (attn.op, mlp.op, embed.op, head.op) == ("all-reduce", "all-reduce", "all-reduce", "all-gather")
    assert (attn.count, mlp.count, embed.count, head.count) == (36, 36, 1, 1)
    assert attn.bytes_per_token == 4096 * 2
    assert attn.sent_per_rank == pytest.approx(2 * 3 / 4 * 4096 * 2)  # ring all-reduce
    assert head.bytes_per_token == 151936 * 2 and head.sent_per_rank == pytest.approx(151936 * 2 * 3 / 4)
    assert attn.total_per_token == 36 * 8192
    nano = collectives(shard_map(QWEN8, 4, "nano-vllm"))[-1]
    assert nano.op == "gather" and nano.sent_per_rank == pytest.approx(151936 * 2 / 4)


def olmo2_config(**extra) -> dict:
    """An OLMo-2-7B-shaped config: q and k normed over all 32 heads."""
    return {"model_type": "olmo2", "architectures": ["Olmo2ForCausalLM"], "hidden_size": 4096,
            "num_attention_heads": 32, "num_key_value_heads": 32, "num_hidden_layers": 32,
            "intermediate_size": 11008,
            "vocab_size": 100352, "torch_dtype": "bfloat16", "max_position_embeddings": 4096, **extra}


def test_olmo_all_gathers_q_and_k_in_every_layer():
    """Each attention layer all-gathers q and k before their norms over all heads (vLLM 0.33's TP-aware
    RMSNorm): every GPU sends its (tp-1)/tp share of the whole projection."""
    m = _shard_map(load_spec(olmo2_config(num_key_value_heads=8), "olmo2-7b-gqa"), 4)
    q, k = [c for c in collectives(m) if c.op == "all-gather" and "norm" in c.where]
    assert (q.count, q.bytes_per_token, k.bytes_per_token) == (32, 4096 * 2, 8 * 128 * 2)
    assert (q.sent_per_rank == pytest.approx(4096 * 2 * 3 / 4)
            and k.sent_per_rank == pytest.approx(1024 * 2 * 3 / 4))
    assert not norm_collectives(load_spec(QWEN8), 4)  # Qwen3 norms each head: nothing to gather
    assert not norm_collectives(m.model, 1)


def test_collectives_moe_and_tp1():
    assert collectives(shard_map(QWEN8, 1)) == []
    moe = collectives(shard_map("Qwen/Qwen3-30B-A3B", 8))
    assert [c.count for c in moe] == [48, 48, 1, 1]  # one all-reduce per MoE layer (routed experts)
    ds = collectives(shard_map("deepseek-ai/DeepSeek-V3", 8))
    assert [c.count for c in ds] == [61, 61, 1, 1]  # 3 dense + 58 MoE layers
    padded = collectives(shard_map(padded_config(), 4))
    assert padded[-1].bytes_per_token == 32064 * 2  # the gather carries the padded vocabulary


@pytest.mark.parametrize("parallel, new, reduces", [(True, False, 1), (False, True, 1), (False, False, 2)])
def test_falcon_sums_attention_and_mlp_before_one_all_reduce(parallel, new, reduces):
    """vLLM 0.33 models/falcon.py: with parallel_attn or new_decoder_architecture the dense and MLP outputs
    are added and all-reduced once per layer (reduce_row_parallel_results = False); a serial Falcon reduces
    each."""
    cfg = dict(presets()["tiiuae/falcon-7b"], num_attention_heads=32, num_kv_heads=8, hidden_size=4096,
               parallel_attn=parallel, new_decoder_architecture=new, multi_query=False)
    m = _shard_map(cfg, 4)
    per_layer = sum(c.count for c in collectives(m)
                    if c.where.startswith(("after o_proj", "after down_proj")))
    assert per_layer == reduces * 32
    hidden = 4096 * 2
    assert comm_per_token(load_spec(cfg), Layout(4))["tp_all_reduce"] == pytest.approx(
        reduces * 32 * 2 * 3 / 4 * hidden)

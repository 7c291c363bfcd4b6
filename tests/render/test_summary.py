"""tpviz.render.summary: memory, collectives, valid tp, the three special cases, and the shareable view state."""
from functools import lru_cache

import pytest

from tpviz import load_spec, shard_map as _shard_map
from tpviz.render import summary as S
from tpviz.trace.validity import valid_table
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


def test_memory_rows_add_up_and_compare_with_naive():
    m = shard_map(LLAMA8, 16)
    rows = S.memory_rows(m)
    assert [r["rank"] for r in rows] == list(range(16))
    for r, info in zip(rows, m.ranks):
        assert sum(r[f] for f in S.families_present(m)) == r["weights"] == info.weight_bytes
        assert r["naive"] == pytest.approx(m.total_weight_bytes / 16)
        assert r["overhead"] > 0  # KV heads are copied to 2 GPUs each, replicated norms count on every GPU
        assert r["kv_per_token"] == 2 * r["kv_naive_per_token"]  # 8 KV heads on 16 GPUs: each head twice


def test_kv_cache_total_matches_tp1_and_mla():
    m = shard_map(QWEN8, 4)
    assert S.kv_cache_total_per_token(m) == 2 * 8 * 128 * 36 * 2
    assert m.ranks[0].kv_cache_bytes_per_token * 4 == S.kv_cache_total_per_token(m)
    ds = shard_map("deepseek-ai/DeepSeek-V3", 8)
    assert S.kv_cache_total_per_token(ds) == (512 + 64) * 61 * 2 == ds.ranks[0].kv_cache_bytes_per_token


def test_collectives_dense():
    """vLLM 0.33 all-gathers the logits (LogitsProcessor, Platform.use_all_gather on CUDA); nano-vllm's
    ParallelLMHead gathers them to GPU 0."""
    m = shard_map(QWEN8, 4)
    attn, mlp, embed, head = S.collectives(m)
    assert (attn.op, mlp.op, embed.op, head.op) == ("all-reduce", "all-reduce", "all-reduce", "all-gather")
    assert (attn.count, mlp.count, embed.count, head.count) == (36, 36, 1, 1)
    assert attn.bytes_per_token == 4096 * 2
    assert attn.sent_per_rank == pytest.approx(2 * 3 / 4 * 4096 * 2)  # ring all-reduce
    assert head.bytes_per_token == 151936 * 2 and head.sent_per_rank == pytest.approx(151936 * 2 * 3 / 4)
    assert attn.total_per_token == 36 * 8192
    nano = S.collectives(shard_map(QWEN8, 4, "nano-vllm"))[-1]
    assert nano.op == "gather" and nano.sent_per_rank == pytest.approx(151936 * 2 / 4)


def olmo2_config(**extra) -> dict:
    """An OLMo-2-7B-shaped config: q and k normed over all 32 heads."""
    return {"model_type": "olmo2", "architectures": ["Olmo2ForCausalLM"], "hidden_size": 4096,
            "num_attention_heads": 32, "num_key_value_heads": 32, "num_hidden_layers": 32, "intermediate_size": 11008,
            "vocab_size": 100352, "torch_dtype": "bfloat16", "max_position_embeddings": 4096, **extra}


def test_olmo_all_gathers_q_and_k_in_every_layer():
    """Each attention layer all-gathers q and k before their norms over all heads (vLLM 0.33's TP-aware RMSNorm):
    every GPU sends its (tp-1)/tp share of the whole projection."""
    m = _shard_map(load_spec(olmo2_config(num_key_value_heads=8), "olmo2-7b-gqa"), 4)
    q, k = [c for c in S.collectives(m) if c.op == "all-gather" and "norm" in c.where]
    assert (q.count, q.bytes_per_token, k.bytes_per_token) == (32, 4096 * 2, 8 * 128 * 2)
    assert q.sent_per_rank == pytest.approx(4096 * 2 * 3 / 4) and k.sent_per_rank == pytest.approx(1024 * 2 * 3 / 4)
    assert not S.norm_collectives(load_spec(QWEN8), 4)  # Qwen3 norms each head: nothing to gather
    assert not S.norm_collectives(m.model, 1)


def test_collectives_moe_and_tp1():
    assert S.collectives(shard_map(QWEN8, 1)) == []
    moe = S.collectives(shard_map("Qwen/Qwen3-30B-A3B", 8))
    assert [c.count for c in moe] == [48, 48, 1, 1]  # one all-reduce per MoE layer (routed experts)
    ds = S.collectives(shard_map("deepseek-ai/DeepSeek-V3", 8))
    assert [c.count for c in ds] == [61, 61, 1, 1]  # 3 dense + 58 MoE layers
    padded = S.collectives(shard_map(padded_config(), 4))
    assert padded[-1].bytes_per_token == 32064 * 2  # the gather carries the padded vocabulary


def test_valid_rows_and_problems():
    _, rows = valid_table(QWEN8, 64)
    assert S.valid_sizes(rows, "vllm") == [1, 2, 4, 8, 16, 32]
    assert S.valid_sizes(rows, "nano-vllm") == [1, 2, 4, 8]
    assert S.tp_problem(rows, 8, "vllm") is None
    assert "num_attention_heads=32" in S.tp_problem(rows, 3, "vllm")
    assert "never replicate" in S.tp_problem(rows, 16, "nano-vllm")
    assert "outside" in S.tp_problem(rows, 65, "vllm")


def test_kv_sharing_and_sentence():
    m = shard_map(LLAMA8, 16)
    share = S.kv_sharing(m)
    assert share[0] == [0, 1] and share[7] == [14, 15]
    sentence = S.kv_sentence(m)
    assert "8 KV heads on 16 GPUs" in sentence and "head 0 on GPUs 0–1" in sentence and "\n" not in sentence
    assert S.kv_sentence(shard_map(LLAMA8, 8)) is None
    assert S.kv_sentence(shard_map("deepseek-ai/DeepSeek-V3", 8)) is None  # MLA: no KV heads to copy


def test_padding_sentence():
    m = shard_map(padded_config(), 4)
    sentence = S.padding_sentence(m)
    assert "32001 → 32064" in sentence and "4 × 8016" in sentence and "63 on GPU 3" in sentence
    assert S.padding_sentence(shard_map(QWEN8, 4)) is None
    assert S.padding_sentence(shard_map(padded_config(32000), 4, "nano-vllm")) is None


def test_bias_sentence():
    m = shard_map("openai/gpt-oss-20b", 8)
    # the MXFP4 experts' down bias is loaded by GPU 0 only (the others hold zeros): not a row-parallel bias
    assert S.row_bias_params(m) == ["model.layers.*.self_attn.o_proj.bias"]
    two = dict(presets()["openai/gpt-oss-20b"], quantization_config=None)  # unquantized: experts are row-parallel
    sentence = S.bias_sentence(_shard_map(two, 8))
    assert "self_attn.o_proj.bias" in sentence and "GPU 0 only" in sentence
    assert "bias are held whole" in sentence and "counts each exactly once" in sentence  # two biases: plural
    one = S.bias_sentence(_shard_map(dict(presets()["meta-llama/Llama-3.2-1B"], attention_bias=True), 2))
    assert "o_proj.bias is held whole" in one and "counts it exactly once" in one
    assert S.bias_sentence(shard_map(QWEN8, 4)) is None


def test_mla_kv_sentence_says_why_the_cache_does_not_shrink():
    sentence = S.mla_kv_sentence(shard_map("deepseek-ai/DeepSeek-V3", 16))
    assert "512 + 64" in sentence and "each of the 16 tensor-parallel GPUs" in sentence and "68.62 KiB per token per GPU" in sentence
    assert S.mla_kv_sentence(shard_map("deepseek-ai/DeepSeek-V3", 1)) is None
    assert S.mla_kv_sentence(shard_map(QWEN8, 4)) is None


def test_special_and_absent_cases():
    cases = S.special_cases(shard_map(LLAMA8, 16))
    assert cases["kv"] and cases["padding"] is None and cases["bias"] is None
    absent = S.absent_cases(shard_map(QWEN8, 4))
    assert len(absent) == 3 and "tp=4 ≤ 8 KV heads" in absent[0]
    assert "MLA" in S.absent_cases(shard_map("deepseek-ai/DeepSeek-V3", 8))[0]


def test_short_name():
    assert S.short_name("model.layers.*.self_attn.q_proj.weight") == "self_attn.q_proj.weight"
    assert S.short_name("model.embed_tokens.weight") == "embed_tokens.weight"
    assert S.short_name("lm_head.weight") == "lm_head.weight"


def test_memory_rows_give_windowed_layers_cache_apart():
    """gpt-oss-20b at tp 2: 12 sliding and 12 full layers, 4 of its 8 KV heads of 64 per GPU: 1 KiB per layer."""
    row = S.memory_rows(shard_map("openai/gpt-oss-20b", 2))[0]
    assert (row["kv_per_token"], row["kv_windowed_per_token"]) == (12 * 1024, 12 * 1024)
    assert "kv_windowed_per_token" not in S.memory_rows(shard_map(LLAMA8, 2))[0]

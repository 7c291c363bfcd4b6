"""tpviz.render.summary: memory, valid tp, the three special cases, and the shareable view state."""
from functools import lru_cache

import pytest

from tpviz import shard_map as _shard_map
from tpviz.render import summary as S
from tpviz.trace.validity import valid_table
from tpviz.config.sources import presets
from tpviz.config.sources import load_spec
from tpviz.rules import Layout
from tpviz.trace.model_map import map_model

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
    # unquantized: experts are row-parallel
    two = dict(presets()["openai/gpt-oss-20b"], quantization_config=None)
    sentence = S.bias_sentence(_shard_map(two, 8))
    assert "self_attn.o_proj.bias" in sentence and "GPU 0 only" in sentence
    # a tower's row-parallel biases keep their prefix: Llama-4's vision o_proj has one, its decoder's none
    sentence = S.bias_sentence(shard_map("meta-llama/Llama-4-Scout-17B-16E-Instruct", 8))
    assert sentence.startswith("Row-parallel bias: vision_model.model.layers.*.self_attn.o_proj.bias and "
                               "vision_model.model.layers.*.mlp.fc2.bias"), sentence
    assert "bias are held whole" in sentence and "counts each exactly once" in sentence  # two biases: plural
    one = S.bias_sentence(_shard_map(dict(presets()["meta-llama/Llama-3.2-1B"], attention_bias=True), 2))
    assert "o_proj.bias is held whole" in one and "counts it exactly once" in one
    assert S.bias_sentence(shard_map(QWEN8, 4)) is None


def test_mla_kv_sentence_says_why_the_cache_does_not_shrink():
    sentence = S.mla_kv_sentence(shard_map("deepseek-ai/DeepSeek-V3", 16))
    assert ("512 + 64" in sentence and "each of the 16 tensor-parallel GPUs" in sentence
            and "68.62 KiB per token per GPU" in sentence)
    assert S.mla_kv_sentence(shard_map("deepseek-ai/DeepSeek-V3", 1)) is None
    # SGLang attention DP: the latent is copied over an attention group, each serving its own sequences
    ds = load_spec("deepseek-ai/DeepSeek-V3")
    whole = Layout(8, attn_dp=8, ep_size=8)
    dp8 = S.mla_kv_sentence(map_model(ds, 8, "sglang", layout=whole), whole)
    assert "with attention DP 8, each GPU keeps the latents of its own sequences (68.62 KiB" in dp8
    assert "not 1/8" not in dp8
    half = Layout(8, attn_dp=2, ep_size=8)
    dp2 = S.mla_kv_sentence(map_model(ds, 8, "sglang", layout=half), half)
    assert "each attention group of 4 GPUs keeps the whole latent cache of its own sequences" in dp2
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
    """gpt-oss-20b at tp 2: 12 sliding and 12 full layers, 4 of its 8 KV heads of 64 per GPU: 1 KiB per
    layer."""
    row = S.memory_rows(shard_map("openai/gpt-oss-20b", 2))[0]
    assert (row["kv_per_token"], row["kv_windowed_per_token"]) == (12 * 1024, 12 * 1024)
    assert "kv_windowed_per_token" not in S.memory_rows(shard_map(LLAMA8, 2))[0]


@pytest.mark.parametrize("model", ["openai/gpt-oss-120b", "openai/gpt-oss-20b"])
@pytest.mark.parametrize("tp", [1, 2, 4, 8])
def test_mxfp4_block_padding_is_not_called_vocab_padding(model, tp):
    # 201088 is a multiple of 64 and splits evenly: the padding is the MXFP4 experts' whole 32-row blocks
    m = shard_map(model, tp)
    assert S.padding_sentence(m) is None
    sentence = S.expert_padding_sentence(m)
    experts = [p for p in m.params if p.family == "experts" and any(p.padding)]
    assert (sentence is None) == (not experts)
    if sentence:
        assert ("Allocation padding" in sentence and short_names(experts)[0] in sentence
                and "\n" not in sentence)


def short_names(params) -> list[str]:
    return [S.short_name(p.name) for p in params]


def test_vocab_padding_sentence_follows_the_map_under_each_rule_set():
    for rules, rows in (("vllm", 8016), ("sglang", 8016)):  # 32001 -> 32064 (64 divides by 4: no x tp)
        m = shard_map(padded_config(), 4, rules)
        embed = next(p for p in m.params if p.family == "embed")
        sentence = S.padding_sentence(m)
        assert f"32001 → {rows * 4}" in sentence and f"4 × {rows}" in sentence
        assert all(f"{n} on GPU {r}" in sentence for r, n in enumerate(embed.padding) if n)
        assert m.rules.label in sentence


def test_kv_heads_under_sglang_attention_dp_are_read_per_attention_group():
    """The attention groups serve different sequences: a KV head in each is no copy. Within a group of fewer
    GPUs than KV heads nothing is replicated; attn_tp 1 keeps every head whole on every GPU (that map traced
    k whole, and read no KV heads at all before)."""
    qwen = load_spec("Qwen/Qwen3-30B-A3B")  # 32 query heads, 4 KV heads, 48 layers
    whole = Layout(8, attn_dp=8, ep_size=8)
    m = map_model(qwen, 8, "sglang", layout=whole)
    assert all(r.kv_heads == [0, 1, 2, 3] for r in m.ranks)
    assert {r.kv_cache_bytes_per_token for r in m.ranks} == {2 * 4 * 128 * 48 * 2}
    assert S.kv_sentence(m, whole) is None and "attn_tp=1 ≤ 4 KV heads" in S.absent_cases(m, whole)[0]
    half = Layout(8, attn_dp=2, ep_size=8)  # attn_tp 4: one KV head per GPU of a group
    assert S.kv_sentence(map_model(qwen, 8, "sglang", layout=half), half) is None
    wide = Layout(16, attn_dp=2, ep_size=8)  # attn_tp 8: each head on 2 GPUs of its group
    said = S.kv_sentence(map_model(qwen, 16, "sglang", layout=wide), wide)
    assert said.startswith("Replicated KV heads: 4 KV heads on each attention group of 8 GPUs "
                           "(attention DP 2)")
    assert "head 0 on GPUs 0–1" in said and "query heads split 4 per GPU" in said
    assert "so SGLang copies each KV head to 2 GPUs (head 0 on GPUs 0–1" in S.kv_sentence(
        map_model(qwen, 8, "sglang", layout=Layout(8)))  # plain tp: the sentence it always gave

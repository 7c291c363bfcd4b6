"""Classic decoders' fused q/k/v and Conv1D layouts (GPT-NeoX, BLOOM, Falcon, GPT-2, GPTBigCode, StarCoder2),
worked out by hand from each on-disk order and vLLM 0.33's load path (docs: research on fused QKV).
All use hidden 8 with 4 heads of d = 2, so one head is 2 rows."""
import pytest

from tpviz import shard_map

BASE = dict(hidden_size=8, num_attention_heads=4, vocab_size=64, num_hidden_layers=2)
TPS = [1, 2, 4]


def rows(m, name, rank):
    """The source rows (along split_dim) one rank holds, in the order they sit in its local parameter."""
    t = m.tensor(name)
    return [row for p in sorted(t.rank_pieces(rank), key=lambda p: p.param_start)
            for row in range(p.start, p.stop)]


def chunk(lo, hi, tp, r):
    n = (hi - lo) // tp
    return list(range(lo + r * n, lo + (r + 1) * n))


def heads_of(tp, r, n=4):
    return range(r * n // tp, (r + 1) * n // tp)


def assert_replicated(m, *names):
    """Held whole by every rank: no split dim, one piece covering the tensor on each rank."""
    for name in names:
        t = m.tensor(name)
        assert t.split_dim is None, name
        assert [(p.rank, p.start, p.stop) for p in t.pieces] == [(r, 0, t.shape[0])
                                                                 for r in range(m.tp_size)], name


# --- GPT-NeoX: query_key_value is [h, (q, k, v), d] on disk and the Transformers backend splits it as is ---

@pytest.mark.parametrize("tp", TPS)
def test_gpt_neox_plain_row_split(tp):
    m = shard_map(dict(BASE, model_type="gpt_neox", intermediate_size=16), tp)
    p = "gpt_neox.layers.*."
    for r in range(tp):
        # 24 rows = 4 heads x 6; a contiguous block = whole heads with their q, k, v
        for suffix in ("weight", "bias"):
            assert rows(m, p + f"attention.query_key_value.{suffix}", r) == chunk(0, 24, tp, r)
        assert len(m.tensor(p + "attention.query_key_value.weight").rank_pieces(r)) == 1
        assert rows(m, p + "attention.dense.weight", r) == chunk(0, 8, tp, r)  # row-parallel: columns
        assert rows(m, p + "mlp.dense_h_to_4h.weight", r) == chunk(0, 16, tp, r)
        assert rows(m, p + "mlp.dense_4h_to_h.weight", r) == chunk(0, 16, tp, r)
    assert [r.kv_heads for r in m.ranks] == [list(heads_of(tp, r)) for r in range(tp)]
    assert m.tensor("embed_out.weight").family == "lm_head"  # untied by default
    assert_replicated(m, p + "attention.dense.bias", p + "mlp.dense_4h_to_h.bias", p + "input_layernorm.bias",
                      p + "post_attention_layernorm.bias", "gpt_neox.final_layer_norm.bias")


# --- BLOOM: load_weights regroups [h, (q, k, v), d] to [q | k | v] first: thin pieces from every head block
# ---

@pytest.mark.parametrize("tp", TPS)
def test_bloom_reorders_per_head(tp):
    m = shard_map(dict(BASE, model_type="bloom"), tp)
    p = "transformer.h.*.self_attention.query_key_value."
    for r in range(tp):
        # disk row of head h, part s (0 q, 1 k, 2 v), j < 2: 6h + 2s + j; local order: q of my heads, k, then
        # v
        want = [6 * h + 2 * s + j for s in range(3) for h in heads_of(tp, r) for j in range(2)]
        assert rows(m, p + "weight", r) == rows(m, p + "bias", r) == want
        # one 2-row piece per (head, part); a rank with a single head gets its q, k, v as one contiguous block
        assert len(m.tensor(p + "weight").rank_pieces(r)) == (1 if tp == 4 else 3 * 4 // tp)
    if tp == 2:
        assert rows(m, p + "weight", 0) == [0, 1, 6, 7, 2, 3, 8, 9, 4, 5, 10, 11]
    assert m.tensor("transformer.h.*.mlp.dense_h_to_4h.weight").shape == [32, 8]  # always 4 x hidden
    assert_replicated(m, "transformer.word_embeddings_layernorm.weight",
                      "transformer.word_embeddings_layernorm.bias",
                      "transformer.h.*.input_layernorm.bias", "transformer.ln_f.bias")
    assert "lm_head.weight" not in {t.name for t in m.tensors}  # tied


# --- Falcon ---

@pytest.mark.parametrize("tp", TPS)
def test_falcon_new_decoder_grouped_per_kv_group(tp):
    m = shard_map(dict(BASE, model_type="falcon", new_decoder_architecture=True, num_kv_heads=2), tp)
    # on disk [kv 2, (q0, q1, k, v), d 2]: group g is rows 8g..8g+7, its k at 8g+4, its v at 8g+6
    q = {0: [0, 1], 1: [2, 3], 2: [8, 9], 3: [10, 11]}
    k, v = {0: [4, 5], 1: [12, 13]}, {0: [6, 7], 1: [14, 15]}
    for r in range(tp):
        groups = range(r * 2 // tp, (r + 1) * 2 // tp) if tp <= 2 else [r // 2]  # tp 4: KV group shared by 2
        want = [x for h in heads_of(tp, r) for x in q[h]] + [x for g in groups for x in k[g]] \
            + [x for g in groups for x in v[g]]
        assert rows(m, "transformer.h.*.self_attention.query_key_value.weight", r) == want
    if tp == 4:
        assert rows(m, "transformer.h.*.self_attention.query_key_value.weight", 2) == [8, 9, 12, 13, 14, 15]
        assert [r.kv_heads for r in m.ranks] == [[0], [0], [1], [1]]
    names = {t.name for t in m.tensors}
    assert {"transformer.h.*.ln_attn.weight", "transformer.h.*.ln_attn.bias",
            "transformer.h.*.ln_mlp.bias"} <= names
    # bias false
    assert not any(n.endswith("query_key_value.bias") or n.endswith("dense.bias") for n in names)


@pytest.mark.parametrize("tp", TPS)
def test_falcon_multi_query_replicates_the_kv_head(tp):
    m = shard_map(dict(BASE, model_type="falcon", multi_query=True), tp)
    # on disk [q heads 0..3 (8 rows) | k (2) | v (2)]; the one k and v go to every rank
    for r in range(tp):
        want = chunk(0, 8, tp, r) + [8, 9, 10, 11]
        assert rows(m, "transformer.h.*.self_attention.query_key_value.weight", r) == want
    assert [r.kv_heads for r in m.ranks] == [[0]] * tp
    # k, v x 1 head x d 2 x 2 layers x 2 B
    assert {r.kv_cache_bytes_per_token for r in m.ranks} == {2 * 1 * 2 * 2 * 2}
    assert_replicated(m, "transformer.h.*.input_layernorm.weight", "transformer.h.*.input_layernorm.bias")
    # parallel block
    assert "transformer.h.*.post_attention_layernorm.weight" not in {t.name for t in m.tensors}


# --- GPT-2: Conv1D weights stored [in, out] ---

GPT2 = dict(model_type="gpt2", n_embd=8, n_head=4, n_layer=2, vocab_size=64, n_positions=16)


@pytest.mark.parametrize("tp", TPS)
def test_gpt2_conv1d_split_dims(tp):
    m = shard_map(GPT2, tp)
    c_attn = m.tensor("h.*.attn.c_attn.weight")
    assert c_attn.shape == [8, 24] and c_attn.split_dim == 1  # output columns on disk
    assert m.tensor("h.*.attn.c_proj.weight").split_dim == 0  # row-parallel: input rows on disk
    assert m.tensor("h.*.mlp.c_fc.weight").shape == [8, 32] and m.tensor("h.*.mlp.c_fc.weight").split_dim == 1
    assert (m.tensor("h.*.mlp.c_proj.weight").shape == [32, 8]
            and m.tensor("h.*.mlp.c_proj.weight").split_dim == 0)
    for r in range(tp):
        # [q | k | v] columns, 8 each: each rank takes its chunk of each (bias the same)
        want = chunk(0, 8, tp, r) + chunk(8, 16, tp, r) + chunk(16, 24, tp, r)
        assert rows(m, "h.*.attn.c_attn.weight", r) == rows(m, "h.*.attn.c_attn.bias", r) == want
        assert rows(m, "h.*.attn.c_proj.weight", r) == chunk(0, 8, tp, r)
        assert rows(m, "h.*.mlp.c_fc.weight", r) == rows(m, "h.*.mlp.c_fc.bias", r) == chunk(0, 32, tp, r)
        assert rows(m, "h.*.mlp.c_proj.weight", r) == chunk(0, 32, tp, r)
    assert_replicated(m, "wpe.weight", "h.*.attn.c_proj.bias", "h.*.mlp.c_proj.bias", "h.*.ln_1.bias",
                      "h.*.ln_2.bias", "ln_f.bias")
    assert m.tensor("wpe.weight").shape == [16, 8]
    assert "lm_head.weight" not in {t.name for t in m.tensors}


# --- GPTBigCode: multi-query c_attn [q | k | v] rows, n_inner defaulting to 4 x hidden ---

@pytest.mark.parametrize("tp", TPS)
def test_gpt_bigcode_multi_query(tp):
    m = shard_map(dict(GPT2, model_type="gpt_bigcode", multi_query=True), tp)
    p = "transformer.h.*."
    assert m.tensor(p + "attn.c_attn.weight").shape == [12, 8]  # nn.Linear: [out, in]
    for r in range(tp):
        want = chunk(0, 8, tp, r) + [8, 9, 10, 11]  # q chunk, then the single k and v on every rank
        assert rows(m, p + "attn.c_attn.weight", r) == rows(m, p + "attn.c_attn.bias", r) == want
        assert rows(m, p + "attn.c_proj.weight", r) == chunk(0, 8, tp, r)
    assert m.tensor(p + "mlp.c_fc.weight").shape == [32, 8]  # no n_inner: 4 x 8
    assert_replicated(m, "transformer.wpe.weight", p + "ln_1.bias", p + "attn.c_proj.bias")
    sized = shard_map(dict(GPT2, model_type="gpt_bigcode", multi_query=True, n_inner=24), 1)
    assert sized.tensor(p + "mlp.c_fc.weight").shape == [24, 8]


def test_gpt_bigcode_mlp_is_replicated_in_vllm_033():
    m = shard_map(dict(GPT2, model_type="gpt_bigcode", multi_query=True), 2)
    assert m.tensor("transformer.h.*.mlp.c_fc.weight").split_dim is None
    assert m.tensor("transformer.h.*.mlp.c_proj.weight").split_dim is None


# --- StarCoder2: separate q/k/v (2 KV heads), plain c_fc / c_proj, biases on by default ---

@pytest.mark.parametrize("tp", TPS)
def test_starcoder2(tp):
    m = shard_map(dict(BASE, model_type="starcoder2", num_key_value_heads=2, intermediate_size=16), tp)
    a, f = "model.layers.*.self_attn.", "model.layers.*.mlp."
    kv = [[0], [0], [1], [1]] if tp == 4 else [list(range(r * 2 // tp, (r + 1) * 2 // tp)) for r in range(tp)]
    assert [r.kv_heads for r in m.ranks] == kv
    for r in range(tp):
        q_local = 8 // tp
        for s in ("weight", "bias"):
            assert rows(m, a + f"q_proj.{s}", r) == chunk(0, 8, tp, r)
            k_rows = [x for h in kv[r] for x in (2 * h, 2 * h + 1)]
            assert rows(m, a + f"k_proj.{s}", r) == rows(m, a + f"v_proj.{s}", r) == k_rows
            # k lands after the rank's q rows, v after its k rows
            assert m.tensor(a + f"k_proj.{s}").rank_pieces(r)[0].param_start == q_local
            assert m.tensor(a + f"v_proj.{s}").rank_pieces(r)[0].param_start == q_local + 2 * len(kv[r])
        assert rows(m, f + "c_fc.weight", r) == rows(m, f + "c_fc.bias", r) == chunk(0, 16, tp, r)
        assert rows(m, f + "c_proj.weight", r) == chunk(0, 16, tp, r)
    assert m.tensor(f + "c_proj.weight").split_dim == 1
    assert_replicated(m, a + "o_proj.bias", f + "c_proj.bias", "model.layers.*.input_layernorm.bias",
                      "model.layers.*.post_attention_layernorm.bias", "model.norm.bias")
    plain = shard_map(dict(BASE, model_type="starcoder2", num_key_value_heads=2, intermediate_size=16,
                           use_bias=False), tp)
    assert not any(t.name.endswith("proj.bias") for t in plain.tensors)
    assert "model.norm.bias" in {t.name for t in plain.tensors}  # LayerNorm keeps its bias

"""Non-attention mixers (Gated DeltaNet, Mamba2, short conv) and per-kind caches, checked against layouts
worked out by hand from vLLM 0.33's loaders on tiny configs. Every expected row list below is written out
from the on-disk order, never computed with a tpviz helper."""
import pytest

from tpviz import TPSizeError, shard_map

L = "model.layers.*."


def rows(m, name, rank, layers=None):
    """The source rows (along split_dim) one rank holds, in the order they sit in its local parameter."""
    t = next(t for t in m.tensors if t.name == name and (layers is None or t.layers == layers))
    return [row for p in sorted(t.rank_pieces(rank), key=lambda p: p.param_start)
            for row in range(p.start, p.stop)]


def chunk(lo, hi, tp, r):
    """Rank r's contiguous 1/tp of [lo, hi) (what a column split hands it)."""
    n = (hi - lo) // tp
    return list(range(lo + r * n, lo + (r + 1) * n))


# --- Qwen3-Next Gated DeltaNet: nk=4 key heads of dk=2, nv=8 value heads of dv=3 (2 per key head), kernel 4
# ---
QWEN3_NEXT = dict(model_type="qwen3_next", hidden_size=8, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=4,
                  intermediate_size=16, vocab_size=64, num_hidden_layers=4, full_attention_interval=2,
                  linear_num_key_heads=4, linear_num_value_heads=8, linear_key_head_dim=2,
                  linear_value_head_dim=3,
                  linear_conv_kernel_dim=4, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=4,
                  shared_expert_intermediate_size=4)
G = "model.layers.*.linear_attn."


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_gdn_pieces(tp):
    m = shard_map(QWEN3_NEXT, tp)
    # one key-head group on disk = q (2) + k (2) + v (2 heads x 3) + z (2 x 3) = 16 rows; 4 groups = 64 rows.
    assert m.tensor(G + "in_proj_qkvz.weight").shape == [64, 8]
    # interval 2: layers 1 and 3 are full attention
    assert m.tensor(G + "in_proj_qkvz.weight").layers == [0, 2]
    for r in range(tp):
        # a plain row split that lands on whole key-head groups: tp 4 -> group r = rows 16r..16r+15
        assert rows(m, G + "in_proj_qkvz.weight", r) == chunk(0, 64, tp, r)
        # b|a per key-head group (2 + 2 rows): 16 rows, same groups
        assert rows(m, G + "in_proj_ba.weight", r) == chunk(0, 16, tp, r)
        # conv1d is flat q[0,8) | k[8,16) | v[16,40): each rank takes its chunk of each -> three pieces
        assert (rows(m, G + "conv1d.weight", r) == chunk(0, 8, tp, r) + chunk(8, 16, tp, r)
                + chunk(16, 40, tp, r))
        assert len(m.tensor(G + "conv1d.weight").rank_pieces(r)) == (1 if tp == 1 else 3)
        for name in ("A_log", "dt_bias"):  # per value head
            assert rows(m, G + name, r) == chunk(0, 8, tp, r)
        assert rows(m, G + "norm.weight", r) == [0, 1, 2]  # RMSNorm over one value head: replicated
        assert rows(m, G + "out_proj.weight", r) == chunk(0, 24, tp, r)  # value_dim 8 x 3 columns
    assert m.tensor(G + "norm.weight").split_dim is None
    assert m.tensor(G + "out_proj.weight").split_dim == 1
    assert m.tensor(G + "conv1d.weight").shape == [40, 1, 4]


def test_gdn_tp4_rank2_by_hand():
    m = shard_map(QWEN3_NEXT, 4)
    assert rows(m, G + "in_proj_qkvz.weight", 2) == list(range(32, 48))  # key-head group 2
    assert rows(m, G + "in_proj_ba.weight", 2) == [8, 9, 10, 11]  # b0 b1 a0 a1 of group 2
    assert rows(m, G + "conv1d.weight", 2) == [4, 5, 12, 13] + list(range(28, 34))  # q2, k2, v heads 4 and 5


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_gdn_state_and_kv_bytes(tp):
    m = shard_map(QWEN3_NEXT, tp)
    # conv state: (2*4*2 + 8*3)/tp channels x (4 - 1) taps = 120/tp; recurrent: 8/tp heads x dv 3 x dk 2 =
    # 48/tp; two GDN layers, bf16
    assert {r.state_bytes_per_sequence for r in m.ranks} == {(120 + 48) // tp * 2 * 2}
    # only layers 1 and 3 cache KV: 2 KV heads of 4, replicated at tp 4 -> 2 (k, v) x heads held x 4 x 2
    # layers x 2 B
    held = 2 // min(tp, 2)
    assert {r.kv_cache_bytes_per_token for r in m.ranks} == {2 * held * 4 * 2 * 2}
    assert all(r.kv_cache_windowed == [] for r in m.ranks)
    assert m.ranks[0].cache_bytes(100) == 100 * 2 * held * 4 * 2 * 2 + (120 + 48) // tp * 4


def test_gdn_gated_q_proj_is_split_per_head_with_its_gate():
    m = shard_map(QWEN3_NEXT, 2)
    # Qwen3-Next q_proj is [q_h | gate_h] per head: 4 heads x 2 x 4 = 32 rows; rank 1 holds heads 2, 3 whole
    assert m.tensor(L + "self_attn.q_proj.weight").shape == [32, 8]
    assert rows(m, L + "self_attn.q_proj.weight", 1) == list(range(16, 32))


def test_qwen3_next_attention_has_qk_norms():
    names = {t.name for t in shard_map(QWEN3_NEXT, 1).tensors}
    assert {L + "self_attn.q_norm.weight", L + "self_attn.k_norm.weight"} <= names


def test_gdn_key_heads_must_divide_tp():
    with pytest.raises(TPSizeError, match="linear_num_key_heads=4"):
        shard_map({**QWEN3_NEXT, "num_attention_heads": 8, "num_key_value_heads": 8}, 8)


# --- Nemotron-H Mamba2: 4 heads of 2 (I = 8), state 3, kernel 4; pattern M*M- ---
NEMOTRON_H = dict(model_type="nemotron_h", hidden_size=8, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=2,
                  intermediate_size=16, vocab_size=64, num_hidden_layers=4, hybrid_override_pattern="M*M-",
                  mamba_num_heads=4, mamba_head_dim=2, n_groups=2, ssm_state_size=3,
                  conv_kernel=4, use_conv_bias=True)
M = "backbone.layers.*.mixer."


@pytest.mark.parametrize("tp", [1, 2])
def test_mamba2_groups_divisible(tp):
    m = shard_map(NEMOTRON_H, tp)
    # in_proj on disk: z [0,8) | x [8,16) | B [16,22) | C [22,28) | dt [28,32) (2 groups x 3 = 6 rows for B,
    # C)
    assert m.tensor(M + "in_proj.weight").shape == [32, 8]
    for r in range(tp):
        assert rows(m, M + "in_proj.weight", r) == (chunk(0, 8, tp, r) + chunk(8, 16, tp, r)
                                                    + chunk(16, 22, tp, r)
                                                  + chunk(22, 28, tp, r) + chunk(28, 32, tp, r))
        # conv1d (and its bias): x [0,8) | B [8,14) | C [14,20)
        for name in ("conv1d.weight", "conv1d.bias"):
            assert rows(m, M + name, r) == chunk(0, 8, tp, r) + chunk(8, 14, tp, r) + chunk(14, 20, tp, r)
        for name in ("A_log", "D", "dt_bias"):
            assert rows(m, M + name, r) == chunk(0, 4, tp, r)
        assert rows(m, M + "norm.weight", r) == chunk(0, 8, tp, r)  # gated norm per group: split
        assert rows(m, M + "out_proj.weight", r) == chunk(0, 8, tp, r)
    assert rows(m, M + "in_proj.weight", tp - 1)[-1] == 31
    assert m.tensor(M + "out_proj.weight").split_dim == 1


def test_mamba2_tp2_rank1_by_hand():
    m = shard_map(NEMOTRON_H, 2)
    assert rows(m, M + "in_proj.weight", 1) == [4, 5, 6, 7, 12, 13, 14, 15, 19, 20, 21, 25, 26, 27, 30, 31]


@pytest.mark.parametrize("tp", [2, 4])
def test_mamba2_single_group_replicates_b_and_c(tp):
    m = shard_map({**NEMOTRON_H, "n_groups": 1}, tp)
    # in_proj: z [0,8) | x [8,16) | B [16,19) | C [19,22) | dt [22,26); every rank gets all of B and C
    for r in range(tp):
        assert rows(m, M + "in_proj.weight", r) == (chunk(0, 8, tp, r) + chunk(8, 16, tp, r) + [16, 17, 18]
                                                  + [19, 20, 21] + chunk(22, 26, tp, r))
        assert rows(m, M + "conv1d.weight", r) == chunk(0, 8, tp, r) + [8, 9, 10] + [11, 12, 13]


def test_mamba2_tp4_single_group_by_hand():
    m = shard_map({**NEMOTRON_H, "n_groups": 1}, 4)
    assert rows(m, M + "in_proj.weight", 3) == [6, 7, 14, 15, 16, 17, 18, 19, 20, 21, 25]


def test_mamba2_tp_errors():
    # 2 groups cannot be cut 4 ways, only 1 is replicated
    with pytest.raises(TPSizeError, match="n_groups=2"):
        shard_map(NEMOTRON_H, 4)
    with pytest.raises(TPSizeError, match="mamba_num_heads=6"):
        shard_map({**NEMOTRON_H, "mamba_num_heads": 6, "n_groups": 1}, 4)


@pytest.mark.parametrize("tp, groups, state", [
    # conv: (I 8 + 2 x groups x 3) / tp channels x 3 taps, bf16; SSM: 4/tp heads x 2 x 3, float32 (Nemotron-H
    # default); two M layers. With one group and tp > 1, vLLM pads to tp groups.
    (1, 2, 2 * ((8 + 12) * 3 * 2 + 4 * 2 * 3 * 4)),
    (2, 2, 2 * ((8 + 12) // 2 * 3 * 2 + 2 * 2 * 3 * 4)),
    (2, 1, 2 * ((8 + 2 * 2 * 3) // 2 * 3 * 2 + 2 * 2 * 3 * 4)),
    (4, 1, 2 * ((8 + 2 * 4 * 3) // 4 * 3 * 2 + 1 * 2 * 3 * 4)),
])
def test_mamba2_state_bytes(tp, groups, state):
    m = shard_map({**NEMOTRON_H, "n_groups": groups}, tp)
    assert {r.state_bytes_per_sequence for r in m.ranks} == {state}
    # one '*' layer: 2 KV heads of 2; held 2/tp (replicated at tp 4)
    assert {r.kv_cache_bytes_per_token for r in m.ranks} == {2 * max(2 // tp, 1) * 2 * 2}


def test_nemotron_h_groups_and_ungated_mlp():
    m = shard_map(NEMOTRON_H, 1)
    assert [(g.layers, g.mixer["kind"], g.ffn["kind"]) for g in m.groups] == [
        ([0, 2], "mamba2", "none"), ([1], "attention", "none"), ([3], "none", "dense")]
    mlp = {t.name for t in m.tensors if t.family in ("gate_up", "down_proj")}
    assert not any("gate_proj" in n for n in mlp) and len(mlp) == 2  # relu2 MLP: up and down only


def test_nemotron_h_checkpoint_names():
    names = {t.name for t in shard_map(NEMOTRON_H, 1).tensors}
    assert {"backbone.embeddings.weight", "backbone.norm_f.weight", "backbone.layers.*.norm.weight",
            "backbone.layers.*.mixer.in_proj.weight", "backbone.layers.*.mixer.q_proj.weight",
            "backbone.layers.*.mixer.up_proj.weight"} <= names


# --- LFM2 short conv: hidden 8, kernel 3, layers conv / attention / conv, MLP 12 (no auto adjust) ---
LFM2 = dict(model_type="lfm2", hidden_size=8, num_attention_heads=4, num_key_value_heads=2, vocab_size=64,
            num_hidden_layers=3, layer_types=["conv", "full_attention", "conv"],
            conv_L_cache=3, block_ff_dim=12, block_auto_adjust_ff_dim=False)
C = "model.layers.*.conv."


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_short_conv_pieces_and_state(tp):
    m = shard_map(LFM2, tp)
    assert m.tensor(C + "in_proj.weight").layers == [0, 2]
    for r in range(tp):
        # in_proj [B | C | x], 8 rows each, merged: each rank takes its chunk of each
        assert (rows(m, C + "in_proj.weight", r) == chunk(0, 8, tp, r) + chunk(8, 16, tp, r)
                + chunk(16, 24, tp, r))
        assert rows(m, C + "conv.weight", r) == chunk(0, 8, tp, r)
        assert rows(m, C + "out_proj.weight", r) == chunk(0, 8, tp, r)
    assert m.tensor(C + "conv.weight").shape == [8, 1, 3]
    assert m.tensor(C + "out_proj.weight").split_dim == 1
    # conv state only: 8/tp channels x (3 - 1) taps x 2 conv layers x 2 B
    assert {r.state_bytes_per_sequence for r in m.ranks} == {8 // tp * 2 * 2 * 2}
    # the one attention layer: 2 KV heads of 2 (replicated at tp 4)
    assert {r.kv_cache_bytes_per_token for r in m.ranks} == {2 * max(2 // tp, 1) * 2 * 2}
    assert m.ranks[0].cache_bytes(10) == 10 * 2 * max(2 // tp, 1) * 2 * 2 + 8 // tp * 2 * 2 * 2


def test_lfm2_checkpoint_names():
    names = {t.name for t in shard_map(LFM2, 1).tensors}
    assert {L + "operator_norm.weight", L + "ffn_norm.weight", L + "self_attn.out_proj.weight",
            L + "self_attn.q_layernorm.weight", L + "feed_forward.w1.weight", L + "feed_forward.w2.weight",
            L + "feed_forward.w3.weight", "model.embedding_norm.weight"} <= names


# --- KV cache: only attention layers count; sliding and chunked layers are capped at their window ---

def test_gpt_oss_sliding_layers_are_windowed():
    cfg = dict(model_type="gpt_oss", hidden_size=8, num_attention_heads=4, num_key_value_heads=2, head_dim=2,
               intermediate_size=8, vocab_size=64, num_hidden_layers=4, num_local_experts=4,
               num_experts_per_tok=2, sliding_window=128)
    for tp in (1, 2):
        r = shard_map(cfg, tp).ranks[0]
        per_layer = 2 * (2 // tp) * 2 * 2  # k and v x KV heads held x head_dim 2 x bf16
        assert r.kv_cache_bytes_per_token == 2 * per_layer  # full layers 1, 3
        assert r.kv_cache_windowed == [{"kind": "sliding_attention", "window": 128, "layers": 2,
                                        "bytes_per_token": 2 * per_layer}]  # layers 0, 2
        assert r.cache_bytes(1000) == 1000 * 2 * per_layer + 128 * 2 * per_layer
        assert r.cache_bytes(100) == 100 * 4 * per_layer  # below the window every layer holds all tokens
        assert r.state_bytes_per_sequence == 0


def test_gemma3_and_llama4_windows():
    gemma = dict(model_type="gemma3_text", hidden_size=8, num_attention_heads=2,
                 num_key_value_heads=1, head_dim=4,
                 intermediate_size=16, vocab_size=64, num_hidden_layers=6, sliding_window=16)
    r = shard_map(gemma, 1).ranks[0]
    assert r.kv_cache_bytes_per_token == 2 * 1 * 4 * 2  # layer 5 only
    assert r.kv_cache_windowed == [{"kind": "sliding_attention", "window": 16, "layers": 5,
                                    "bytes_per_token": 80}]
    llama4 = dict(model_type="llama4_text", hidden_size=8, num_attention_heads=2,
                  num_key_value_heads=1, head_dim=4,
                  intermediate_size=8, intermediate_size_mlp=16, vocab_size=64, num_hidden_layers=4,
                  num_local_experts=2, num_experts_per_tok=1, attention_chunk_size=32,
                  no_rope_layers=[1, 0, 1, 0])
    r = shard_map(llama4, 2).ranks[1]  # 1 KV head replicated on both ranks
    assert r.kv_cache_bytes_per_token == 2 * 16  # NoPE layers 1, 3 attend globally
    assert r.kv_cache_windowed == [{"kind": "chunked_attention", "window": 32, "layers": 2,
                                    "bytes_per_token": 32}]


def test_mamba2_one_group_norm_all_reduces_a_sum_of_squares():
    """vLLM 0.33's Mixer2RMSNormGated over one group (n_groups as configured, not the padded tp groups)
    all-reduces each token's fp32 sum of squares: one 4-byte all-reduce per Mamba2 layer, in the table and the
    planner."""
    from tpviz.deploy.traffic import comm_per_token
    from tpviz.rules import Layout
    from tpviz.trace.collectives import collectives
    m = shard_map({**NEMOTRON_H, "n_groups": 1}, 2)
    norm, = [c for c in collectives(m) if "Mamba2" in c.where]
    assert (norm.op, norm.count, norm.bytes_per_token, norm.sent_per_rank) == ("all-reduce", 2, 4, 4.0)
    assert comm_per_token(m.model, Layout(2))["norm_collectives"] == 2 * 4.0
    assert comm_per_token(m.model, Layout(2, 2))["norm_collectives"] == 4.0  # one M layer in each stage
    # 2 groups: each GPU's own
    assert not [c for c in collectives(shard_map(NEMOTRON_H, 2)) if "Mamba2" in c.where]

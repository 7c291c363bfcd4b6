"""Hand-computed layouts of real models: every expected number below is worked out from the model card
numbers by hand (shown in the comments), then compared with the map read off the real weight_loaders."""
import pytest
import torch

from tpviz import TPSizeError, shard_map
from tpviz.plan import build_plan
from tpviz.config.sources import load_spec, presets
from tpviz.trace.tracer import build_rank, load, tagged

L = "model.layers.*."


def spans(m, name, rank):
    """[(start, stop, param_start)] of one tensor on one rank."""
    return [(p.start, p.stop, p.param_start) for p in m.tensor(name).rank_pieces(rank)]


def param(m, name):
    return next(p for p in m.params if p.name == name)


# --- Llama-3.1-8B: 32 heads x 128, 8 KV heads, hidden 4096, intermediate 14336, vocab 128256, 32 layers ---

def test_llama31_8b_tp8_rank3_q_and_k_rows():
    m = shard_map("meta-llama/Llama-3.1-8B", 8)
    # q: 4096 rows / 8 = 512 per rank -> rank 3 holds 1536..2047; k: 8 heads x 128 = 1024 rows / 8 -> 384..511
    assert spans(m, L + "self_attn.q_proj.weight", 3) == [(1536, 2048, 0)]
    assert spans(m, L + "self_attn.k_proj.weight", 3) == [(384, 512, 512)]  # after the rank's 512 q rows
    assert spans(m, L + "self_attn.v_proj.weight", 3) == [(384, 512, 640)]  # after its 128 k rows
    assert param(m, L + "self_attn.qkv_proj.weight").local_shapes[3] == [768, 4096]
    # o_proj is row-parallel: split along dim 1 (input columns), the same 512-column block
    o = m.tensor(L + "self_attn.o_proj.weight")
    assert o.split_dim == 1 and spans(m, o.name, 3) == [(1536, 2048, 0)]
    # gate/up: 14336 / 8 = 1792 rows each; up lands after gate in the merged table
    assert spans(m, L + "mlp.gate_proj.weight", 3) == [(5376, 7168, 0)]
    assert spans(m, L + "mlp.up_proj.weight", 3) == [(5376, 7168, 1792)]
    assert spans(m, L + "mlp.down_proj.weight", 3) == [(5376, 7168, 0)]
    # vocab 128256 = 64 * 2004, so no padding: 16032 rows per rank
    assert spans(m, "model.embed_tokens.weight", 3) == [(48096, 64128, 0)]
    assert spans(m, "lm_head.weight", 7) == [(112224, 128256, 0)]
    assert param(m, "model.embed_tokens.weight").padding == [0] * 8
    assert [r.kv_heads for r in m.ranks] == [[r] for r in range(8)]


def test_llama31_8b_tp16_ranks_6_and_7_share_kv_head_3():
    m = shard_map("meta-llama/Llama-3.1-8B", 16)
    # 16 ranks / 8 KV heads = 2 replicas: rank r holds KV head r // 2
    assert [r.kv_heads for r in m.ranks] == [[r // 2] for r in range(16)]
    assert m.ranks[6].kv_heads == m.ranks[7].kv_heads == [3]
    for name in ("k_proj", "v_proj"):
        t = L + f"self_attn.{name}.weight"
        assert spans(m, t, 6) == spans(m, t, 7) == [(384, 512, 256 + (128 if name == "v_proj" else 0))]
    # q is still split 16 ways: 4096 / 16 = 256 rows each
    assert spans(m, L + "self_attn.q_proj.weight", 7) == [(1792, 2048, 0)]
    assert param(m, L + "self_attn.qkv_proj.weight").local_shapes[7] == [256 + 128 + 128, 4096]


def test_llama31_8b_weight_and_kv_bytes():
    m1, m8 = shard_map("meta-llama/Llama-3.1-8B", 1), shard_map("meta-llama/Llama-3.1-8B", 8)
    # 8,030,261,248 parameters (the model card's 8.03B), bf16
    assert m1.total_weight_bytes == m8.total_weight_bytes == 8_030_261_248 * 2
    assert m1.ranks[0].weight_bytes == 8_030_261_248 * 2
    # replicated norms: (2 per layer x 32 + final) x 4096 = 266,240 params; every rank holds them whole
    norms = (2 * 32 + 1) * 4096 * 2
    for r in m8.ranks:
        assert r.weight_bytes == (8_030_261_248 * 2 - norms) // 8 + norms == 2_008_031_232
        assert r.weight_bytes - m8.total_weight_bytes / 8 == pytest.approx(norms * 7 / 8)
    # KV cache per token: 2 (k and v) x kv heads held x 128 x 32 layers x 2 bytes
    assert m1.ranks[0].kv_cache_bytes_per_token == 2 * 8 * 128 * 32 * 2 == 131072
    assert {r.kv_cache_bytes_per_token for r in m8.ranks} == {2 * 1 * 128 * 32 * 2}
    # tp=16 replicates: each rank still caches one whole head, so the total grows to 16 heads' worth
    assert {r.kv_cache_bytes_per_token for r in shard_map("meta-llama/Llama-3.1-8B", 16).ranks} == {16384}


def test_qwen3_8b_tp4_explicit_head_dim():
    m = shard_map("Qwen/Qwen3-8B", 4)
    # 32 heads x head_dim 128 = 4096 q rows; 8 KV heads x 128 = 1024 k rows; 8 / 4 = 2 KV heads per rank
    assert m.tensor(L + "self_attn.q_proj.weight").shape == [4096, 4096]
    assert m.tensor(L + "self_attn.k_proj.weight").shape == [1024, 4096]
    assert spans(m, L + "self_attn.q_proj.weight", 1) == [(1024, 2048, 0)]
    assert spans(m, L + "self_attn.k_proj.weight", 1) == [(256, 512, 1024)]
    assert spans(m, L + "self_attn.v_proj.weight", 1) == [(256, 512, 1280)]
    assert [r.kv_heads for r in m.ranks] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    # q_norm / k_norm are per head_dim and replicated
    for n in ("q_norm", "k_norm"):
        t = m.tensor(L + f"self_attn.{n}.weight")
        assert t.shape == [128] and t.split_dim is None
    # 12288 / 4 = 3072 gate rows per rank
    assert spans(m, L + "mlp.up_proj.weight", 2) == [(6144, 9216, 3072)]
    # 2 KV heads x 128 x 36 layers x 2 (k, v) x 2 bytes
    assert m.ranks[0].kv_cache_bytes_per_token == 2 * 2 * 128 * 36 * 2


def test_head_dim_not_hidden_over_heads():
    # Qwen3-0.6B: hidden 1024, 16 heads, head_dim 128 (not 64): q 2048 rows, o_proj 2048 input columns
    m = shard_map("Qwen/Qwen3-0.6B", 4)
    assert m.tensor(L + "self_attn.q_proj.weight").shape == [2048, 1024]
    assert m.tensor(L + "self_attn.o_proj.weight").shape == [1024, 2048]
    assert spans(m, L + "self_attn.q_proj.weight", 1) == [(512, 1024, 0)]
    assert spans(m, L + "self_attn.o_proj.weight", 3) == [(1536, 2048, 0)]
    assert "lm_head.weight" not in {t.name for t in m.tensors}  # tied
    # gemma-2-9b: hidden 3584, 16 heads, head_dim 256 -> q 4096 rows
    g = shard_map("google/gemma-2-9b-it", 8)
    assert g.tensor(L + "self_attn.q_proj.weight").shape == [4096, 3584]
    assert spans(g, L + "self_attn.q_proj.weight", 5) == [(2560, 3072, 0)]
    assert "lm_head.weight" not in {t.name for t in g.tensors}  # gemma ties by default
    assert {L + n + ".weight" for n in ("pre_feedforward_layernorm", "post_feedforward_layernorm")} <= {
        t.name for t in g.tensors}


# --- vocab padding: vLLM pads to a multiple of 64 first. Every real vocab above is already a multiple of 64
# (128256, 151936, 32064, 256000, ...), so use a small config with vocab 1000 -> padded 1024. ---

TINY = {"model_type": "llama", "hidden_size": 256, "num_attention_heads": 16, "num_key_value_heads": 16,
        "intermediate_size": 512, "vocab_size": 1000, "num_hidden_layers": 2, "tie_word_embeddings": False}


def test_vocab_padding_rows_come_after_real_rows_and_are_nan():
    m = shard_map(TINY, 8)
    # 1024 / 8 = 128 rows per rank; rank 7 starts at 896 and has 1000 - 896 = 104 real rows, 24 padding
    for name in ("model.embed_tokens.weight", "lm_head.weight"):
        assert param(m, name).local_shapes == [[128, 256]] * 8
        assert param(m, name).padding == [0] * 7 + [24]
        assert spans(m, name, 6) == [(768, 896, 0)]
        assert spans(m, name, 7) == [(896, 1000, 0)]
    plan = next(p for p in build_plan(load_spec(TINY)) if p.name == "model.embed_tokens.weight")
    module, p = build_rank(plan, 8, 7)
    p.data.fill_(float("nan"))
    load(p, tagged(plan.sources[0].shape, 0), None)
    col = p.data[:, 0]
    assert torch.equal(col[:104], torch.arange(896, 1000, dtype=col.dtype))
    assert torch.isnan(col[104:]).all() and len(col) == 128


def test_vocab_padding_can_leave_a_rank_with_only_padding():
    # vocab 65 -> padded 128; tp=4 -> 32 rows each: ranks 0,1 full, rank 2 holds row 64 only, rank 3 none
    m = shard_map({**TINY, "vocab_size": 65}, 4)
    emb = param(m, "model.embed_tokens.weight")
    assert emb.padding == [0, 0, 31, 32]
    assert spans(m, "model.embed_tokens.weight", 2) == [(64, 65, 0)]
    assert spans(m, "model.embed_tokens.weight", 3) == []
    # weight bytes still count the padding rows: each rank allocates 32 x 256
    assert m.ranks[3].weight_bytes_by_family["embed"] == 32 * 256 * 2


def test_nano_vllm_refuses_padding_and_replication():
    with pytest.raises(TPSizeError) as err:
        shard_map(TINY, 16, rules="nano-vllm")  # 1000 % 16 = 8
    assert str(err.value) == "vocab_size=1000 is not divisible by tp_size=16"
    assert param(shard_map(TINY, 16), "model.embed_tokens.weight").local_shapes[0] == [64, 256]  # vllm pads
    with pytest.raises(TPSizeError) as err:
        shard_map("meta-llama/Llama-3.1-8B", 16, rules="nano-vllm")
    msg = str(err.value)
    assert "num_key_value_heads=8" in msg and "tp_size=16" in msg and "replicate" in msg and "\n" not in msg
    assert shard_map("meta-llama/Llama-3.1-8B", 8, rules="nano-vllm").ranks[0].kv_heads == [0]


def test_phi3_fused_qkv_and_gate_up_split_by_total_sizes():
    m = shard_map("microsoft/Phi-3-mini-128k-instruct", 8)
    qkv, gu = m.tensor(L + "self_attn.qkv_proj.weight"), m.tensor(L + "mlp.gate_up_proj.weight")
    assert qkv.shard_id is None and gu.shard_id is None
    assert (qkv.shape, gu.shape) == ([3 * 3072, 3072], [2 * 8192, 3072])
    # q, k, v are 3072 rows each (32 heads x 96); each rank takes 384 of each, in q, k, v order
    for r in (0, 5):
        assert spans(m, qkv.name, r) == [(384 * r, 384 * (r + 1), 0),
                                         (3072 + 384 * r, 3072 + 384 * (r + 1), 384),
                                         (6144 + 384 * r, 6144 + 384 * (r + 1), 768)]
        # gate is rows 0..8191, up rows 8192..16383: 1024 of each per rank
        assert spans(m, gu.name, r) == [(1024 * r, 1024 * (r + 1), 0),
                                        (8192 + 1024 * r, 8192 + 1024 * (r + 1), 1024)]
    assert {t.name for t in m.tensors} >= {L + "self_attn.o_proj.weight", L + "mlp.down_proj.weight"}
    assert not {L + "self_attn.q_proj.weight", L + "mlp.gate_proj.weight"} & {t.name for t in m.tensors}


def test_mixtral_experts():
    m = shard_map("mistralai/Mixtral-8x7B-v0.1", 8)
    pre = L + "block_sparse_moe."
    w1, w3, w2 = (m.tensor(f"{pre}experts.*.{w}.weight") for w in ("w1", "w3", "w2"))
    # w1 (gate) and w3 (up) are column-split into one merged table: 14336 / 8 = 1792 rows per rank
    assert (w1.split_dim, w1.shard_id, w3.shard_id) == (0, 0, 1)
    assert w1.param == w3.param and w1.layer_class == "MergedColumnParallelLinear"
    assert spans(m, w1.name, 2) == [(3584, 5376, 0)] and spans(m, w3.name, 2) == [(3584, 5376, 1792)]
    # w2 (down) is row-split along its 14336 input columns
    assert (w2.split_dim, w2.layer_class) == (1, "RowParallelLinear")
    assert w2.shape == [4096, 14336] and spans(m, w2.name, 2) == [(3584, 5376, 0)]
    assert w1.experts == list(range(8)) and w1.layers == list(range(32))
    assert param(m, w1.param).count == 32 * 8
    router = m.tensor(f"{pre}gate.weight")
    assert (router.split_dim, router.layer_class, router.shape) == (None, "ReplicatedLinear", [8, 4096])
    assert not any(".mlp." in t.name for t in m.tensors)  # no dense MLP in Mixtral
    # 46,702,792,704 parameters (the 46.7B of the model card)
    assert m.total_weight_bytes == 46_702_792_704 * 2


def test_deepseek_v3_mla():
    m = shard_map("deepseek-ai/DeepSeek-V3", 8)
    a = L + "self_attn."
    kv_a, q_a = m.tensor(a + "kv_a_proj_with_mqa.weight"), m.tensor(a + "q_a_proj.weight")
    # latent: kv_lora_rank 512 + rope 64 = 576 rows, replicated on every rank in vLLM's fused_qkv_a_proj
    # after q_a_proj's 1536 rows (deepseek_v2.py: mla_params_mapping, disable_tp=True)
    assert (kv_a.shape, kv_a.split_dim, kv_a.layer_class) == ([576, 7168], None, "MergedColumnParallelLinear")
    assert kv_a.param == q_a.param == a + "fused_qkv_a_proj.weight" and q_a.split_dim is None
    assert {(p.rank, p.start, p.stop, p.param_start) for p in kv_a.pieces} == {(r, 0, 576, 1536)
                                                                                for r in range(8)}
    assert {(p.start, p.stop, p.param_start) for p in q_a.pieces} == {(0, 1536, 0)}
    # the FP8 block scales follow: kv's 5 scale rows from row 12 (1536 / 128)
    kv_s = m.tensor(a + "kv_a_proj_with_mqa.weight_scale_inv")
    assert kv_s.param == a + "fused_qkv_a_proj.weight_scale_inv" and kv_s.pieces[0].param_start == 12
    # q_b_proj: 128 heads x (128 nope + 64 rope) = 24576 rows, column-split: 3072 per rank
    q_b = m.tensor(a + "q_b_proj.weight")
    assert (q_b.shape, q_b.layer_class) == ([24576, 1536], "ColumnParallelLinear")
    assert spans(m, q_b.name, 3) == [(9216, 12288, 0)]
    # kv_b_proj: 128 x (128 nope + 128 v) = 32768 rows from the 512 latent; 4096 per rank
    kv_b = m.tensor(a + "kv_b_proj.weight")
    assert kv_b.shape == [32768, 512] and spans(m, kv_b.name, 7) == [(28672, 32768, 0)]
    # o_proj: row-split over 128 x 128 = 16384 input columns
    o = m.tensor(a + "o_proj.weight")
    assert (o.shape, o.split_dim) == ([7168, 16384], 1) and spans(m, o.name, 1) == [(2048, 4096, 0)]
    # first_k_dense_replace = 3: layers 0..2 dense, 3..60 MoE
    assert m.tensor(L + "mlp.gate_proj.weight").layers == [0, 1, 2]
    experts = m.tensor(L + "mlp.experts.*.gate_proj.weight")
    assert experts.layers == list(range(3, 61)) and experts.experts == list(range(256))
    assert spans(m, experts.name, 1) == [(256, 512, 0)]  # moe_intermediate_size 2048 / 8
    assert m.tensor(L + "mlp.gate.weight").split_dim is None
    assert m.tensor(L + "mlp.shared_experts.down_proj.weight").split_dim == 1
    # the latent (512 + 64) is cached whole on every rank: 576 x 61 layers x 2 bytes
    assert {r.kv_cache_bytes_per_token for r in m.ranks} == {576 * 61 * 2}
    # 671,026,419,200 parameters without the MTP layer (the model card's 671B), counted unquantized in bf16
    # but the 58 MoE layers' 256 router score biases, which vLLM holds in float32
    bf16 = {k: v for k, v in presets()["deepseek-ai/DeepSeek-V3"].items() if k != "quantization_config"}
    assert shard_map(bf16, 8).total_weight_bytes == 671_026_419_200 * 2 + 58 * 256 * 2
    # as published (FP8 blocks + float32 scales, bf16 embeddings, norms and routers): the checkpoint's files
    # hold 688,586,727,753 bytes including the MTP layer vLLM does not load by default (about 2.2%)
    assert 0.97 < m.total_weight_bytes / 688_586_727_753 < 1.0


def test_qwen3_moe_kv_replication_and_cache():
    m = shard_map("Qwen/Qwen3-30B-A3B", 8)
    # 4 KV heads on 8 ranks: 2 replicas each; one 128-wide head per rank, 48 layers
    assert [r.kv_heads for r in m.ranks] == [[r // 2] for r in range(8)]
    assert {r.kv_cache_bytes_per_token for r in m.ranks} == {2 * 128 * 48 * 2}
    # moe_intermediate_size 768 / 8 = 96 per rank
    assert spans(m, L + "mlp.experts.*.up_proj.weight", 4) == [(384, 480, 96)]
    assert not any(t.name.startswith(L + "mlp.gate_proj") for t in m.tensors)  # every layer is MoE


@pytest.mark.parametrize("repo, params", [
    ("meta-llama/Llama-3.1-70B", 70_553_706_496), ("meta-llama/Llama-3.1-405B", 405_853_388_800),
    ("Qwen/Qwen3-0.6B", 596_049_920), ("Qwen/Qwen3-8B", 8_190_735_360), ("mistralai/Mistral-7B-Instruct-v0.3",
                                                                           7_248_023_552)])
def test_weight_bytes_total_and_per_rank(repo, params):
    m = shard_map(repo, 8)
    assert m.total_weight_bytes == params * 2
    naive = m.total_weight_bytes / 8
    for r in m.ranks:  # replicated tensors make each rank hold a little more than total / tp
        assert naive <= r.weight_bytes < naive * 1.01
        replicated = r.weight_bytes_by_family["replicated"]
        assert r.weight_bytes - naive == pytest.approx(replicated * 7 / 8)


BASE = {"model_type": "llama", "hidden_size": 768, "num_attention_heads": 24, "num_key_value_heads": 8,
        "intermediate_size": 14336, "vocab_size": 1000, "num_hidden_layers": 2}


@pytest.mark.parametrize("change, tp, message", [
    ({}, 6, "num_key_value_heads=8 is not divisible by tp_size=6, and tp_size is not a multiple of it"),
    ({"num_attention_heads": 32, "hidden_size": 1024, "intermediate_size": 1000}, 16,
     "intermediate_size=1000 is not divisible by tp_size=16"),
    ({"num_attention_heads": 32, "hidden_size": 1024, "num_experts": 4, "num_experts_per_tok": 2,
      "moe_intermediate_size": 100, "model_type": "qwen3_moe"}, 8,
     "moe_intermediate_size=100 is not divisible by tp_size=8"),
    ({"num_attention_heads": 32, "hidden_size": 1024, "num_experts": 4, "moe_intermediate_size": 64,
      "shared_expert_intermediate_size": 100, "model_type": "qwen2_moe"}, 8,
     "shared_expert_intermediate_size=100 is not divisible by tp_size=8"),
    ({"kv_lora_rank": 16, "qk_nope_head_dim": 8, "qk_rope_head_dim": 8, "v_head_dim": 8,
      "model_type": "deepseek_v3",
      "intermediate_size": 1024}, 16, "num_attention_heads=24 is not divisible by tp_size=16"),
])
def test_first_failing_rule_names_quantity_and_numbers(change, tp, message):
    with pytest.raises(TPSizeError) as err:
        shard_map({**BASE, **change}, tp)
    assert str(err.value) == message


def test_vocab_failure_names_vocab_and_tp():
    cfg = {**BASE, "num_attention_heads": 3, "num_key_value_heads": 3, "hidden_size": 96,
           "intermediate_size": 6}
    with pytest.raises(TPSizeError) as err:
        shard_map(cfg, 3)  # 1000 padded to 1024, and 1024 % 3 != 0
    msg = str(err.value)
    assert "vocab_size" in msg and "1000" in msg and "1024" in msg and "tp_size=3" in msg and "\n" not in msg

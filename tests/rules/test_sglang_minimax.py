"""SGLang 0.5.23's minimax_m2.py (MiniMax-M2, FP8 blocks of 128): attention and its q/k norms over the
attention group, the routed experts' FP8 blocks checked without refinement, and the embedding built on every
pipeline stage."""
from tpviz import load_spec, shard_map
from tpviz.deploy.deployment import deploy
from tpviz.rules import Layout, ruleset
from tpviz.trace.model_map import map_model
from tpviz.trace.validity import split_problem

SGL = ruleset("sglang")
M2 = "MiniMaxAI/MiniMax-M2"  # hidden 3072, vocab 200064, 48 heads, 8 KV heads, moe_intermediate_size 1536


def test_at_plain_tp_every_tensor_is_cut_as_vllm_cuts_it():
    spec = load_spec(M2)
    for tp in (2, 4):
        sgl, vllm = shard_map(spec, tp, rules="sglang"), shard_map(spec, tp)
        assert {t.name: t.pieces for t in sgl.tensors} == {t.name: t.pieces for t in vllm.tensors}


def test_tp_8_needs_ep_in_sglang_where_vllm_refines_its_fp8_blocks():
    spec = load_spec(M2)
    problem = split_problem(spec, 8, "sglang")[0]
    assert "The output_size of gate's and up's weight = 192 is not divisible by weight quantization " \
           "block_n = 128." in problem and "--ep" in problem
    assert split_problem(spec, 8)[0] is None
    assert split_problem(spec, 8, "sglang", layout=Layout(8, ep_size=2))[0] is None  # 1536 / 4 = 384


def test_every_stage_holds_an_embedding_slice():
    spec = load_spec(M2)
    sgl, vllm = deploy(spec, Layout(4, pp=2), "sglang"), deploy(spec, Layout(4, pp=2), "vllm")
    assert sgl.gpus[0].weight_bytes == vllm.gpus[0].weight_bytes
    assert sgl.gpus[-1].weight_bytes - vllm.gpus[-1].weight_bytes == 200064 * 3072 * 2 // 4
    assert any("builds embed_tokens on every pipeline stage" in w for w in sgl.warnings)
    assert SGL.widths(Layout(8, attn_dp=2, ep_size=8, dp_lm_head=True), spec.arch).lm_head == 8  # tp always


def test_the_q_and_k_norms_follow_the_attention_group():
    m = map_model(load_spec(M2), 8, "sglang", layout=Layout(8, attn_dp=2, ep_size=8))  # attn_tp 4
    k_norm = m.tensor("model.layers.*.self_attn.k_norm.weight")  # 8 KV heads x 128: 2 heads per GPU
    assert [(p.rank, p.start, p.stop) for p in k_norm.pieces] == [(r, 256 * (r % 4), 256 * (r % 4 + 1))
                                                                    for r in range(8)]
    q_norm = m.tensor("model.layers.*.self_attn.q_norm.weight")  # 48 heads x 128 over 4
    assert {p.stop - p.start for p in q_norm.pieces} == {1536}

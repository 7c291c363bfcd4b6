"""SGLang 0.5.23's qwen3_5.py (Qwen3.5, dense and MoE): the text decoder cut as vLLM cuts it at plain tp, its
full-attention tables named without self_attn, every attention (gated delta net too) and its state over the
attention group, the embedding whole on every GPU under attention DP, and both ends on their own stages."""
import pytest

from tpviz import load_spec, shard_map
from tpviz.deploy.deployment import deploy
from tpviz.rules import Layout, ruleset
from tpviz.trace.model_map import map_model

SGL = ruleset("sglang")
DENSE, MOE = "Qwen/Qwen3.5-9B", "Qwen/Qwen3.5-35B-A3B"  # vocab 248320; hidden 4096 / 2048


def named(m):
    return {t.name: (t.param, t.pieces) for t in m.tensors if not t.tower}


@pytest.mark.parametrize("model", [DENSE, MOE])
def test_the_text_decoder_is_cut_as_vllm_cuts_it_under_sglangs_names(model):
    spec = load_spec(model)
    for tp in (2, 4):
        sgl, vllm = named(shard_map(spec, tp, rules="sglang")), named(shard_map(spec, tp))
        renamed = {k: (p.replace(".self_attn.", "."), pieces) for k, (p, pieces) in vllm.items()}
        assert sgl == renamed
    params = {p.name for p in shard_map(spec, 2, rules="sglang").params}
    assert "model.layers.*.qkv_proj.weight" in params and not any(".self_attn." in p for p in params)


def test_attention_dp_cuts_the_mixers_and_their_state_over_the_group_and_keeps_the_embedding_whole():
    spec = load_spec(DENSE)
    m = map_model(spec, 4, "sglang", layout=Layout(4, attn_dp=2))  # attn_tp 2
    assert m.ranks[0].state_bytes_per_sequence == shard_map(spec, 2).ranks[0].state_bytes_per_sequence
    assert {(p.start, p.stop) for p in m.tensor("model.embed_tokens.weight").pieces} == {(0, 248320)}
    qkvz = m.tensor("model.layers.*.linear_attn.in_proj_qkv.weight")
    assert {p.rank for p in qkvz.pieces} == set(range(4))
    assert [sorted((p.start, p.stop) for p in qkvz.pieces if p.rank == r) for r in (0, 2)] == \
        [sorted((p.start, p.stop) for p in shard_map(spec, 2).tensor(qkvz.name).pieces if p.rank == 0)] * 2
    w = SGL.widths(Layout(4, attn_dp=2, dp_lm_head=True), spec.arch)
    assert (w.attention, w.embed, w.lm_head, w.dense) == (2, 1, 2, 4)


def test_the_embedding_lives_on_the_first_stage_alone():
    """vLLM 0.33's qwen3_5.py builds embed_tokens on every stage; SGLang's on the first."""
    spec = load_spec(DENSE)
    sgl, vllm = deploy(spec, Layout(2, pp=2), "sglang"), deploy(spec, Layout(2, pp=2), "vllm")
    assert vllm.gpus[-1].weight_bytes - sgl.gpus[-1].weight_bytes == 248320 * 4096 * 2 // 2


def test_the_moe_refuses_tp_above_its_experts_over_the_whole_tp():
    cfg = load_spec(MOE).config
    text = {**cfg["text_config"], "num_experts": 4, "num_experts_per_tok": 2}
    spec = load_spec({**cfg, "text_config": text})
    with pytest.raises(ValueError, match=r"Tensor parallel size 8 is greater than the number of experts 4\."):
        deploy(spec, Layout(8, ep_size=2), "sglang")


def test_a_wrapper_of_another_file_is_refused():
    """MiniCPM-V 4.6: minicpmv.py builds qwen3_5.py's decoder under its own names, head and forward."""
    with pytest.raises(ValueError, match=r"^SGLang 0\.5\.23's qwen3_5\.py builds the decoder, but MiniCPMV4_6"
                                         r"ForConditionalGeneration wraps it in a file of its own"):
        shard_map("openbmb/MiniCPM-V-4.6", 2, rules="sglang")

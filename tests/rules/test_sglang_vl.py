"""SGLang 0.5.23's Qwen vision-language files (qwen2_vl.py, qwen2_5_vl.py, qwen3_vl.py, qwen3_vl_moe.py):
their text decoders cut as qwen2.py's, qwen3.py's and qwen3_moe.py's, the tower left out and said so, and
the rules only these wrappers have (no PP in qwen2_vl.py; qwen3_vl.py's first stage holds the deepstack
layers)."""
import pytest

from tpviz import load_spec, shard_map
from tpviz.errors import LayoutError
from tpviz.deploy.deployment import deploy
from tpviz.rules import Layout, ruleset
from tpviz.trace.validity import split_problem

SGL = ruleset("sglang")
VL = ["Qwen/Qwen2.5-VL-7B-Instruct", "allenai/olmOCR-7B-0225-preview", "nvidia/Cosmos-Reason2-8B",
      "Qwen/Qwen3-VL-30B-A3B-Instruct", "Qwen/Qwen3-VL-235B-A22B-Instruct"]


@pytest.mark.parametrize("model", VL)
def test_the_decoder_is_cut_as_vllm_cuts_it_and_the_tower_is_left_out_and_said(model):
    spec = load_spec(model)
    sgl, vllm = shard_map(spec, 4, rules="sglang"), shard_map(spec, 4)
    text = {t.name: t.pieces for t in vllm.tensors if not t.tower}
    assert {t.name: t.pieces for t in sgl.tensors} == text  # power-of-2 tp: the same vocab padding
    assert any(t.tower for t in vllm.tensors) and not any(t.tower for t in sgl.tensors)
    assert any("left out of this map, its memory and its tp checks" in w for w in sgl.warnings)
    # the note on how vLLM splits the tower would contradict it: under SGLang rules it goes
    assert any(n.startswith("multimodal checkpoint: its vision tower") for n in vllm.model.notes)
    assert not any(n.startswith("multimodal checkpoint: its vision tower") for n in sgl.model.notes)


def test_attention_dp_and_the_lm_head_follow_each_wrappers_decoder():
    moe, qwen25 = load_spec("Qwen/Qwen3-VL-30B-A3B-Instruct"), load_spec("Qwen/Qwen2.5-VL-7B-Instruct")
    w = SGL.widths(Layout(8, attn_dp=2, dp_lm_head=True), moe.arch)  # qwen3_moe.py's attention, a VL head
    assert (w.attention, w.embed, w.lm_head) == (4, 4, 4)
    w = SGL.widths(Layout(8, attn_dp=2, dp_lm_head=True), qwen25.arch)  # ParallelLMHead over the whole tp
    assert w.lm_head == 8
    assert "qwen2_5_vl.py (qwen2.py's Qwen2Model) cuts attention over the whole --tp" in SGL.layout_problem(
        Layout(8, attn_dp=2), qwen25)
    assert SGL.layout_problem(Layout(8, attn_dp=2, ep_size=2), moe) is None


def test_qwen2_vl_has_no_pipeline_parallelism_in_sglang():
    spec = load_spec("allenai/olmOCR-7B-0225-preview")
    with pytest.raises(LayoutError, match=r"Pipeline Parallel is not compatible with this model\. \(SGLang "
                                          r"0\.5\.23's qwen2_vl\.py"):
        deploy(spec, Layout(2, pp=2), "sglang")
    assert len(deploy(spec, Layout(2, pp=2), "vllm").gpus) == 4
    assert len(deploy(load_spec("Qwen/Qwen2.5-VL-7B-Instruct"), Layout(2, pp=2), "sglang").gpus) == 4


def test_qwen3_vl_keeps_the_deepstack_layers_on_the_first_stage(monkeypatch):
    dense = load_spec("nvidia/Cosmos-Reason2-8B")  # 36 layers, 3 deepstack indexes
    assert SGL.pp_partition(36, 13)[0] == 2
    problem = SGL.layout_problem(Layout(1, pp=13), dense)
    assert problem.startswith("start_layer should be greater than or equal to len(deepstack_visual_indexes)")
    assert "hold the 3 layers" in problem
    assert SGL.layout_problem(Layout(1, pp=12), dense) is None  # 3 layers each
    monkeypatch.setenv("SGLANG_PP_LAYER_PARTITION", "2,34")
    assert SGL.layout_problem(Layout(1, pp=2), dense).startswith("start_layer should be")
    monkeypatch.setenv("SGLANG_PP_LAYER_PARTITION", "3,33")
    assert SGL.layout_problem(Layout(1, pp=2), dense) is None
    monkeypatch.delenv("SGLANG_PP_LAYER_PARTITION")
    # qwen3_vl_moe.py's decoder has no such assert; vLLM has none either
    assert SGL.layout_problem(Layout(1, pp=24), load_spec("Qwen/Qwen3-VL-30B-A3B-Instruct")) is None
    assert ruleset("vllm").layout_problem(Layout(1, pp=13), dense) is None


def test_a_tower_whose_heads_do_not_divide_attn_tp_is_flagged_not_passed_silently():
    spec = load_spec("Qwen/Qwen3-VL-235B-A22B-Instruct")  # 64 text heads, 16 vision heads
    problem, warnings = split_problem(spec, 32, "sglang")
    assert problem is None and any("16 heads do not divide attn_tp_size = 32" in w for w in warnings)
    halves = split_problem(spec, 32, "sglang", layout=Layout(32, attn_dp=2))[1]  # attn_tp 16
    assert not any("16 heads" in w for w in halves)

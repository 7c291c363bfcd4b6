"""SGLang 0.5.23's glm4_moe.py (GLM-4.5, 4.6, 4.7): attention, the embedding and the lm_head over the
attention group, the dense MLPs switched by --moe-dense-tp-size 1, the shared expert over tp (fused into the
MoE at --ep 1 on NVIDIA), and the lm_head built on every pipeline stage."""
import pytest

from tpviz import load_spec, shard_map
from tpviz.deploy.deployment import deploy
from tpviz.deploy.equivalent import equivalent
from tpviz.deploy.sizing import Sizer
from tpviz.rules import Layout, ruleset
from tpviz.trace.validity import split_problem

SGL = ruleset("sglang")
AIR = "zai-org/GLM-4.5-Air"  # 46 layers (the first dense), hidden 4096, 96 heads, 8 KV heads, 128 experts


@pytest.mark.parametrize("model", [AIR, "zai-org/GLM-4.7"])
@pytest.mark.parametrize("tp", [4, 8])
def test_at_plain_tp_every_tensor_is_cut_as_vllm_cuts_it(model, tp):
    spec = load_spec(model)
    sgl, vllm = shard_map(spec, tp, rules="sglang"), shard_map(spec, tp)
    assert {t.name: t.pieces for t in sgl.tensors} == {t.name: t.pieces for t in vllm.tensors}


def test_the_shared_expert_is_fused_at_ep_1_and_keeps_its_tp_cut():
    air = load_spec(AIR)
    said = [w for w in split_problem(air, 8, "sglang")[1] if "shared expert" in w]
    assert said == ["SGLang fuses GLM-4.5/4.6/4.7's shared expert into the routed experts at --ep 1 on "
                    "NVIDIA GPUs from Ampere on (as expert 128, cut tp ways: the rows drawn for the shared "
                    "expert; its FP8 checks are the MoE's)"]
    assert not [w for w in split_problem(air, 8, "sglang", layout=Layout(8, ep_size=2))[1] if "fuses" in w]
    # glm4_moe.py's shared expert reads no SGLANG_SHARED_EXPERT_TP1
    assert SGL.layout_problem(Layout(8, shared_tp1=True, ep_size=2), air) == \
        "SGLANG_SHARED_EXPERT_TP1 does not change glm4_moe.py's shared experts"


def test_dense_mlps_follow_moe_dense_tp_size_and_the_lm_head_sits_on_every_stage():
    air = load_spec(AIR)
    whole = deploy(air, Layout(8, dense_tp1=True), "sglang").gpus[0].weight_bytes
    cut = deploy(air, Layout(8), "sglang").gpus[0].weight_bytes
    assert whole - cut == 3 * 10944 * 4096 * 2 * 7 // 8  # layer 0's gate, up and down, whole instead of 1/8
    sgl, vllm = (deploy(air, Layout(4, pp=2), r) for r in ("sglang", "vllm"))
    assert sgl.gpus[0].weight_bytes - vllm.gpus[0].weight_bytes == 151552 * 4096 * 2 // 4  # its lm_head slice
    assert sgl.gpus[-1].weight_bytes == vllm.gpus[-1].weight_bytes
    why = equivalent(air, Layout(4, pp=2), "vllm").line
    assert "the weights per GPU differ on pipeline stage 0 alone" in why


def test_attention_dp_cuts_attention_over_the_group():
    air = load_spec(AIR)
    w = SGL.widths(Layout(8, attn_dp=2, ep_size=8, dp_lm_head=True), air.arch)
    assert (w.attention, w.embed, w.lm_head, w.dense, w.shared) == (4, 4, 4, 8, 8)
    d = deploy(air, Layout(8, attn_dp=8, ep_size=8), "sglang")
    assert [g.experts for g in d.gpus] == [list(range(16 * r, 16 * r + 16)) for r in range(8)]
    assert len({g.kv_cache_bytes_per_token for g in d.gpus}) == 1  # every GPU caches all 8 KV heads


def test_glm_4_5v_is_glm4v_moe_py_with_the_lm_head_on_the_last_stage_alone():
    """glm4v_moe.py wraps the same decoder but guards its lm_head by stage, unlike glm4_moe.py."""
    vl = load_spec("zai-org/GLM-4.5V")
    assert vl.arch.sglang.file == "glm4v_moe.py (glm4_moe.py's Glm4MoeModel)"
    sgl = deploy(vl, Layout(4, pp=2), "sglang")
    bare = deploy(vl, Layout(4, pp=2), "vllm", sizer=Sizer(vl, "vllm", vision=False))  # without the tower
    assert [g.weight_bytes for g in sgl.gpus] == [g.weight_bytes for g in bare.gpus]  # and adds no first head
    assert not [w for w in split_problem(vl, 4, "sglang")[1] if "fuses" in w]

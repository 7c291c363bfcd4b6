"""SGLang 0.5.23's mllama4.py around llama4.py's Llama4Model (Llama-4 Scout and Maverick): the decoder cut as
vLLM cuts it at plain tp, attention over the attention group, no pipeline parallelism, and no vision tower
unless --enable-multimodal."""
import pytest

from tpviz import load_spec, shard_map
from tpviz.deploy.deployment import deploy
from tpviz.errors import LayoutError
from tpviz.rules import Layout, ruleset

SGL = ruleset("sglang")
SCOUT, MAVERICK = "meta-llama/Llama-4-Scout-17B-16E-Instruct", "meta-llama/Llama-4-Maverick-17B-128E-Instruct"


@pytest.mark.parametrize("model", [SCOUT, MAVERICK])
def test_the_decoder_is_cut_as_vllm_cuts_it_and_the_map_is_sglangs_default(model):
    spec = load_spec(model)
    sgl, vllm = shard_map(spec, 8, rules="sglang"), shard_map(spec, 8)
    assert {t.name: t.pieces for t in sgl.tensors} == {t.name: t.pieces for t in vllm.tensors if not t.tower}
    assert any(w.startswith("SGLang 0.5.23 builds no vision tower for this model unless --enable-multimodal")
               for w in sgl.warnings)


def test_no_pipeline_parallelism_and_attention_over_the_group():
    scout = load_spec(SCOUT)  # 40 heads, 8 KV heads, 16 experts
    with pytest.raises(LayoutError, match=r"Pipeline Parallel is not compatible with this model\. \(SGLang "
                                          r"0\.5\.23's mllama4\.py"):
        deploy(scout, Layout(4, pp=2), "sglang")
    w = SGL.widths(Layout(8, attn_dp=2, ep_size=8, dp_lm_head=True), scout.arch)
    assert (w.attention, w.embed, w.lm_head, w.dense, w.shared) == (4, 4, 4, 8, 8)
    d = deploy(scout, Layout(8, attn_dp=2, ep_size=8), "sglang")
    assert [g.experts for g in d.gpus] == [[2 * r, 2 * r + 1] for r in range(8)]  # contiguous blocks

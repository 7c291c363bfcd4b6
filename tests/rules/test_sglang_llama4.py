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


def test_the_text_only_class_runs_pipeline_stages_in_sglang_but_does_not_split_them():
    """llama4.py's Llama4ForCausalLM takes pp_proxy_tensors (so model_runner.py does not assert), while its
    Llama4Model builds every layer on every stage: a refusal in tpviz's words, not SGLang's assert."""
    text = dict(load_spec(SCOUT).config["text_config"], architectures=["Llama4ForCausalLM"],
                model_type="llama4_text")
    spec = load_spec(text)
    with pytest.raises(LayoutError) as e:
        deploy(spec, Layout(4, pp=2), "sglang")
    assert str(e.value) == ("SGLang 0.5.23's Llama4ForCausalLM (llama4.py) accepts pipeline stages, but its "
                            "Llama4Model builds and runs every layer on each of them: tpviz does not map it "
                            "at --pp-size > 1; use --pp-size 1")
    assert deploy(spec, Layout(4), "sglang").gpus

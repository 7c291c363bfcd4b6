"""SGLang 0.5.23's commandr.py, ernie4.py, granitemoe.py, phimoe.py, hunyuan.py, phi.py and gpt2.py: cut as
vLLM cuts them at plain tp, each file's own names, dtypes, reduces and refusals; and SGLang's --dp-size
replicas, which exchange no MoE tokens."""
import pytest

from tpviz import load_spec, shard_map
from tpviz.deploy.deployment import deploy
from tpviz.deploy.traffic import comm_per_token
from tpviz.errors import LayoutError, TpvizError
from tpviz.rules import Layout
from tpviz.trace.collectives import collectives

COHERE, COHERE2 = "CohereForAI/c4ai-command-r-v01", "CohereLabs/c4ai-command-r7b-12-2024"
ERNIE, ERNIE_MOE = "baidu/ERNIE-4.5-0.3B-PT", "baidu/ERNIE-4.5-21B-A3B-PT"
GRANITE, PHIMOE = "ibm-granite/granite-3.1-1b-a400m-instruct", "microsoft/Phi-tiny-MoE-instruct"
HUNYUAN, PHI2, GPT2 = "tencent/Hunyuan-A13B-Instruct", "microsoft/phi-2", "openai-community/gpt2"


def pieces(m):
    return {t.name: t.pieces for t in m.tensors}


@pytest.mark.parametrize("model", [COHERE, COHERE2, ERNIE, ERNIE_MOE, GRANITE, HUNYUAN, PHI2, PHIMOE])
def test_at_plain_tp_every_tensor_is_cut_as_vllm_cuts_it(model):
    spec = load_spec(model)
    for tp in (2, 4):
        assert pieces(shard_map(spec, tp, rules="sglang")) == pieces(shard_map(spec, tp))


@pytest.mark.parametrize("model", [COHERE, ERNIE_MOE, GRANITE, HUNYUAN, PHI2])
def test_no_pipeline_stages_in_these_files(model):
    with pytest.raises(LayoutError, match=r"Pipeline Parallel is not compatible with this model\."):
        deploy(load_spec(model), Layout(2, pp=2), "sglang")


def test_ernie_routers_are_in_the_model_dtype():
    """ernie4.py's MoEGate builds the router and its correction bias in bf16, vLLM's GateLinear in float32."""
    spec = load_spec(ERNIE_MOE)  # 27 MoE layers of 64 experts, hidden 2560
    sgl, vllm = shard_map(spec, 2, rules="sglang"), shard_map(spec, 2)
    assert pieces(sgl) == pieces(vllm)
    assert vllm.ranks[0].weight_bytes - sgl.ranks[0].weight_bytes == 27 * (64 * 2560 + 64) * 2


def test_command_r_reduces_attention_and_mlp_apart():
    """commandr.py leaves o_proj's and down_proj's reduce_results on; vLLM sums them and reduces once."""
    spec = load_spec(COHERE)  # 40 layers
    for rules, counts in (("vllm", [40, 0]), ("sglang", [40, 40])):
        m = shard_map(spec, 4, rules=rules)
        assert [c.count for c in collectives(m) if c.where.startswith(("after o_proj", "after down_proj"))] \
            == counts
    sgl, vllm = comm_per_token(spec, Layout(4), "sglang"), comm_per_token(spec, Layout(4), "vllm")
    assert sgl["tp_all_reduce"] == 2 * vllm["tp_all_reduce"]


def test_hunyuans_router_is_named_as_sglang_names_it():
    m = shard_map(load_spec(HUNYUAN), 2, rules="sglang")
    router = [t for t in m.tensors if t.name == "model.layers.*.mlp.gate.wg.weight"]
    assert [t.param for t in router] == ["model.layers.*.mlp.gate.weight"]
    assert "model.layers.*.mlp.gate.weight" in {p.name for p in m.params}
    assert not any("Transformers backend" in n for n in m.model.notes)  # SGLang's own hunyuan.py serves it


def test_each_files_own_refusals():
    ernie, phimoe, phi2 = load_spec(ERNIE_MOE).config, load_spec(PHIMOE).config, load_spec(PHI2).config
    hunyuan = load_spec(HUNYUAN).config
    cases = [
        (dict(phimoe, attention_bias=False), r"phimoe\.py builds q/k/v/o biases only under attention_bias"),
        (dict(ernie, moe_layer_interval=3),
         r"ernie4\.py puts the experts in layers 1, 4, 7, 10, \.\.\., where vLLM puts them in 2, 5, 8, 11"),
        (dict(ernie, use_moe=False), r"ernie4\.py puts the experts in layers 1, 2, 3, 4, \.\.\., where vLLM "
                                     r"puts them in none"),
        (dict(ernie, use_bias=True), r"ernie4\.py builds q/k/v/o biases and no MLP biases"),
        (dict(phi2, num_key_value_heads=8), r"phi\.py builds as many KV heads"),
        (dict(phi2, intermediate_size=8192), r"phi\.py sizes fc1 and fc2 by n_inner or 4 x hidden_size "
                                             r"\(10240\), not intermediate_size=8192"),
        (dict(hunyuan, attention_head_dim=None), r"hunyuan\.py raises 'Missing head dim config"),
        (dict(hunyuan, attention_head_dim=64), r"calculated head_dim 128 != attention_head_dim 64"),
        (GPT2, r"gpt2\.py gives its attention all 12 KV heads while each GPU computes 6"),
        (dict(load_spec(COHERE).config, head_dim=64), r"commandr\.py takes head_dim = hidden_size"),
    ]
    for cfg, message in cases:
        spec = load_spec(cfg)
        shard_map(spec, 2)  # vLLM rules map it
        with pytest.raises(TpvizError, match=message) as e:
            shard_map(spec, 2, rules="sglang")
        assert "\n" not in str(e.value)
    assert shard_map(GPT2, 1, rules="sglang").ranks
    with pytest.raises(TpvizError, match=r"num_attention_heads=12 is not divisible by tp_size=8"):
        shard_map(GPT2, 8, rules="sglang")  # the heads assert answers before the KV views


def test_phimoe_runs_without_its_window_and_refuses_attention_dp():
    """phimoe.py builds no sliding window: every layer caches the whole context (the map says so)."""
    spec = load_spec(PHIMOE)  # sliding_window 2047 of 4096 positions
    sgl, vllm = shard_map(spec, 2, rules="sglang"), shard_map(spec, 2)
    assert sgl.ranks[0].kv_cache_bytes_per_token > vllm.ranks[0].kv_cache_bytes_per_token
    assert any("without the config's sliding_window" in n for n in sgl.model.notes)
    with pytest.raises(LayoutError, match=r"phimoe\.py shards over the attention TP group \(2 ranks\) but "
                                          r"all-reduces over the full TP group \(4 ranks\): use "
                                          r"--attn-dp-size 1"):
        deploy(spec, Layout(4, attn_dp=2), "sglang")
    with pytest.raises(LayoutError, match=r"no attention-DP gather"):
        deploy(spec, Layout(4, attn_dp=4), "sglang")


def test_sglang_dp_replicas_exchange_no_moe_tokens():
    """vLLM's MoE layers gather every replica's tokens; SGLang's --dp-size replicas hold every expert each."""
    spec = load_spec("Qwen/Qwen3-30B-A3B")
    assert comm_per_token(spec, Layout(2, dp=2), "vllm")["moe_dispatch_combine"] > 0
    assert comm_per_token(spec, Layout(2, dp=2), "sglang").get("moe_dispatch_combine", 0) == 0

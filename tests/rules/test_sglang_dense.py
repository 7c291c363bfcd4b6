"""SGLang 0.5.23's dense model files cut as vLLM cuts them at plain tp, with each file's own refusals:
gemma.py (Gemma-1), olmo.py (OLMo-1, which vLLM 0.33 serves through its Transformers backend), glm4.py,
minicpm.py and exaone4.py."""
import pytest

from tpviz import load_spec, shard_map
from tpviz.deploy.deployment import deploy
from tpviz.errors import LayoutError, TpvizError
from tpviz.rules import Layout, ruleset

SGL = ruleset("sglang")
GEMMA, OLMO, GLM4 = "google/gemma-2b", "allenai/OLMo-1B-hf", "THUDM/GLM-4-9B-0414"
MINICPM, EXAONE = "openbmb/MiniCPM-2B-sft-bf16", "LGAI-EXAONE/EXAONE-4.0-32B"


def pieces(m):
    return {t.name: t.pieces for t in m.tensors}


@pytest.mark.parametrize("model,tps", [(GEMMA, (1, 2, 8)), (OLMO, (2, 4, 8)), (GLM4, (2, 4)),
                                       (MINICPM, (2, 4)), (EXAONE, (2, 8))])
def test_at_plain_tp_every_tensor_is_cut_as_vllm_cuts_it(model, tps):
    spec = load_spec(model)
    for tp in tps:
        sgl, vllm = shard_map(spec, tp, rules="sglang"), shard_map(spec, tp)
        assert pieces(sgl) == pieces(vllm)
        assert [r.weight_bytes for r in sgl.ranks] == [r.weight_bytes for r in vllm.ranks]


def test_olmo_is_sglangs_own_file_not_vllms_transformers_backend():
    spec = load_spec(OLMO)
    assert any("Transformers backend" in n for n in shard_map(spec, 2).model.notes)
    assert not any("Transformers backend" in n for n in shard_map(spec, 2, rules="sglang").model.notes)


@pytest.mark.parametrize("model", [GEMMA, OLMO, MINICPM])
def test_files_without_pipeline_stages_refuse_pp(model):
    with pytest.raises(LayoutError, match=r"Pipeline Parallel is not compatible with this model\."):
        deploy(load_spec(model), Layout(2, pp=2), "sglang")


def test_glm4_and_exaone4_run_pipeline_stages_exaone4_with_its_lm_head_on_each():
    glm, exa = load_spec(GLM4), load_spec(EXAONE)
    assert deploy(glm, Layout(2, pp=2), "sglang").gpus[0].weight_bytes == \
        deploy(glm, Layout(2, pp=2), "vllm").gpus[0].weight_bytes
    sgl, vllm = deploy(exa, Layout(2, pp=2), "sglang"), deploy(exa, Layout(2, pp=2), "vllm")
    assert sgl.gpus[0].weight_bytes - vllm.gpus[0].weight_bytes == 102400 * 5120 * 2 // 2  # an lm_head slice


def test_each_files_own_refusals():
    exa = load_spec(EXAONE)  # 40 heads, 8 KV heads
    with pytest.raises(LayoutError, match=r"exaone4\.py cuts q/k/v/o over the attention group but counts its "
                                          r"heads over the whole --tp, so --attn-dp-size 2 fails"):
        deploy(exa, Layout(8, attn_dp=2), "sglang")
    cases = [
        (dict(exa.config, sliding_window_pattern=4, layer_types=None), r"exaone4\.py takes len\(\) of "
         r"sliding_window_pattern, which must be a string such as 'LLLG' \(this config's is 4\)"),
        ({k: v for k, v in exa.config.items() if k != "sliding_window_pattern"}, r"this config's is 4\)"),
        (dict(load_spec(OLMO).config, num_key_value_heads=4), r"olmo\.py builds as many KV heads as query "
         r"heads .* this config's 4 KV heads for 16 would not load"),
        (dict(load_spec(MINICPM).config, hidden_act="fatrelu"), r"minicpm\.py runs silu alone "
         r"\(hidden_act='fatrelu'\)"),
        (dict(load_spec(MINICPM).config, num_experts=8, num_experts_per_tok=2), r"minicpm\.py builds a dense "
         r"MLP in every layer"),
        (dict(load_spec(GEMMA).config, tie_word_embeddings=False), r"gemma\.py reads the logits off "
         r"embed_tokens whatever tie_word_embeddings says"),
    ]
    for cfg, message in cases:
        spec = load_spec({k: v for k, v in cfg.items() if v is not None})
        shard_map(spec, 2)  # vLLM rules map it
        with pytest.raises(TpvizError, match=message) as e:
            shard_map(spec, 2, rules="sglang")
        assert "\n" not in str(e.value)


def test_attention_dp_is_refused_where_the_file_cuts_attention_over_tp():
    with pytest.raises(LayoutError, match=r"glm4\.py cuts attention over the whole --tp"):
        deploy(load_spec(GLM4), Layout(4, attn_dp=2), "sglang")


def test_gpt_bigcode_splits_the_mlp_vllms_transformers_backend_keeps_whole():
    """gpt_bigcode.py cuts c_fc by column and c_proj by row; vLLM 0.33's backend has no TP plan for them, so
    it runs the MLP whole on every GPU and all-reduces attention alone."""
    from tpviz.deploy.traffic import comm_per_token
    spec = load_spec("bigcode/starcoderbase-1b")  # 24 layers, hidden 2048, MLP 8192
    sgl, vllm = shard_map(spec, 2, rules="sglang"), shard_map(spec, 2)
    split = {p.name.rsplit(".", 2)[-2] + "." + p.name.rsplit(".", 1)[-1]: (p.layer_class, p.split_dim)
             for p in sgl.params if ".mlp." in p.name}
    assert split == {"c_fc.weight": ("ColumnParallelLinear", 0), "c_fc.bias": ("ColumnParallelLinear", 0),
                     "c_proj.weight": ("RowParallelLinear", 1), "c_proj.bias": ("RowParallelLinear", None)}
    mlp = 24 * (2 * 8192 * 2048 + 8192) * 2  # both tables and c_fc's bias, bf16
    assert vllm.ranks[0].weight_bytes - sgl.ranks[0].weight_bytes == mlp // 2
    reduce = 24 * 2048 * 2  # one hidden state per layer (a 2-GPU ring sends it once)
    assert comm_per_token(spec, Layout(2), "vllm")["tp_all_reduce"] == reduce
    assert comm_per_token(spec, Layout(2), "sglang")["tp_all_reduce"] == 2 * reduce


def test_internlm2_regroups_wqkv_at_load_so_each_gpu_holds_its_own_heads():
    """internlm2.py views wqkv as [8 KV groups, (4 q, k, v), 128] and loads q, k and v apart: rank 0 of 2
    holds groups 0-3's q rows, then their k and v rows (vLLM loads the tensor as if it were [q | k | v]
    and all-gathers the output); KV heads may be replicated (tp 16), which vLLM's split_qkv refuses."""
    spec = load_spec("internlm/internlm2-chat-7b")  # 32 heads, 8 KV heads of 128, hidden 4096
    m = shard_map(spec, 2, rules="sglang")
    wqkv = m.tensor("model.layers.*.attention.wqkv.weight")
    group, q = 6 * 128, 4 * 128
    rank0 = sorted((p.param_start, p.start, p.stop) for p in wqkv.pieces if p.rank == 0)
    assert rank0 == ([(g * q, g * group, g * group + q) for g in range(4)]
                     + [(4 * q + g * 128, g * group + q, g * group + q + 128) for g in range(4)]
                     + [(4 * q + 512 + g * 128, g * group + q + 128, (g + 1) * group) for g in range(4)])
    assert [r.kv_heads for r in m.ranks] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert m.model.notes == ["SGLang's internlm2.py regroups wqkv into q, k and v as it loads it, so each "
                             "GPU holds the rows of its own heads and the forward gathers nothing"]
    m16 = shard_map(spec, 16, rules="sglang")
    assert [r.kv_heads for r in m16.ranks] == [[r // 2] for r in range(16)]
    with pytest.raises(TpvizError, match="split_qkv"):
        shard_map(spec, 16)
    with pytest.raises(LayoutError, match=r"Pipeline Parallel is not compatible with this model\."):
        deploy(spec, Layout(2, pp=2), "sglang")

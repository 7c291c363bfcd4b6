"""Hand-computed layouts of the architectures vLLM 0.33 added or reshaped (gpt-oss's expert names, Qwen-MoE's
expert limit, InternLM2's wqkv, PhiMoE's biased lm_head, Granite-MoE's stacked experts, ERNIE-4.5, and the
Transformers backend's Phi-2 and SmolLM3): each expected number is worked out by hand in the comments, then
compared with the map read off the real weight_loaders."""
import pytest

from tests.trace.test_layouts import L, spans
from tpviz import TPSizeError, shard_map
from tpviz.errors import ConfigError
from tpviz.config.sources import load_spec, presets


def test_gpt_oss_expert_tensors_use_checkpoint_names():
    """gpt-oss stores experts stacked: the checkpoint's names are model.layers.N.mlp.experts.gate_up_proj_bias
    / down_proj_bias, with the weights as gate_up_proj / down_proj (dequantized) or *_blocks + *_scales
    (mxfp4). There is no 'experts.gate_up_proj.weight' or '.bias' in any gpt-oss checkpoint."""
    m = shard_map("openai/gpt-oss-20b", 4)
    names = {t.name for t in m.tensors if t.name.startswith(L + "mlp.experts")}
    pre = L + "mlp.experts."
    assert {pre + "gate_up_proj_bias", pre + "down_proj_bias"} <= names, sorted(names)
    weights = names - {pre + "gate_up_proj_bias", pre + "down_proj_bias"}
    assert weights in ({pre + "gate_up_proj", pre + "down_proj"},
                       {pre + s for s in ("gate_up_proj_blocks", "gate_up_proj_scales", "down_proj_blocks",
                                          "down_proj_scales")}), sorted(weights)
    # and the non-expert names are the checkpoint's
    assert {L + "mlp.router.weight", L + "mlp.router.bias", L + "self_attn.sinks",
            L + "self_attn.q_proj.bias", L + "self_attn.o_proj.bias"} <= {t.name for t in m.tensors}


def test_qwen_moe_refuses_more_tp_ranks_than_experts_and_v2_has_no_score_bias():
    """vLLM 0.33 qwen3_moe.py raises when tp_size > num_experts (EP or not); nano-vllm rules have no such
    block."""
    cfg = dict(presets()["Qwen/Qwen3-30B-A3B"], num_experts=8, num_hidden_layers=2)
    with pytest.raises(TPSizeError) as e:
        shard_map(cfg, 16)
    assert str(e.value) == "tp_size=16 is greater than num_experts=8; vLLM's qwen3_moe MoE block refuses it"
    assert (e.value.quantity, e.value.value, e.value.tp) == ("num_experts", 8, 16)
    assert shard_map(cfg, 8).tp_size == 8
    v3 = {t.name for t in shard_map("deepseek-ai/DeepSeek-V3", 8).tensors}
    assert "model.layers.*.mlp.gate.e_score_correction_bias" in v3
    v2 = dict(presets()["deepseek-ai/DeepSeek-V3"], model_type="deepseek_v2",
              topk_method="group_limited_greedy", quantization_config=None)
    # V2 routers have none
    assert not any("e_score_correction_bias" in t.name for t in shard_map(v2, 8).tensors)


def test_internlm2_wqkv_rows_are_cut_as_if_qkv():
    """internlm2-chat-7b: wqkv is [8 KV groups x (4 q + k + v) x 128, 4096] on disk, but QKVParallelLinear
    loads it as [4096 q rows | 1024 k | 1024 v] (vLLM 0.33 internlm2.py): GPU 1 of 4 holds disk rows
    1024-2048, 4352-4608 and 5376-5632, which are no heads of its own."""
    m = shard_map("internlm/internlm2-chat-7b", 4)
    t = m.tensor("model.layers.*.attention.wqkv.weight")
    assert (t.shape, t.layer_class) == ([6144, 4096], "QKVParallelLinear")
    assert spans(m, t.name, 1) == [(1024, 2048, 0), (4352, 4608, 1024), (5376, 5632, 1280)]
    assert t.sections[:3] == [["q (KV group 0)", 0, 512, 0, ""], ["k (KV group 0)", 512, 640, 0, ""],
                              ["v (KV group 0)", 640, 768, 0, ""]]
    assert any("split_qkv" in n for n in m.model.notes)
    # what each GPU caches is its own KV heads, cut again after the gather: 2 of 8 at tp 4
    assert [r.kv_heads for r in m.ranks] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert m.ranks[0].kv_cache_bytes_per_token == 2 * 2 * 128 * 2 * 32
    with pytest.raises(TPSizeError, match="num_key_value_heads=8 is fewer than tp_size=16: InternLM2"):
        shard_map("internlm/internlm2-chat-7b", 16)


def test_phimoe_biased_lm_head_is_cut_like_its_rows():
    """PhiMoE (vLLM 0.33 models/phimoe.py): ParallelLMHead(bias=True), so lm_head.bias [vocab] splits by the
    same padded vocabulary blocks as lm_head.weight; q/k/v/o carry biases and the norms are LayerNorms."""
    cfg = {"model_type": "phimoe", "architectures": ["PhiMoEForCausalLM"], "hidden_size": 256,
           "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32, "intermediate_size": 64,
           "num_local_experts": 4, "num_experts_per_tok": 2, "vocab_size": 1000, "num_hidden_layers": 2,
           "sliding_window": 127}
    m = shard_map(cfg, 4)
    bias, head = m.tensor("lm_head.bias"), m.tensor("lm_head.weight")
    assert (bias.shape, bias.split_dim, bias.layer_class) == ([1000], 0, "ParallelLMHead")
    assert [spans(m, n, 3) for n in (bias.name, head.name)] == [[(768, 1000, 0)]] * 2  # 1024 padded / 4
    names = {t.name for t in m.tensors}
    assert {"model.layers.*.self_attn.o_proj.bias", "model.norm.bias",
            "model.layers.*.block_sparse_moe.experts.*.w3.weight"} <= names
    assert not any("sliding_window" in n for n in m.model.notes)  # windowed like Mixtral's


def test_granitemoe_stacked_experts_split_as_gate_and_up_halves():
    """Granite-3.1-1B-A400M: input_linear [32, 1024, 1024] is [gate 512 | up 512] per expert, which FusedMoE
    chunks in two and cuts over tp (vLLM 0.33 routed_experts.py load_weights); output_linear [32, 1024, 512]
    is row-split over the 512 intermediate columns."""
    m = shard_map("ibm-granite/granite-3.1-1b-a400m-instruct", 4)
    p = "model.layers.*.block_sparse_moe."
    gate_up, down = m.tensor(p + "input_linear.weight"), m.tensor(p + "output_linear.weight")
    assert (gate_up.shape, gate_up.layer_class, len(gate_up.experts)) == ([1024, 1024],
                                                                          "MergedColumnParallelLinear", 32)
    assert spans(m, gate_up.name, 1) == [(128, 256, 0), (640, 768, 128)]  # gate rows, then up rows
    assert (down.split_dim, spans(m, down.name, 3)) == (1, [(384, 512, 0)])
    assert m.tensor(p + "router.layer.weight").split_dim is None
    fp8 = {**load_spec("ibm-granite/granite-3.1-1b-a400m-instruct").config,
           "quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]}}
    with pytest.raises(ConfigError, match="stacked experts .input_linear, output_linear. is not modelled"):
        shard_map(fp8, 1)  # never drawn at bf16


def test_ernie4_5_is_vllms_llama_without_biases():
    """ERNIE-4.5-0.3B (vLLM 0.33 models/ernie45.py: a LlamaForCausalLM): Llama's names, tied embeddings,
    head_dim 128 with 16 heads over hidden 1024, two KV heads replicated from tp 4."""
    m = shard_map("baidu/ERNIE-4.5-0.3B-PT", 4)
    names = {t.name for t in m.tensors}
    assert "lm_head.weight" not in names and not any(n.endswith(".bias") for n in names)
    q = m.tensor("model.layers.*.self_attn.q_proj.weight")
    assert (q.shape, q.layer_class) == ([2048, 1024], "QKVParallelLinear")
    assert m.tensor("model.layers.*.self_attn.k_proj.weight").pieces[1].start == 0  # GPU 1 copies KV head 0
    assert m.total_weight_bytes == 360_748_032 * 2  # the card's 0.36B
    with pytest.raises(ConfigError, match="use_bias=True: ernie4_5's q/k/v/o and MLP biases"):
        shard_map({**load_spec("baidu/ERNIE-4.5-0.3B-PT").config, "use_bias": True}, 1)


def test_phi2_as_vllms_transformers_backend_cuts_it():
    """Phi-2 (vLLM 0.33: PhiForCausalLM through the Transformers backend): transformers' tp plan cuts q/k/v
    and fc1 by column, dense and fc2 by row; q/k/v load into one QKVParallelLinear; every linear, LayerNorm
    and the lm_head carry biases; 2.78B parameters."""
    m = shard_map("microsoft/phi-2", 4)
    weights = {n: m.tensor(f"model.layers.*.{n}.weight") for n in
               ("self_attn.q_proj", "self_attn.dense", "mlp.fc1", "mlp.fc2")}
    assert {n: (t.layer_class, t.split_dim) for n, t in weights.items()} == {
        "self_attn.q_proj": ("QKVParallelLinear", 0), "self_attn.dense": ("RowParallelLinear", 1),
        "mlp.fc1": ("ColumnParallelLinear", 0), "mlp.fc2": ("RowParallelLinear", 1)}
    assert {"lm_head.bias", "model.final_layernorm.bias", "model.layers.*.mlp.fc2.bias"} <= {
        t.name for t in m.tensors}
    assert m.total_weight_bytes == 2_779_683_840 * 2
    assert any("Transformers backend" in n for n in m.model.notes)
    with pytest.raises(ConfigError, match="qk_layernorm"):
        shard_map({**load_spec("microsoft/phi-2").config, "qk_layernorm": True}, 1)


def test_smollm3_is_a_tied_llama_on_the_transformers_backend():
    """SmolLM3-3B: Llama's names and splits (transformers' tp plan, q/k/v fused by vLLM's backend), tied
    embeddings, 4 KV heads each copied to 2 GPUs at tp 8; 3.08B parameters."""
    m = shard_map("HuggingFaceTB/SmolLM3-3B", 8)
    assert "lm_head.weight" not in {t.name for t in m.tensors}
    assert [r.kv_heads for r in m.ranks[:4]] == [[0], [0], [1], [1]]
    assert m.total_weight_bytes == 3_075_098_624 * 2
    assert any("Transformers backend" in n for n in m.model.notes)

"""The lightning indexer of DeepSeek Sparse Attention, as vLLM 0.33 builds it beside MLA
(models/deepseek_v32/attention.py, DeepseekV32Indexer): every tensor whole on every GPU."""
from tpviz.config.kinds import Mixer
from tpviz.config.spec import ModelSpec
from tpviz.archs.names import Names
from tpviz.plan.core import ParamPlan, merged, norm, replicated
from tpviz.plan.quantized import qplan
from tpviz.rules import RuleSet

WK_NOTE = ("wk (the one index key) and weights_proj (a weight per index head) in one bf16 table built as "
           "tp 1 and never quantized; an FP8 wk on disk (DeepSeek-V3.2's release) is dequantized to bf16 at "
           "load")
K_NORM_NOTE = "the index key's LayerNorm, float32 whatever the model dtype"


def indexer(spec: ModelSpec, names: Names, rules: RuleSet, m: Mixer, layers) -> list[ParamPlan]:
    """wq_b (a ReplicatedLinear from the q latent, quantized as the model is), wk_weights_proj (wk and
    weights_proj merged, disable_tp, unquantized) and k_norm (a float32 LayerNorm)."""
    p = f"{names.layer}{names.attn}indexer."
    rows = m.index_heads * m.index_dim
    plans = _list(replicated(f"{p}wq_b.weight", rows, spec.q_lora_rank, layers,
                             note="the index queries from the q latent, replicated",
                             q=qplan(spec, rules, f"{p}wq_b", layers)))
    plans += merged(f"{p}wk_weights_proj", [f"{p}wk", f"{p}weights_proj"], None, spec.hidden_size,
                    [m.index_dim, m.index_heads], "replicated", layers, None, whole=True, note=WK_NOTE)
    k_norm = norm(f"{p}k_norm", m.index_dim, layers, bias=True)
    for plan in k_norm:
        plan.element_bytes, plan.note = 4, K_NORM_NOTE
    return plans + k_norm


def _list(plan) -> list[ParamPlan]:
    return plan if isinstance(plan, list) else [plan]

"""DeepSeek-V2/V3 (vLLM 0.33 models/deepseek_v2.py): multi-head latent attention, shared experts, grouped
top-k routing; V3's router holds e_score_correction_bias (topk_method noaux_tc, its default and never
V2's)."""
from dataclasses import replace

from tpviz.archs.base import Arch
from tpviz.rules.sglang import Groups
from tpviz.archs.names import LLAMA

DEEPSEEK = replace(LLAMA, shared="shared_experts.")
_MLA = dict(names=DEEPSEEK, score_bias="noaux_tc", live="mla", live_moe=True, live_shared=True)

# deepseek_v2.py: MLA's q_b, kv_b and o over the attention group; --moe-dense-tp-size 1 and
# SGLANG_SHARED_EXPERT_TP1 keep the dense MLPs and the shared experts whole
# SGLang's one replicated latent table is fused_qkv_a_proj_with_mqa (a ReplicatedLinear)
SGLANG = Groups("deepseek_v2.py", "attn_tp", "attn_tp", "attn_tp", "switch", "switch", expert_limit="tp",
                params=(("fused_qkv_a_proj", "fused_qkv_a_proj_with_mqa"),))

RECORDS = [
    Arch("deepseek_v3", "DeepseekV3ForCausalLM", topk_method="noaux_tc",
         renormalize_default=True, routing="v3", sglang=replace(SGLANG, fuses_shared=True), **_MLA),
    Arch("deepseek_v2", "DeepseekV2ForCausalLM", routing="v2", sglang=SGLANG, **_MLA),
]

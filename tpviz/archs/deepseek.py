"""DeepSeek-V2/V3 (vLLM 0.33 models/deepseek_v2.py): multi-head latent attention, shared experts, grouped
top-k routing; V3's router holds e_score_correction_bias (topk_method noaux_tc, its default and never
V2's), which DeepseekV2MoE builds in float32 whatever the model's dtype. Kimi-K2.5 (models/kimi_k25.py) wraps
the same decoder, which it builds from text_config as DeepseekV2ForCausalLM under language_model.
DeepSeek-V3.2 and GLM-5 (DeepSeek Sparse Attention; vLLM 0.33 builds both by its package
vllm.models.deepseek_v32) are V3's decoder with a lightning indexer beside MLA (config/indexer.py,
plan/indexer.py) and the indexer's own key cache; deepseek_v2.py's own indexer (index_topk on a V2/V3 config)
stays refused."""
from dataclasses import replace

from tpviz.archs.base import Arch
from tpviz.rules.sglang_files import Groups
from tpviz.archs.names import LLAMA

DEEPSEEK = replace(LLAMA, shared="shared_experts.")
# deepseek_v2.py builds a lightning indexer beside MLA in every layer of a config with index_topk, and vLLM
# 0.33's registry builds DeepseekV32ForCausalLM from its own package (vllm.models.deepseek_v32): both refused
INDEXER = ("sparse-attention indexers (self_attn.indexer: wq_b, wk, weights_proj, k_norm) with a key cache "
           "of their own per token")
_MLA = dict(names=DEEPSEEK, score_bias="noaux_tc", score_bias_fp32=True, live="mla", live_moe=True,
            live_shared=True, unmodelled=(("index_topk", INDEXER),))

# deepseek_v2.py: MLA's q_b, kv_b and o over the attention group; --moe-dense-tp-size 1 and
# SGLANG_SHARED_EXPERT_TP1 keep the dense MLPs and the shared experts whole
# SGLang's one replicated latent table is fused_qkv_a_proj_with_mqa (a ReplicatedLinear)
SGLANG = Groups("deepseek_v2.py", "attn_tp", "attn_tp", "attn_tp", "switch", "switch", expert_limit="tp",
                fused_a="fused_qkv_a_proj_with_mqa")
_V3 = dict(topk_method="noaux_tc", renormalize_default=True, routing="v3",
           sglang=replace(SGLANG, fuses_shared="DeepSeek-V3"), **_MLA)

# DeepSeek Sparse Attention: no live block or SGLang groups for the indexer yet (refused there by name)
_DSA = dict(extra=("indexer",), unmodelled=(), live="", live_moe=False, live_shared=False, sglang=None)


def dsa_fields(cfg: dict) -> dict:
    """GLM-5's config as vLLM's DSA model reads it: transformers' class fills layer_types with
    'indexed_attention' for every layer, which the model file never reads."""
    return {k: v for k, v in cfg.items() if k != "layer_types"}


RECORDS = [
    Arch("deepseek_v3", "DeepseekV3ForCausalLM", **_V3),
    Arch("deepseek_v2", "DeepseekV2ForCausalLM", routing="v2", sglang=SGLANG, **_MLA),
    # kimi_k25.py: MoonViT (vision_tower.*) and its projector (mm_projector.*) beside the decoder (their
    # tensors in config/tower.py and plan/tower.py); vLLM builds the decoder as DeepSeek-V3's whatever
    # text_config's model_type says (kimi_k2 in some copies)
    Arch("kimi_k25", "KimiK25ForConditionalGeneration", text_model="deepseek_v3", tower="moonvit", **_V3),
    # kimi_vl.py: Kimi-VL's MoonViT (moonvit.py) and multi_modal_projector beside the same decoder, which it
    # builds from text_config as DeepseekV2ForCausalLM under language_model. (deepseek_v3 in the releases)
    Arch("kimi_vl", "KimiVLForConditionalGeneration", text_model="deepseek_v3", tower="moonvit_vl", **_V3),
    # DeepseekV32ForCausalLM (deepseek_v32/nvidia/model.py): V3's layers, MoE and head, DeepseekV32Attention's
    # indexer beside MLA; vLLM reads its config through DeepseekV3Config (config/hf.py); not run live
    Arch("deepseek_v32", "DeepseekV32ForCausalLM", **{**_V3, **_DSA}),
    # GlmMoeDsaForCausalLM: the same class under GLM-5's config (GlmMoeDsaConfig, which has no topk_method:
    # the router's score bias only when the config says noaux_tc)
    Arch("glm_moe_dsa", "GlmMoeDsaForCausalLM", **{**_V3, **_DSA, "topk_method": None},
         adapt=dsa_fields),
]

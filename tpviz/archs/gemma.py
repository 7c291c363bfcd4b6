"""Gemma 1-4 (vLLM 0.33 models/gemma*.py): tied embeddings, four norms a block from Gemma-2 on, sliding layers
in a fixed pattern, and Gemma-4's global layers with their own head size and K = V.

Gemma-4's MoE (26B-A4B, models/gemma4.py Gemma4DecoderLayer): when num_experts is set, every layer runs its
dense MLP (mlp.gate_proj/up_proj/down_proj) and, beside it, routed experts stored stacked as
experts.gate_up_proj [experts, 2 x moe_intermediate, hidden] and experts.down_proj [experts, hidden,
moe_intermediate], which FusedMoE cuts over tp (or places by EP). The router (router.proj, with router.scale
and router.per_expert_scale) is replicated; the block adds three norms. The MLP and the experts each
all-reduce.

Gemma-4's KV-shared layers (E2B, E4B; Gemma4Attention): the last num_kv_shared_layers attend over the KV
cache of the last earlier layer of their kind, so they build q_proj (column-parallel), q_norm and o_proj
alone, cache nothing, and with use_double_wide_mlp run an MLP twice intermediate_size (config/readers.py).
Checkpoints that still ship their k_proj / v_proj / k_norm have them dropped by vLLM's loader (the checkpoint
check names them so).

Gemma-4's per-layer input embeddings (E2B, E4B; plan/per_layer.py): embed_tokens_per_layer vocab-parallel,
per_layer_model_projection column-parallel and gathered, per_layer_projection_norm, and in every layer the
replicated per_layer_input_gate and per_layer_projection with post_per_layer_input_norm."""
from dataclasses import replace

from tpviz.archs.base import Arch
from tpviz.archs.names import LLAMA
from tpviz.errors import ConfigError
from tpviz.rules.sglang import Groups

GEMMA2 = replace(LLAMA, mixer_norms=("input_layernorm", "post_attention_layernorm"),
                 ffn_norms=("pre_feedforward_layernorm", "post_feedforward_layernorm"))
# the MoE block beside the MLP: the experts and router under the layer, the MLP drawn as its shared part
GEMMA4_MOE = replace(GEMMA2, mlp="", router="router.proj", expert_gate_up=("experts.gate_up_proj",),
                     expert_down="experts.down_proj", shared="mlp.", shared_size_key="intermediate_size",
                     ffn_norms=GEMMA2.ffn_norms + ("pre_feedforward_layernorm_2",
                                                   "post_feedforward_layernorm_1",
                                                   "post_feedforward_layernorm_2"))
GEMMA4_NAMES = {"": GEMMA2, "moe": GEMMA4_MOE}


def gemma4_fields(cfg: dict) -> dict:
    """Gemma-4's MoE keys under the common names: vLLM 0.33 builds the block when num_experts is not None,
    with top_k_experts, moe_intermediate_size (or expert_intermediate_size), and the layer's MLP beside it."""
    if cfg.get("num_experts") is None:
        return cfg
    for key in ("num_experts", "top_k_experts"):  # vLLM builds the block whenever num_experts is set
        if not cfg.get(key):
            raise ConfigError(f"num_experts={cfg['num_experts']!r} with {key}={cfg.get(key)!r}: vLLM 0.33's "
                              "Gemma-4 MoE block needs routed experts and a top-k")
    size = next((cfg[k] for k in ("moe_intermediate_size", "expert_intermediate_size")
                 if cfg.get(k) is not None), None)
    if size is None:  # vLLM raises: "Gemma4 MoE requires an expert intermediate size"
        raise ConfigError("num_experts is set but neither moe_intermediate_size nor expert_intermediate_size "
                          "is: vLLM 0.33's Gemma-4 MoE block needs the experts' size")
    return {**cfg, "moe_intermediate_size": size, "num_experts_per_tok": cfg.get("top_k_experts"),
            "shared_expert_intermediate_size": cfg.get("intermediate_size")}


def gemma4_variant(cfg: dict) -> str:
    return "" if cfg.get("num_experts") is None else "moe"  # "": the dense models, as before


_GEMMA3 = dict(names=GEMMA2, tied=True, embed_every_stage=True, qk_norm="head", sliding_pattern=6,
               length_counts_rope=False, live="gemma3",
               sglang=Groups("gemma3_causal.py", embed="replicated", pp=False))
_GEMMA4 = dict(names=GEMMA2, tied=True, embed_every_stage=True, qk_norm="head", global_attention=True,
               extra=("layer_scalar", "router_scales", "per_layer_inputs"), adapt=gemma4_fields,
               variant=gemma4_variant,
               names_for=lambda variant, _kv: GEMMA4_NAMES[variant], experts="fused", shared_reduce=True)

RECORDS = [
    Arch("gemma", "GemmaForCausalLM", tied=True, embed_every_stage=True),
    Arch("gemma2", "Gemma2ForCausalLM", GEMMA2, tied=True, sliding_pattern=2, live="gemma2",
         sglang=Groups("gemma2.py", pp=False), embed_every_stage=True),
    Arch("gemma3", "Gemma3ForConditionalGeneration", text_model="gemma3_text", tower="siglip", **_GEMMA3),
    Arch("gemma3_text", "Gemma3ForCausalLM", **_GEMMA3),
    Arch("gemma4", "Gemma4ForConditionalGeneration", text_model="gemma4_text", **_GEMMA4),
    Arch("gemma4_text", "Gemma4ForCausalLM", **_GEMMA4),
]

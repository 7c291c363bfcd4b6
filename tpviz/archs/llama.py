"""Llama and the decoders vLLM 0.33 runs as Llama (models/llama.py): Mistral, Mixtral, Phi-3, Llama-4, and
Llama-Nemotron's heterogeneous blocks (models/nemotron_nas.py); PhiMoE, Mixtral's experts with LayerNorms
(models/phimoe.py); ERNIE-4.5 (models/ernie45.py); Command-R (models/commandr.py)."""
from dataclasses import replace

from tpviz.archs.base import Arch
from tpviz.archs.ernie import SGL_ERNIE
from tpviz.rules.sglang import SGLANG_0_5_23
from tpviz.rules.sglang_files import Groups
from tpviz.archs.names import LLAMA
from tpviz.archs.sgl_checks import derived_head_dim

MIXTRAL = replace(LLAMA, mlp="block_sparse_moe.", expert_gate_up=("w1", "w3"), expert_down="w2")
PHI3 = replace(LLAMA, qkv_fused="qkv_proj", gate_up_fused="gate_up_proj")
COHERE = replace(LLAMA, ffn_norms=(), norm_bias="weight")
COHERE_UNMODELLED = (("use_qk_norm", "per-head q/k LayerNorms (use_qk_norm), which vLLM 0.33 cuts over "
                                     "the heads with a row-parallel loader"),
                     ("attention_bias", "q/k/v/o biases (vLLM 0.33's CohereAttention builds none, so its "
                                        "loader rejects them)"))
# Llama-4 (models/llama4.py): the MLP, the router and the shared expert under feed_forward; the routed
# experts fused per layer as Qwen3-VL-MoE's (experts.gate_up_proj [experts, hidden, 2 x intermediate])
LLAMA4 = replace(LLAMA, mlp="feed_forward.", router="router")


def cohere_fields(cfg: dict) -> dict:
    """vLLM's CohereForCausalLM ties the logits to embed_tokens whatever tie_word_embeddings says."""
    return {**cfg, "tie_word_embeddings": True}


def cohere2_fields(cfg: dict) -> dict:
    """Cohere2's sliding layers attend to [pos - sliding_window, pos]: vLLM 0.33 passes sliding_window + 1 to
    the attention and its cache (models/commandr.py), so each caches one token more than the config says."""
    window = cfg.get("sliding_window")
    grown = window + 1 if isinstance(window, int) and not isinstance(window, bool) and window > 0 else window
    return {**cohere_fields(cfg), "sliding_window": grown}


def llama4_fields(cfg: dict) -> dict:
    """Llama-4: the experts and the shared expert use intermediate_size, the dense MLP intermediate_size_mlp;
    every 4th layer is NoPE when no_rope_layers is not given (transformers' default)."""
    n = cfg.get("num_hidden_layers")
    if not cfg.get("no_rope_layers") and isinstance(n, int) and 0 < n <= 100_000:
        cfg["no_rope_layers"] = [int((i + 1) % cfg.get("no_rope_layer_interval", 4) != 0) for i in range(n)]
    size = cfg.get("intermediate_size", 8192)
    cfg.update(moe_intermediate_size=size, shared_expert_intermediate_size=size,
               intermediate_size=cfg.get("intermediate_size_mlp", 16384))
    return cfg


# SGLang 0.5.23's mllama4.py around llama4.py's Llama4Model: attention, the embedding and (under
# --enable-dp-lm-head) the lm_head over attn_tp, the dense MLPs and the shared expert over tp; its forward
# takes no pp_proxy_tensors (and Llama4Model builds every layer on every stage), so no PP
SGL_LLAMA4 = Groups("mllama4.py (llama4.py's Llama4Model)", "attn_tp", "attn_tp", "attn_tp", pp=False,
                    # the text-only class: LlamaForCausalLM's forward takes pp_proxy_tensors (SGLang runs PP)
                    pp_broken=("Llama4ForCausalLM", "Llama4ForCausalLM (llama4.py) accepts pipeline stages, "
                               "but its Llama4Model builds and runs every layer on each of them"))


def sgl_phimoe(spec, layout) -> str | None:
    """SGLang's phimoe.py: attention over the attention group with no DP gather, q/k/v/o biases by
    attention_bias, an lm_head tied by tie_word_embeddings."""
    attn_tp = SGLANG_0_5_23.attn_tp(layout)
    if 1 < attn_tp < layout.tp:  # dp_attention.py reject_attn_tp_shard_with_tp_reduce
        return (f"shards over the attention TP group ({attn_tp} ranks) but all-reduces over the full TP "
                f"group ({layout.tp} ranks): use --attn-dp-size 1")
    if attn_tp == 1 < layout.tp:
        return "has no attention-DP gather for its embedding, experts and lm_head: not modelled"
    if spec.config.get("attention_bias") is not True:
        return "builds q/k/v/o biases only under attention_bias, which this config leaves off: not modelled"
    if spec.tie_word_embeddings:
        return "ties its lm_head to embed_tokens (tie_word_embeddings), which vLLM never does: not modelled"
    return None


SGL_COHERE = Groups("commandr.py", pp=False, reduces_apart=True, check=derived_head_dim)

RECORDS = [
    Arch("llama", live="llama", sglang=Groups("llama.py", lm_head="attn_tp", head_every_stage=True)),
    # MistralForCausalLM / MixtralForCausalLM: no attention biases whatever the config says (transformers'
    # models)
    Arch("mistral", "MistralForCausalLM", qkv_bias=False, o_bias=False, window="model_wide", live="llama",
         sglang=Groups("mistral.py (llama.py's LlamaForCausalLM)", lm_head="attn_tp", head_every_stage=True)),
    Arch("mixtral", "MixtralForCausalLM", MIXTRAL, qkv_bias=False, o_bias=False,
         window="model_wide", live="llama", live_moe=True, needs_experts=True, routing="fp32",
         sglang=Groups("mixtral.py", head_every_stage=True), embed_every_stage=True),
    # models/phimoe.py: Mixtral's experts and names with LayerNorms, biases on q/k/v/o whatever the config
    # says, and a biased lm_head that is never tied; its sparsemixer routing is not run live
    Arch("phimoe", "PhiMoEForCausalLM", replace(MIXTRAL, norm_bias=True), qkv_bias=True, o_bias=True,
         extra=("head_bias",), needs_experts=True, window="model_wide", embed_every_stage=True,
         sglang=Groups("phimoe.py", "attn_tp", pp=False, check=sgl_phimoe, note=(
             "SGLang's phimoe.py builds its attention without the config's sliding_window: every layer "
             "attends to and caches the whole context"))),
    Arch("phi3", "Phi3ForCausalLM", PHI3, window="model_wide", live="llama", hf_partial_rotary=True,
         # transformers' 32000 may lie past the vocab
         hf_extra=(("pad_token_id", None), ("eos_token_id", None))),
    # models/ernie45.py: LlamaForCausalLM, its o_proj bias removed; Llama reads attention_bias / bias and
    # mlp_bias, which ERNIE's configs (use_bias) never set; GPT-J-style rotary pairs keep the live model off
    Arch("ernie4_5", "Ernie4_5ForCausalLM", qkv_bias=False, o_bias=False, tied=True, sglang=SGL_ERNIE,
         unmodelled=(("use_bias", "q/k/v/o and MLP biases (vLLM 0.33 builds it as a LlamaForCausalLM "
                                  "without them and skips them at load)"),)),
    # models/commandr.py: Llama's projections under one LayerNorm (weight only) that feeds attention and MLP
    # side by side, summed and all-reduced once; logits always from embed_tokens (lm_head is never loaded)
    Arch("cohere", "CohereForCausalLM", COHERE, qkv_bias=False, o_bias=False, tied=True, adapt=cohere_fields,
         joint_reduce=("*",),
         unmodelled=COHERE_UNMODELLED, embed_every_stage=True, sglang=SGL_COHERE),
    # the same model file, v2: layer_types' sliding layers windowed (one token wider), the full ones NoPE
    Arch("cohere2", "Cohere2ForCausalLM", COHERE, qkv_bias=False, o_bias=False, tied=True,
         adapt=cohere2_fields, joint_reduce=("*",), sliding_pattern=4,
         unmodelled=COHERE_UNMODELLED, sglang=replace(SGL_COHERE, note=""),  # the +1 is vLLM's
         note="vLLM 0.33 caches sliding_window + 1 tokens on Cohere2's sliding layers (they attend to "
              "[pos - sliding_window, pos])", embed_every_stage=True),
    # mllama4.py: its vision tower, pixel-shuffle adapter and projector (config/tower.py, plan/tower.py)
    Arch("llama4", "Llama4ForConditionalGeneration", LLAMA4, text_model="llama4_text", tower="llama4",
         adapt=llama4_fields, chunk=8192, experts="transposed", sglang=SGL_LLAMA4),
    Arch("llama4_text", "Llama4ForCausalLM", LLAMA4, adapt=llama4_fields, chunk=8192, experts="transposed",
         sglang=SGL_LLAMA4),
    # mistral3.py: PixtralHFVisionModel and its projector around the decoder text_config names (Mistral's
    # in Mistral-Small-3.x); no hf_class, because vLLM builds that decoder from text_config, so the wrapper's
    # class says nothing about it (Mistral-Small-4's text_config is no Mistral)
    Arch("mistral3", "", text_model="mistral", tower="pixtral", qkv_bias=False, o_bias=False,
         window="model_wide"),
    # llava.py, llava_next.py: LLaVA around the decoder its text_config names (LlavaConfig's default:
    # Llama); a Pixtral (Pixtral-12B in HF format), CLIP or SigLIP tower mapped, another left out and named
    Arch("llava", "", text_model="llama", tower="llava"),
    Arch("llava_next", "", text_model="llama", tower="llava_next"),
    # llava_onevision.py: SigLIP (or CLIP) as in llava.py, a projector of plain nn.Linears; its decoder Qwen2
    Arch("llava_onevision", "", text_model="qwen2", tower="llava_onevision"),
    Arch("nemotron-nas", "DeciLMForCausalLM"),  # its block_configs give each layer's attention and FFN
]

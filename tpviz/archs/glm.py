"""GLM-4.5 / 4.6 / 4.7 (vLLM 0.33 models/glm4_moe.py), GLM-4.7-Flash (glm4_moe_lite.py), GLM-4-0414
(glm4.py) and GLM-4.1V's wrapper around it (glm4_1v.py).

glm4_moe is DeepSeek-V3's FFN (the first first_k_dense_replace layers a dense gated MLP, the rest routed
experts through FusedMoE beside shared_experts of moe_intermediate_size x n_shared_experts, a replicated
float32 router that always holds e_score_correction_bias) under Llama-style GQA attention: q/k/v biased by
attention_bias, o_proj never, per-head q_norm / k_norm when use_qk_norm; partial rotary changes no weight.
glm4_moe_lite is the same FFN (its layers by first_k_dense_replace and moe_layer_freq) under DeepSeek-V2's
multi-head latent attention, which vLLM builds for it as for DeepSeek-V3. glm4 is a Llama decoder with two
more norms a layer (after attention and after the MLP) and gate/up fused on disk. All drop the MTP layers
(model.layers.<num_hidden_layers + i>.*), loaded by the draft model alone.
"""
from dataclasses import replace

from tpviz.archs.base import Arch
from tpviz.rules.sglang_files import Groups
from tpviz.archs.deepseek import DEEPSEEK
from tpviz.archs.names import LLAMA
from tpviz.errors import ConfigError, MissingFieldError

GLM4 = replace(LLAMA, gate_up_fused="gate_up_proj",
               mixer_norms=("input_layernorm", "post_self_attn_layernorm"),
               ffn_norms=("post_attention_layernorm", "post_mlp_layernorm"))


def silu_only(cfg: dict, model_file: str) -> None:
    """vLLM 0.33's GLM MLPs (and LlamaMLP, glm4.py's) raise for any activation but silu."""
    if cfg.get("hidden_act", "silu") != "silu":
        raise ConfigError(f"hidden_act={cfg['hidden_act']!r}: vLLM 0.33's {model_file} runs silu alone")


def required(cfg: dict, key: str, model_file: str, config_class: str) -> None:
    """A key vLLM's model file reads that the transformers config class gives no default for."""
    if cfg.get(key) is None:
        raise MissingFieldError(f"config is missing {key}, which vLLM 0.33's {model_file} reads "
                                f"({config_class} gives it no default)", key)


def glm4_moe_fields(cfg: dict) -> dict:
    """The config as vLLM's glm4_moe.py reads it: silu alone, and head_dim given (Glm4MoeAttention reads it;
    GLM-4.5's 96 heads of 128 are not hidden / heads)."""
    silu_only(cfg, "glm4_moe.py")
    required(cfg, "head_dim", "glm4_moe.py", "Glm4MoeConfig")
    return cfg


def glm4_moe_lite_fields(cfg: dict) -> dict:
    """vLLM's Glm4MoeLiteDecoderLayer reads config.first_k_dense_replace (Glm4MoeLiteConfig's mlp_layer_types
    is transformers' own reading, not vLLM's); silu alone."""
    silu_only(cfg, "glm4_moe_lite.py")
    required(cfg, "first_k_dense_replace", "glm4_moe_lite.py", "Glm4MoeLiteConfig")
    return cfg


def glm4_fields(cfg: dict) -> dict:
    """glm4.py's MLP is LlamaMLP, which runs silu alone."""
    silu_only(cfg, "glm4.py")
    return cfg


RECORDS = [
    # the router is GateLinear with params_dtype float32 and its bias a float32 Parameter, so both are sized
    # in float32 (transformers writes the router in the model dtype and keeps the bias in float32: a bf16
    # checkpoint's router differs from the map in stored bytes); tp above the expert count is not refused
    # (FusedMoE cuts moe_intermediate_size, as for DeepSeek-V3); qk_norm "use_qk_norm": per-head q/k
    # norms when the config's use_qk_norm is set (GLM-4.5, 4.6, 4.7), none otherwise (GLM-4.5-Air, and
    # Glm4MoeConfig's default)
    # SGLang 0.5.23's glm4_moe.py: attention, the embedding and (under --enable-dp-lm-head) the lm_head over
    # attn_tp, the dense MLPs over tp unless --moe-dense-tp-size 1, the shared expert over tp (no
    # SGLANG_SHARED_EXPERT_TP1), tp above the routed experts refused, the lm_head built on every stage
    Arch("glm4_moe", "Glm4MoeForCausalLM", DEEPSEEK, adapt=glm4_moe_fields, o_bias=False,
         qk_norm="use_qk_norm", score_bias="always", router_fp32=True,
         sglang=Groups("glm4_moe.py", "attn_tp", "attn_tp", "attn_tp", "switch", "tp", expert_limit="tp",
                       fuses_shared="GLM-4.5/4.6/4.7", head_every_stage=True)),
    # MLA from kv_lora_rank, as vLLM's is_deepseek_mla lists glm4_moe_lite; index_topk would add GLM-5's
    # sparse-attention indexer (Glm4MoeLiteModel.is_v32)
    Arch("glm4_moe_lite", "Glm4MoeLiteForCausalLM", DEEPSEEK, adapt=glm4_moe_lite_fields, score_bias="always",
         router_fp32=True, unmodelled=(("index_topk", "sparse-attention indexer layers (index_topk)"),)),
    # SGLang's glm4.py: the embedding over the attention group under attention DP, the rest over tp
    Arch("glm4", "Glm4ForCausalLM", GLM4, adapt=glm4_fields, o_bias=False,
         sglang=Groups("glm4.py", embed="attn_tp")),
    # GLM-4.1V (glm4_1v.py): its text_config built as Glm4ForCausalLM under the same names
    # (model.language_model.*), its vision tower under model.visual.* (plan/tower_glm.py)
    Arch("glm4v", "Glm4vForConditionalGeneration", GLM4, adapt=glm4_fields, o_bias=False,
         text_model="glm4v_text", tower="glm4v"),
    Arch("glm4v_text", "Glm4vForConditionalGeneration", GLM4, adapt=glm4_fields, o_bias=False),
]

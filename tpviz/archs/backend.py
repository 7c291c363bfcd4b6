"""The decoders vLLM 0.33 serves through its Transformers backend (registry: _TRANSFORMERS_SUPPORTED_MODELS;
model_executor/models/transformers/), built from transformers' own classes and cut as the backend cuts them.

The backend first fuses what it recognises, whatever the model's tp plan says: three sibling q/k/v linears
become one QKVParallelLinear (cut by heads) and the linear returning the attention output is row-parallel;
act(gate(x)) * up(x) becomes one MergedColumnParallelLinear with a row-parallel down_proj when the activation
has an ...AndMul kernel. Every other nn.Linear takes the style of transformers' base_model_tp_plan entry
matching it (colwise, rowwise, the gather variants), a style it does not know or no entry at all making it a
ReplicatedLinear. Vocab embeddings are VocabParallelEmbedding, the lm_head a ParallelLMHead, the norms
replicated. A MoE block's experts become one FusedMoE (TransformersMoEForCausalLM), loading the checkpoint's
per-expert gate_proj / up_proj / down_proj. OLMo-2/3 (olmo.py), GPTBigCode, GPT-NeoX and StarCoder2
(classic.py) are served the same way."""
from dataclasses import replace

from tpviz.archs.base import Arch
from tpviz.archs.names import LLAMA
from tpviz.archs.sgl_checks import mha_only
from tpviz.errors import ConfigError
from tpviz.rules.served import BACKEND
from tpviz.rules.sglang_files import Groups

PHI = replace(LLAMA, final_norm="model.final_layernorm", ffn_norms=(), norm_bias=True, o="dense", up="fc1",
              down="fc2")
# GLM-4 (-hf): gate and up stored as one gate_up_proj
GLM = replace(LLAMA, gate_up_fused="gate_up_proj")
HUNYUAN = replace(LLAMA, q_norm="query_layernorm", k_norm="key_layernorm")
VAULTGEMMA = replace(LLAMA, ffn_norms=("pre_feedforward_layernorm",))
# HunYuan's MoE block: the router's linear under gate.wg, one shared MLP (shared_mlp) beside the experts
HUNYUAN_MOE = replace(HUNYUAN, router="gate.wg", shared="shared_mlp.")
# FlexOlmo: OLMo-2's post-norm block (q/k norms over the whole projection) with routed experts
FLEX_OLMO = replace(LLAMA, mixer_norms=("post_attention_layernorm",),
                    ffn_norms=("post_feedforward_layernorm",))
# OLMo-1: LayerNorms without weight or bias (OlmoLayerNorm), so no norm tensor at all
OLMO = replace(LLAMA, mixer_norms=(), ffn_norms=(), final_norm="")
# activations the GLU fuser has an ...AndMul kernel for (transformers' class names them so)
CLA = (("use_cla", "cross-layer KV sharing (use_cla), which transformers' HunYuan classes do not build, so "
                   "vLLM's backend cannot load such a checkpoint"),)
GLU_ACTS = ("silu", "swish", "gelu", "gelu_pytorch_tanh")
FUSED = ("q/k/v fused into one QKVParallelLinear and gate/up into one MergedColumnParallelLinear, "
         "o_proj and down_proj row-parallel")


def note(cls: str, plan: str) -> str:
    """The record's note: which engine path serves it and how its tp plan cuts it."""
    return f"{BACKEND.format(cls)}: {plan}"


def sgl_olmo(spec, layout) -> str | None:
    """SGLang's olmo.py builds q/k/v from num_attention_heads alone and its attention without the
    quantization config (olmo.py OlmoAttention)."""
    if problem := mha_only(spec):
        return problem
    if spec.quant is not None:
        return "builds its attention without the quantization config: a quantized OLMo is not modelled"
    return None


def sgl_phi(spec, layout) -> str | None:
    """SGLang's phi.py: as many KV heads as query heads, and a separate biased lm_head whatever
    tie_word_embeddings says."""
    if problem := mha_only(spec):
        return problem
    if spec.tie_word_embeddings:
        return "builds its own lm_head whatever tie_word_embeddings says: a tied Phi is not modelled"
    width = spec.config.get("n_inner") or 4 * spec.hidden_size
    if width != spec.intermediate_size:
        return (f"sizes fc1 and fc2 by n_inner or 4 x hidden_size ({width}), not intermediate_size="
                f"{spec.intermediate_size}: this checkpoint would not load")
    return None


def sgl_hunyuan(spec, layout) -> str | None:
    """SGLang's hunyuan.py get_head_dim / check_head_dim: head_dim or attention_head_dim, and agreeing."""
    cfg = spec.config
    head, att = cfg.get("head_dim"), cfg.get("attention_head_dim")
    if head is None and att is None:
        return "raises 'Missing head dim config, try set head_dim in config.json'"
    if head is None and att != spec.hidden_size // spec.num_attention_heads:
        return (f"raises 'HunYuan model config error: calculated head_dim "
                f"{spec.hidden_size // spec.num_attention_heads} != attention_head_dim {att}'")
    if head is not None and att is not None and head != att:
        return f"raises 'HunYuan model config error: head_dim({head}) != attention_head_dim({att})'"
    return None


def phi_fields(cfg: dict) -> dict:
    """transformers' PhiModel: fc1 and fc2 always carry biases (no config key turns them off)."""
    return {**cfg, "mlp_bias": True}


def seed_oss_fields(cfg: dict) -> dict:
    """Seed-OSS: attention_bias on q/k/v, attention_out_bias on o_proj (transformers' SeedOssAttention)."""
    qkv, out = bool(cfg.get("attention_bias", True)), bool(cfg.get("attention_out_bias", False))
    if out and not qkv:
        raise ConfigError("attention_out_bias=True with attention_bias=False: an o_proj bias without q/k/v "
                          "biases, which tpviz does not model")
    return {**cfg, "add_qkv_bias": qkv, "attention_bias": out}


def hunyuan_fields(cfg: dict) -> dict:
    """No tp plan: an activation the GLU fuser cannot take would leave the MLP whole on every GPU. The
    classes always build query_layernorm / key_layernorm, so a checkpoint without them cannot load."""
    if cfg.get("use_qk_norm") is False:
        raise ConfigError("use_qk_norm=False: transformers' HunYuan classes build the q/k norms whatever it "
                          "says, so vLLM's backend would find them missing from the checkpoint")
    if (act := cfg.get("hidden_act", "silu")) not in GLU_ACTS:
        raise ConfigError(f"hidden_act={act!r}: vLLM 0.33's Transformers backend has no fused gate/up for "
                          "it and HunYuan has no tp plan, so its MLP would stay unsplit, which tpviz "
                          "does not draw")
    return cfg


def one_value(cfg: dict, key: str):
    """A per-layer list read as one value when every layer has it (tpviz maps one MoE shape a model)."""
    value = cfg.get(key)
    if isinstance(value, list):
        if not value or any(v != value[0] for v in value):
            raise ConfigError(f"{key} differs between layers; tpviz maps one MoE shape a model")
        return value[0]
    return value


def hunyuan_moe_fields(cfg: dict) -> dict:
    """transformers' HunYuanMoEV1: every layer holds num_experts experts and one shared MLP, all of
    intermediate_size, picking moe_topk. vLLM's FusedMoE takes moe_intermediate_size first, so a config whose
    moe_intermediate_size is another size cannot load; per-layer lists must agree."""
    cfg = experts_sized(hunyuan_fields(cfg))
    if isinstance(cfg.get("num_experts"), list):
        raise ConfigError("num_experts is a per-layer list: transformers' HunYuanMoEV1Experts needs one "
                          "count")
    if one_value(cfg, "num_shared_expert") not in (None, 1) or cfg.get("use_mixed_mlp_moe") is False:
        raise ConfigError("transformers' HunYuanMoEV1 builds one shared MLP in every layer; this config "
                          "says otherwise (num_shared_expert / use_mixed_mlp_moe), so vLLM's backend cannot "
                          "load it")
    return {**cfg, "num_experts_per_tok": one_value(cfg, "moe_topk"),
            "shared_expert_intermediate_size": cfg.get("intermediate_size")}


def experts_sized(cfg: dict) -> dict:
    """transformers' experts (HunYuan, FlexOlmo) are intermediate_size wide, while vLLM's backend builds
    FusedMoE at moe_intermediate_size when the config has one: another size there cannot load."""
    inter = cfg.get("intermediate_size")
    if (moe := one_value(cfg, "moe_intermediate_size")) not in (None, inter):
        raise ConfigError(f"moe_intermediate_size={moe} differs from intermediate_size={inter}: vLLM 0.33 "
                          "would build FusedMoE at the first, transformers' class stores experts at the "
                          "second")
    return {**cfg, "moe_intermediate_size": inter}


RECORDS = [
    # Phi-1/2: transformers' base_model_tp_plan cuts q/k/v and fc1 by column, dense and fc2 by row; q/k/v are
    # fused into one QKVParallelLinear, and the biased lm_head is vocab-parallel (transformers/causal.py)
    Arch("phi", "PhiForCausalLM", PHI, qkv_bias=True, o_bias=True, gated_mlp=False, adapt=phi_fields,
         extra=("head_bias",), unmodelled=(("qk_layernorm", "q/k LayerNorms (qk_layernorm)"),),
         sglang=Groups("phi.py", pp=False, check=sgl_phi),
         note="vLLM 0.33 serves PhiForCausalLM through its Transformers backend, which cuts it by "
              "transformers' own TP plan: q/k/v and fc1 by column, dense and fc2 by row"),
    # SmolLM3: Llama's names and tp plan; its NoPE layers change no weight
    Arch("smollm3", "SmolLM3ForCausalLM", tied=True,
         note="vLLM 0.33 serves SmolLM3ForCausalLM through its Transformers backend, which cuts it by "
              "transformers' own TP plan (Llama's: q/k/v and gate/up by column, o and down by row)"),
    # Seed-OSS: Llama's block, q/k/v biases (attention_bias, on by default) and o_proj's (attention_out_bias)
    Arch("seed_oss", "SeedOssForCausalLM", adapt=seed_oss_fields,
         note=note("SeedOssForCausalLM", f"Llama's tp plan, {FUSED}")),
    # Arcee (AFM): an ungated up_proj -> relu2 -> down_proj MLP, nothing for the GLU fuser to take
    Arch("arcee", "ArceeForCausalLM", gated_mlp=False,
         note=note("ArceeForCausalLM", "its tp plan cuts q/k/v (fused into one QKVParallelLinear) and "
                   "up_proj by column, o_proj and down_proj by row")),
    # HunYuan dense: per-head q/k RMSNorms after the rotary (query_layernorm, key_layernorm); its config
    # class has no base_model_tp_plan, so only the fusers cut it
    Arch("hunyuan_v1_dense", "HunYuanDenseV1ForCausalLM", HUNYUAN, qk_norm="head", adapt=hunyuan_fields,
         unmodelled=CLA,
         note=note("HunYuanDenseV1ForCausalLM", "its config class has no tp plan, so the backend's fusers "
                   f"alone cut it: {FUSED}")),
    # VaultGemma: Gemma's block with two norms (input, pre-feedforward), windows by layer_types
    Arch("vaultgemma", "VaultGemmaForCausalLM", VAULTGEMMA, tied=True,
         note=note("VaultGemmaForCausalLM", f"Gemma's tp plan, {FUSED}")),
    # CWM: Llama-3's block, three layers in four sliding (layer_types)
    Arch("cwm", "CwmForCausalLM", note=note("CwmForCausalLM", f"Llama's tp plan, {FUSED}")),
    # Jais-2: LayerNorms with biases, biased q/k/v/o and an ungated relu2 MLP (up_proj, down_proj)
    Arch("jais2", "Jais2ForCausalLM", replace(LLAMA, norm_bias=True), gated_mlp=False,
         note=note("Jais2ForCausalLM", "its tp plan cuts q/k/v (fused into one QKVParallelLinear) and "
                   "up_proj by column, o_proj and down_proj by row")),
    # OLMo-1 (the -hf checkpoints): Llama's projections and tp plan; clip_qkv clamps q/k/v, no weight
    Arch("olmo", "OlmoForCausalLM", OLMO, sglang=Groups("olmo.py", pp=False, check=sgl_olmo),
         note=note("OlmoForCausalLM", f"Llama's tp plan, {FUSED}; its LayerNorms hold no weights")),
    # GLM-4 (the -hf checkpoints): the QKV fuser takes its biased q/k/v; the MLP's one gate_up_proj matches no
    # fuser (it is chunked, not two linears), so its tp plan cuts it colwise_gather_output: a plain column
    # split of the 2 x intermediate rows, gathered whole on every GPU before down_proj's rowwise_split_input
    Arch("glm", "GlmForCausalLM", GLM, o_bias=False, mlp_gather=True,
         note=note("GlmForCausalLM", "q/k/v fused into one QKVParallelLinear, o_proj row-parallel; its tp "
                   "plan cuts the MLP's one gate_up_proj colwise_gather_output (one contiguous block of its "
                   "gate | up rows a GPU, not half of each; all-gathered, 2 x intermediate_size a token) and "
                   "down_proj rowwise_split_input (each GPU takes its columns of the gathered input, then "
                   "all-reduces)")),
    # HunYuan MoE (TransformersMoEForCausalLM): the experts one FusedMoE (external routing: transformers' gate
    # picks them), the shared MLP fused like a dense one and reduced with the experts
    Arch("hunyuan_v1_moe", "HunYuanMoEV1ForCausalLM", HUNYUAN_MOE, qk_norm="head", adapt=hunyuan_moe_fields,
         unmodelled=CLA, needs_experts=True, sglang=Groups(
             "hunyuan.py", expert_limit="tp", pp=False, check=sgl_hunyuan,
             params=(("model.layers.*.mlp.gate.wg.weight", "model.layers.*.mlp.gate.weight"),)),
         note=note("HunYuanMoEV1ForCausalLM", "its config class has no tp plan, so the backend's fusers and "
                   f"FusedMoE cut it: {FUSED}; the experts one FusedMoE, the router (gate.wg) replicated")),
    # FlexOlmo (TransformersMoEForCausalLM): the router (mlp.gate) routes inside vLLM's FusedMoE; its tp
    # plan's colwise_gather_output q/k/v never apply, as the QKV fuser takes them first; its experts'
    # packed_colwise / moe_tp_experts styles name no nn.Linear, as FusedMoE replaces the experts
    Arch("flex_olmo", "FlexOlmoForCausalLM", FLEX_OLMO, qk_norm="full", needs_experts=True,
         adapt=experts_sized,
         note=note("FlexOlmoForCausalLM", "q/k/v fused into one QKVParallelLinear (its tp plan's "
                   "colwise_gather_output never applies), q/k norms over every head all-gathered, the "
                   "experts one FusedMoE, the router replicated")),
]

"""Kimi-Linear (KimiLinearForCausalLM), as vLLM 0.33 builds it from its own package (vllm.models.kimi_k3,
nvidia/model.py) and reads its config with its own class (transformers_utils/configs/kimi_linear.py, not
transformers' KimiLinearConfig): Kimi Delta Attention in the layers linear_attn_config.kda_layers names
(1-based), DeepSeek's multi-head latent attention (NoPE) in every other, a dense MLP in the first
first_k_dense_replace layers and KimiMoE after them (routed experts w1/w3/w2, shared experts, a router whose
e_score_correction_bias vLLM builds in float32)."""
from dataclasses import replace

from tpviz.archs.base import Arch
from tpviz.archs.names import LLAMA
from tpviz.config.fields import read_int
from tpviz.errors import ConfigError

KIMI = replace(LLAMA, moe="block_sparse_moe.", shared="shared_experts.", expert_gate_up=("w1", "w3"),
               expert_down="w2")
MIN_PARTITION = 256  # KimiMoE's min_moe_intermediate_per_partition (its getattr default)
# the names other families give experts and layer kinds, which vLLM's KimiLinearConfig never reads
NOT_READ = ("num_local_experts", "n_routed_experts", "moe_num_experts", "num_experts_per_tok",
            "experts_per_token", "moe_topk", "shared_expert_intermediate_size", "n_shared_experts",
            "layer_types", "full_attention_interval", "sliding_window", "no_rope_layers",
            "attention_chunk_size",
            "moe_layers", "mlp_only_layers", "decoder_sparse_step", "interleave_moe_layer_step",
            "mamba_ssm_cache_dtype", "mamba_ssm_dtype")
# set, each builds layers tpviz does not draw (Kimi-K3's parts of the same model file)
UNMODELLED = {"attn_res_block_size": "block attention residuals (self_attention_res_proj, mlp_res_proj and "
                                     "their norms)",
              "routed_expert_hidden_size": "latent MoE (routed_expert_down_proj, routed_expert_up_proj)",
              "mla_use_output_gate": "MLA's output gate (g_proj)"}


def _kda_layers(cfg: dict, n: int) -> list[bool]:
    """Which layers are KDA: vLLM's is_kda_layer, (i + 1) in linear_attn_config.kda_layers; every other layer
    is MLA."""
    linear = cfg.get("linear_attn_config")
    if linear is None:
        return [False] * n
    if not isinstance(linear, dict) or None in (linear.get("kda_layers"), linear.get("full_attn_layers")):
        raise ConfigError("linear_attn_config must be an object with kda_layers and full_attn_layers, which "
                          "vLLM 0.33's KimiLinearConfig requires")
    kda = linear["kda_layers"]
    if not isinstance(kda, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in kda):
        raise ConfigError(f"linear_attn_config.kda_layers={str(kda)[:60]} must be a list of 1-based layer "
                          "numbers")
    return [i + 1 in kda for i in range(n)]


def kimi_linear_fields(cfg: dict) -> dict:
    """The config as vLLM's KimiLinearConfig reads it, onto tpviz's common keys: its defaults (no experts, no
    shared experts, first_k_dense_replace 0, max_position_embeddings 4096), KDA's dims from
    linear_attn_config, MLA in the other layers; the parts vLLM's file builds that tpviz does not draw,
    refused."""
    if cfg.get("quantization_config"):
        raise ConfigError("a quantized Kimi-Linear checkpoint is not modelled yet (its KDA projections' "
                          "stored scales); the bf16 release maps")
    for key, part in UNMODELLED.items():
        if cfg.get(key):
            raise ConfigError(f"{key}={cfg[key]!r}: Kimi-Linear's {part} is not modelled by tpviz yet")
    linear = cfg.get("linear_attn_config") if isinstance(cfg.get("linear_attn_config"), dict) else {}
    if linear.get("use_full_rank_gate"):
        raise ConfigError("linear_attn_config.use_full_rank_gate is set: Kimi-K3's full-rank KDA gate "
                          "(KimiK3DeltaAttention, g_proj inside in_proj_qkvgfab) is not modelled by tpviz "
                          "yet")
    if cfg.get("min_moe_intermediate_per_partition", MIN_PARTITION) != MIN_PARTITION:
        raise ConfigError("min_moe_intermediate_per_partition other than 256 is not modelled by tpviz yet")
    act = cfg.get("hidden_act", "silu")
    if act not in ("silu", "situ"):
        raise ConfigError(f"hidden_act={act!r}: vLLM 0.33's Kimi-Linear runs silu or situ only")
    n = read_int(cfg, "num_hidden_layers")
    kda = _kda_layers(cfg, n)
    out = {k: v for k, v in cfg.items() if k not in NOT_READ}
    if any(kda):
        out.update(kda_num_heads=linear.get("num_heads"), kda_head_dim=linear.get("head_dim"),
                   kda_conv_kernel=linear.get("short_conv_kernel_size"))
        for key in ("num_heads", "head_dim", "short_conv_kernel_size"):
            read_int({f"linear_attn_config.{key}": linear.get(key)}, f"linear_attn_config.{key}")
    if not all(kda):  # vLLM builds MLA in every other layer, NoPE only
        for key in ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
            read_int(cfg, key)
        if cfg.get("mla_use_nope") is not True:
            raise ConfigError("mla_use_nope must be true: vLLM 0.33's Kimi-Linear MLA is NoPE-only (it "
                              "asserts so)")
    experts = cfg.get("num_experts")
    if experts is not None:
        for key in ("num_experts_per_token", "moe_intermediate_size"):
            read_int(cfg, key)  # KimiMoE asserts both
        out["num_experts_per_tok"] = cfg["num_experts_per_token"]
        out["n_shared_experts"] = read_int(cfg, "num_shared_experts", default=0, minimum=0)
    out["num_experts"] = experts or 0
    out["layer_types"] = ["kda" if k else "full_attention" for k in kda]
    out["first_k_dense_replace"] = read_int(cfg, "first_k_dense_replace", default=0, minimum=0)
    out["moe_layer_freq"] = read_int(cfg, "moe_layer_freq", default=1)
    out.setdefault("max_position_embeddings", 4096)
    out.setdefault("rms_norm_eps", 1e-6)
    return out


def kimi_layout(layout, spec) -> str | None:
    """The layouts vLLM 0.33's Kimi-Linear runs otherwise than the map draws them, in one line each."""
    if layout.ep and layout.tp > 1 and layout.dp > 1 and layout.pp == 1:
        return ("vLLM 0.33 runs Kimi-Linear sequence-parallel under expert parallelism with tp > 1 and "
                "dp > 1 (pp 1): its dense MLP and shared experts are then whole on every GPU and attention "
                "is reduce-scattered, which tpviz does not draw yet")
    if not layout.ep and layout.dp > 1 and spec.is_moe and (
            spec.moe_intermediate_size // (layout.tp * layout.dp) < MIN_PARTITION):
        return (f"vLLM 0.33's KimiMoE pads each GPU's routed experts to {MIN_PARTITION} rows of "
                "moe_intermediate_size by tp but cuts them over tp × dp without expert parallelism; tpviz "
                "does not draw that padding yet (use expert parallelism, or dp 1)")
    return None


RECORDS = [
    Arch("kimi_linear", "KimiLinearForCausalLM", KIMI, own_config="KimiLinearConfig",
         adapt=kimi_linear_fields, score_bias="always", score_bias_fp32=True, state_dtype="float32",
         moe_min_partition=MIN_PARTITION, layout_problem=kimi_layout,
         note="vLLM 0.33 builds Kimi-Linear from its own package (vllm.models.kimi_k3); each KDA layer keeps "
              "a float32 recurrent state per sequence (--mamba-ssm-cache-dtype bfloat16 halves it), each MLA "
              "layer caches the compressed latent"),
]

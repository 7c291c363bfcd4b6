"""Granite-MoE (vLLM 0.33 models/granitemoe.py): a Llama decoder whose experts lie stacked on disk, the gate
and up halves of input_linear [experts, 2 x intermediate, hidden] and output_linear [experts, hidden,
intermediate]; FusedMoE chunks input_linear into gate and up, then cuts each over tp like any merged
gate/up. Its multipliers (embedding, attention, residual, logits) change no layout.

Granite-4 hybrids (models/granitemoehybrid.py): layer_types' Mamba2 layers (under mamba.) and attention
layers, each with Granite-MoE's experts and a shared MLP beside them (shared_mlp.input_linear [gate | up]
and output_linear), or the shared MLP alone when num_local_experts is 0. The experts and the shared MLP
all-reduce apart."""
from dataclasses import replace

from tpviz.archs.base import Arch
from tpviz.archs.names import LLAMA
from tpviz.config.fields import read_int
from tpviz.errors import ConfigError
from tpviz.rules.sglang_files import Groups

GRANITEMOE = replace(LLAMA, mlp="block_sparse_moe.", router="router.layer",
                     expert_gate_up=("input_linear",), expert_down="output_linear")
HYBRID_MOE = replace(GRANITEMOE, mamba="mamba.", shared="shared_mlp.", shared_outside=True,
                     shared_fused="input_linear", shared_down="output_linear")
HYBRID_DENSE = replace(LLAMA, mamba="mamba.", mlp="shared_mlp.", gate_up_fused="input_linear",
                       down="output_linear")
HYBRID_NAMES = {"moe": HYBRID_MOE, "dense": HYBRID_DENSE}
# transformers' GraniteMoeHybridConfig spells Mamba layers linear_attention and attention full_attention
KINDS = {"mamba": "mamba", "linear_attention": "mamba", "attention": "full_attention",
         "full_attention": "full_attention"}


def hybrid_fields(cfg: dict) -> dict:
    """The Mamba2 keys under the names the readers know, the shared MLP as the experts' shared one (or the
    dense MLP), and attention without RoPE unless position_embedding_type is rope (vLLM builds none)."""
    n = read_int(cfg, "num_hidden_layers")
    hidden, heads = read_int(cfg, "hidden_size"), read_int(cfg, "mamba_n_heads", default=128)
    inner = read_int(cfg, "mamba_expand", default=2) * hidden
    head = cfg.get("mamba_d_head", "auto")
    experts = read_int(cfg, "num_local_experts", default=0, minimum=0)
    shared = read_int(cfg, "shared_intermediate_size", default=0, minimum=0)
    if not experts and not shared:
        raise ConfigError("num_local_experts and shared_intermediate_size are both 0: its layers would have "
                          "no MLP at all, which tpviz does not model")
    kinds = cfg.get("layer_types")
    out = {**cfg, "mamba_num_heads": heads,
           "mamba_head_dim": inner // heads if head == "auto" else head,
           "n_groups": cfg.get("mamba_n_groups", 1), "ssm_state_size": cfg.get("mamba_d_state", 256),
           "conv_kernel": cfg.get("mamba_d_conv", 4), "use_conv_bias": cfg.get("mamba_conv_bias", True),
           "layer_types": [KINDS.get(k, k) for k in kinds] if isinstance(kinds, list) else ["mamba"] * n}
    if experts:
        out["shared_expert_intermediate_size"] = shared
    else:  # the shared MLP is the layer's one MLP
        out["intermediate_size"] = shared
    if cfg.get("position_embedding_type") != "rope":
        out["no_rope_layers"] = [0] * n
    return out


def hybrid_variant(cfg: dict) -> str:
    """Where the MLP lives: beside routed experts (moe), or alone (dense: Granite-4.0-H-Micro, -1B)."""
    return "moe" if cfg.get("num_local_experts") else "dense"


RECORDS = [
    Arch("granitemoe", "GraniteMoeForCausalLM", GRANITEMOE, qkv_bias=False, o_bias=False, experts="halves",
         needs_experts=True, embed_every_stage=True, sglang=Groups("granitemoe.py", pp=False)),
    Arch("granitemoehybrid", "GraniteMoeHybridForCausalLM", HYBRID_MOE, adapt=hybrid_fields,
         variant=hybrid_variant, names_for=lambda variant, _kv: HYBRID_NAMES[variant],
         experts="halves", shared_reduce=True,
         unmodelled=(("mamba_proj_bias", "Mamba2 in_proj/out_proj biases"),), embed_every_stage=True),
]

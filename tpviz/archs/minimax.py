"""MiniMax-M2 (vLLM 0.33 models/minimax_m2.py): every layer attention and routed experts (Mixtral's names
under block_sparse_moe, no shared expert); q_norm and k_norm span the whole q and k projections and are cut
over tp with them (the variances all-reduced); the router and its e_score_correction_bias are float32."""
from dataclasses import replace

from tpviz.archs.base import Arch
from tpviz.rules.sglang_files import Groups
from tpviz.archs.names import LLAMA
from tpviz.errors import ConfigError

MINIMAX_M2 = replace(LLAMA, mlp="block_sparse_moe.", expert_gate_up=("w1", "w3"), expert_down="w2",
                     score_bias="e_score_correction_bias")


def minimax_m2_fields(cfg: dict) -> dict:
    """The parts vLLM 0.33 builds whatever the config says: a config that says otherwise is refused, named."""
    if cfg.get("use_qk_norm") is False:
        raise ConfigError("use_qk_norm=false: vLLM 0.33's MiniMaxM2Attention builds q_norm and k_norm "
                          "whatever it says, so a checkpoint without them does not load")
    if cfg.get("qk_norm_type", "per_layer") != "per_layer":
        raise ConfigError(f"qk_norm_type={cfg['qk_norm_type']!r}: vLLM 0.33's minimax_m2.py norms q and k "
                          "over the whole projection (per_layer) alone")
    if cfg.get("shared_intermediate_size"):
        raise ConfigError(f"shared_intermediate_size={cfg['shared_intermediate_size']!r}: vLLM 0.33's "
                          "MiniMaxM2MoE builds no shared expert, so its tensors do not load")
    return cfg


RECORDS = [
    # vLLM's o_proj has no bias; q/k/v follow attention_bias; tp above the expert count is refused
    # SGLang 0.5.23's minimax_m2.py: attention and its q/k norms (MiniMaxM2RMSNormTP) over attn_tp, the
    # embedding over attn_tp under attention DP and built on every stage (no first-stage guard), the lm_head
    # over tp on the last, tp above the experts refused
    Arch("minimax_m2", "MiniMaxM2ForCausalLM", MINIMAX_M2, adapt=minimax_m2_fields, o_bias=False,
         qk_norm="tp", score_bias="use_routing_bias", router_fp32=True, moe_tp_limit=True,
         needs_experts=True, sglang=Groups("minimax_m2.py", "attn_tp", "attn_tp", expert_limit="tp",
                                           embed_every_stage=True)),
]

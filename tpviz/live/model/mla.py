"""DeepSeek-V2/V3 multi-head latent attention (MLA) from tpviz's TP layers, split as vLLM 0.33 splits it
(and as the explorer's plan, tpviz.plan.attention.mla, draws it).

The latent down-projections are replicated: every rank computes the whole compressed query (q_a_proj, when
q_lora_rank is set) and the whole compressed KV plus the one shared rope key (kv_a_proj_with_mqa), and
normalizes them (q_a_layernorm, kv_a_layernorm). The up-projections are column-parallel over heads: q_b_proj
(or q_proj) gives this rank's heads' [q_nope | q_rope], kv_b_proj its heads' [k_nope | v]. Attention runs over
the local heads, each key being [k_nope | the shared rope key], and o_proj (row-parallel) ends it with the
layer's only all_reduce. With q_lora_rank set, q_a_proj and kv_a_proj_with_mqa load into one replicated
table, fused_qkv_a_proj (kv from row q_lora_rank), and run as one GEMM, as in vLLM 0.33.

RoPE turns only the qk_rope_head_dim dims, in DeepSeek's interleaved pairs (x0, x1), (x2, x3), ... (vLLM:
is_neox_style=False; transformers' DeepSeek-V2 complex rotation, V3's rope_interleave), and with YaRN the
softmax scale gains mscale(factor, mscale_all_dim)^2, as transformers and vLLM both apply it.
"""
import math

import torch
import torch.nn.functional as F
from torch import nn

from tpviz.layers import (ColumnParallelLinear, MergedColumnParallelLinear, ReplicatedLinear, RMSNorm,
                          RowParallelLinear)
from tpviz.live.errors import LiveError
from tpviz.live.model.config import LiveConfig
from tpviz.live.model.decoder import DecoderLayer, RotaryEmbedding
from tpviz.live.model.rope import BY_LENGTH, frequencies, rope_parameters
from tpviz.rules import divide, ruleset
from tpviz.config.spec import ModelSpec


def mla_softmax_scale(spec: ModelSpec, rope: dict) -> float:
    """qk_head_dim^-0.5, times mscale^2 when a scaled RoPE sets mscale_all_dim (transformers'
    yarn_apply_mscale)."""
    scale = (spec.qk_nope_head_dim + spec.qk_rope_head_dim) ** -0.5
    all_dim, factor = rope.get("mscale_all_dim"), rope.get("factor")
    if rope.get("rope_type", "default") != "default" and all_dim and factor and factor > 1:
        m = 0.1 * all_dim * math.log(factor) + 1.0
        scale *= m * m
    return scale


class LatentRotary(RotaryEmbedding):
    """RoPE over the rope dims of q (per head) and of the one shared key: interleaved pairs, or (V3 with
    rope_interleave false) rotate-half as Llama. Frequencies and cos/sin multiplier as rope.frequencies
    gives."""

    def __init__(self, dim: int, theta: float, rope: dict, interleave: bool):
        super().__init__(dim, theta, rope)
        self.interleave = interleave

    def forward(self, positions: torch.Tensor, q: torch.Tensor,
                k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.interleave:
            return super().forward(positions, q, k)
        inv_freq, scale = self.inv_freq, self.scale
        if self.rope.get("rope_type") in BY_LENGTH:
            inv_freq, scale = frequencies(self.rope, self.head_dim, int(positions.max()) + 1)
        # [B, S, 1, dim/2]
        freqs = (positions[..., None].float() * inv_freq.to(positions.device))[:, :, None, :]
        cos, sin = freqs.cos(), freqs.sin()
        if scale != 1.0:
            cos, sin = cos * scale, sin * scale
        cos, sin = cos.to(q.dtype), sin.to(q.dtype)
        # pair (x[2i], x[2i+1]) turns by frequency i; written out as [evens | odds], as transformers' V3 does
        # (the same permutation of q and k leaves every q.k, so attention, unchanged)
        return tuple(torch.cat((x[..., 0::2] * cos - x[..., 1::2] * sin,
                                x[..., 1::2] * cos + x[..., 0::2] * sin), -1)
                     for x in (q, k))


class MLAttention(nn.Module):
    """Replicated latent projections -> this rank's heads (column-parallel up-projections) -> causal attention
    -> o_proj row-parallel. Parameter names are vLLM's (fused_qkv_a_proj, kv_b_proj, ...)."""

    def __init__(self, cfg: LiveConfig, tp_size: int, tp_rank: int):
        super().__init__()
        s = cfg.spec
        H, eps = s.hidden_size, s.rms_norm_eps  # vLLM's latent norms use rms_norm_eps (transformers: 1e-6)
        self.nope, self.rope_dim, self.v_dim = s.qk_nope_head_dim, s.qk_rope_head_dim, s.v_head_dim
        self.kv_lora_rank, qk = s.kv_lora_rank, s.qk_nope_head_dim + s.qk_rope_head_dim
        self.num_heads = divide(s.num_attention_heads, tp_size, "num_attention_heads")  # whole heads per rank
        self.latent = [s.q_lora_rank, s.kv_lora_rank + s.qk_rope_head_dim]
        # vLLM's merged latent table (disable_tp: tp 1 on every rank); SGLang's concatenation computes alike
        if s.q_lora_rank and not ruleset(cfg.rules).mla_fused_a(s.arch):
            self.fused_qkv_a_proj = MergedColumnParallelLinear(H, self.latent, 1, 0)
        elif s.q_lora_rank:
            self.q_a_proj = ReplicatedLinear(H, s.q_lora_rank, tp_size, tp_rank)
        if s.q_lora_rank:
            self.q_a_layernorm = RMSNorm(s.q_lora_rank, eps)
            self.q_b_proj = ColumnParallelLinear(s.q_lora_rank, s.num_attention_heads * qk, tp_size, tp_rank)
        else:  # DeepSeek-V2-Lite: one column-parallel q_proj, the KV latent alone
            self.q_proj = ColumnParallelLinear(H, s.num_attention_heads * qk, tp_size, tp_rank)
        if not hasattr(self, "fused_qkv_a_proj"):
            self.kv_a_proj_with_mqa = ReplicatedLinear(H, self.latent[1], tp_size, tp_rank)
        self.kv_a_layernorm = RMSNorm(s.kv_lora_rank, eps)
        self.kv_b_proj = ColumnParallelLinear(s.kv_lora_rank,
                                              s.num_attention_heads * (self.nope + self.v_dim), tp_size,
                                              tp_rank)
        self.o_proj = RowParallelLinear(s.num_attention_heads * s.v_head_dim, H, tp_size, tp_rank)
        self.scaling = cfg.attn_scale if cfg.attn_scale is not None else mla_softmax_scale(s, cfg.rope)
        self.rotary_emb = LatentRotary(s.qk_rope_head_dim, s.rope_theta, cfg.rope, cfg.rope_interleave)

    def forward(self, positions: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        B, S, _ = x.shape
        if hasattr(self, "fused_qkv_a_proj"):
            q_latent, kv_latent = self.fused_qkv_a_proj(x).split(self.latent, -1)
        else:  # the query latent, or (no q_lora_rank) the hidden state q_proj reads
            q_latent = self.q_a_proj(x) if hasattr(self, "q_a_proj") else x
            kv_latent = self.kv_a_proj_with_mqa(x)
        q = (self.q_b_proj(self.q_a_layernorm(q_latent)) if hasattr(self, "q_b_proj")
             else self.q_proj(q_latent))
        q_nope, q_rope = q.view(B, S, self.num_heads, -1).split([self.nope, self.rope_dim], -1)
        latent, k_rope = kv_latent.split([self.kv_lora_rank, self.rope_dim], -1)
        kv = self.kv_b_proj(self.kv_a_layernorm(latent)).view(B, S, self.num_heads, self.nope + self.v_dim)
        k_nope, v = kv.split([self.nope, self.v_dim], -1)
        # one rope key for all heads
        q_rope, k_rope = self.rotary_emb(positions, q_rope, k_rope[:, :, None, :])
        q = torch.cat((q_nope, q_rope), -1)
        k = torch.cat((k_nope, k_rope.expand(-1, -1, self.num_heads, -1)), -1)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # [B, local heads, S, dim]
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.scaling)
        return self.o_proj(o.transpose(1, 2).reshape(B, S, self.num_heads * self.v_dim))


class MLADecoderLayer(DecoderLayer):
    """Llama's pre-norm block with MLA; its FFN (dense, or DeepSeek's MoE with shared experts) as
    DecoderLayer's."""
    attention = MLAttention


def read_mla(cfg: LiveConfig, raw: dict) -> None:
    """The raw-config facts MLA needs: RoPE over qk_rope_head_dim, its layout, the softmax scale; notes where
    transformers and vLLM differ."""
    s = cfg.spec
    cfg.rope = rope_parameters(raw, s.qk_rope_head_dim, s.rope_theta)
    interleave = raw.get("rope_interleave", True) if s.arch.routing == "v3" else True  # V2: always pairs
    if not isinstance(interleave, bool):
        raise LiveError(f"rope_interleave={interleave!r} must be true or false")
    cfg.rope_interleave = interleave
    if not interleave:
        cfg.notes.append("rope_interleave=false: RoPE turns halves of the rope dims, as "
                         "transformers' DeepseekV3 does (vLLM 0.33 always turns interleaved pairs)")
    scaling = raw.get("rope_scaling") or raw.get("rope_parameters") or {}
    cfg.attn_scale = mla_softmax_scale(s, {**scaling, **cfg.rope} if isinstance(scaling, dict) else cfg.rope)
    if s.rms_norm_eps != 1e-6:
        cfg.notes.append(f"q_a_layernorm and kv_a_layernorm use rms_norm_eps={s.rms_norm_eps}, as vLLM does "
                         "(transformers' DeepSeek uses 1e-6 for them)")


def hf_mla_config(cfg: LiveConfig) -> dict:
    """The DeepSeek fields of a random checkpoint's config.json: MLA dims, RoPE, and the MoE layout and
    routing."""
    s, r = cfg.spec, cfg.routing
    rope = {k: v for k, v in cfg.rope.items() if k not in ("rotary_dim", "max_position_embeddings")}
    out = {"q_lora_rank": s.q_lora_rank or None, "kv_lora_rank": s.kv_lora_rank,
           "qk_nope_head_dim": s.qk_nope_head_dim, "qk_rope_head_dim": s.qk_rope_head_dim,
           "v_head_dim": s.v_head_dim, "num_key_value_heads": s.num_attention_heads,
           "head_dim": s.qk_rope_head_dim,  # transformers' DeepSeek reads head_dim as the rope part
           "rope_parameters": {"rope_type": "default", "rope_theta": s.rope_theta, **rope}}
    if "factor" in rope and "original_max_position_embeddings" in rope:
        out["max_position_embeddings"] = cfg.rope.get("max_position_embeddings") or int(
            rope["factor"] * rope["original_max_position_embeddings"])
    if s.arch.routing == "v3":
        out["rope_interleave"] = cfg.rope_interleave
    moe = s.moe_layers
    out["first_k_dense_replace"] = moe[0] if moe else s.num_hidden_layers
    # vLLM reads it; transformers does not
    if len(moe) > 1 and moe != list(range(moe[0], s.num_hidden_layers)):
        out["moe_layer_freq"] = moe[1] - moe[0]
    if s.is_moe:
        v3 = s.arch.routing == "v3"
        out.update(n_routed_experts=s.num_experts, num_experts_per_tok=s.num_experts_per_tok,
                   moe_intermediate_size=s.moe_intermediate_size,
                   n_shared_experts=s.shared_expert_intermediate_size // s.moe_intermediate_size or None,
                   norm_topk_prob=cfg.norm_topk_prob, routed_scaling_factor=r["routed_scaling_factor"],
                   n_group=r["n_group"], topk_group=r["topk_group"], scoring_func=r["scoring"],
                   topk_method="noaux_tc" if v3 else "group_limited_greedy" if r["grouped"] else "greedy")
    return out

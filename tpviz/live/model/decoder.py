"""A decoder-only Llama/Mistral/Qwen2/Qwen3/Phi-3 (and Mixtral/Qwen3-MoE, OLMo-2/3, Gemma-2/3) model built
only from tpviz's TP layers.

Parameter names mirror the Hugging Face checkpoint (`model.layers.0.self_attn.qkv_proj.weight`), with
q/k/v and gate/up fused as in nano-vllm; weights.py maps checkpoint names onto them. MoE blocks: moe.py;
OLMo's post-norm blocks with all-gathered q/k norms: blocks.py; Gemma's blocks: gemma.py; DeepSeek's MLA:
mla.py (with its MoE and Qwen2-MoE's shared expert in moe.py).
The model's config and a rank's Stage (pipeline layers, whole experts): config.py; the whole model:
causal_lm.py.
"""
import torch
import torch.nn.functional as F
from torch import nn

from tpviz.layers import MergedColumnParallelLinear, QKVParallelLinear, RMSNorm, RowParallelLinear
from tpviz.live.model.config import Cuts, LiveConfig
from tpviz.live.model.dp import DpRows
from tpviz.live.model.moe import SparseMoeBlock
from tpviz.live.model.rope import BY_LENGTH, frequencies


class RotaryEmbedding(nn.Module):
    """Rotate-half RoPE (Llama layout): pairs dimension i with i + rotary_dim/2 within the first rotary_dim
    (head_dim unless partial_rotary_factor) dims; frequencies and cos/sin multiplier as rope.frequencies
    gives."""

    def __init__(self, head_dim: int, theta: float, rope: dict | None = None):
        super().__init__()
        self.head_dim, self.rope = head_dim, {"rope_theta": theta, **(rope or {})}
        self.rotary_dim = self.rope.get("rotary_dim", head_dim)
        # a plain attribute, not a buffer, so model.to(bfloat16) cannot round the frequencies
        self.inv_freq, self.scale = frequencies(self.rope, head_dim)

    def forward(self, positions: torch.Tensor, q: torch.Tensor,
                k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        inv_freq, scale = self.inv_freq, self.scale
        if self.rope.get("rope_type") in BY_LENGTH:  # dynamic, longrope: chosen by this pass's length
            inv_freq, scale = frequencies(self.rope, self.head_dim, int(positions.max()) + 1)
        freqs = positions[..., None].float() * inv_freq.to(positions.device)  # [B, S, rotary_dim/2]
        emb = torch.cat((freqs, freqs), -1)[:, :, None, :]  # broadcast over heads
        cos, sin = emb.cos(), emb.sin()
        if scale != 1.0:  # YaRN / LongRoPE attention factor, in float32 as transformers applies it
            cos, sin = cos * scale, sin * scale
        cos, sin, d = cos.to(q.dtype), sin.to(q.dtype), self.rotary_dim
        if d == q.shape[-1]:
            return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        return tuple(torch.cat((x[..., :d] * cos + rotate_half(x[..., :d]) * sin, x[..., d:]),
                               -1) for x in (q, k))


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """(x1, x2) -> (-x2, x1) over the last dim's two halves."""
    x1, x2 = x.chunk(2, -1)
    return torch.cat((-x2, x1), -1)


class Attention(nn.Module):
    """QKV column-parallel -> RoPE -> causal SDPA over this rank's heads -> o_proj row-parallel."""

    def __init__(self, cfg: LiveConfig, tp_size: int, tp_rank: int):
        super().__init__()
        s = cfg.spec
        self.head_dim, self.sliding_window = s.head_dim, cfg.sliding_window
        self.qkv_proj = QKVParallelLinear(s.hidden_size, s.head_dim, s.num_attention_heads,
                                          s.num_key_value_heads,
                                          tp_size, tp_rank, bias=cfg.qkv_bias, rules=cfg.rules)
        self.num_heads, self.num_kv_heads = self.qkv_proj.num_heads, self.qkv_proj.num_kv_heads
        self.o_proj = RowParallelLinear(s.num_attention_heads * s.head_dim, s.hidden_size, tp_size, tp_rank,
                                        bias=cfg.o_bias)
        if s.qk_norm:  # Qwen3: RMSNorm over each head's head_dim, before RoPE
            self.q_norm = RMSNorm(s.head_dim, s.rms_norm_eps)
            self.k_norm = RMSNorm(s.head_dim, s.rms_norm_eps)
        self.rotary_emb = RotaryEmbedding(s.head_dim, s.rope_theta, cfg.rope)

    def heads(self, positions: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """This rank's q, k, v as [B, heads, S, head_dim]: split, normed (if the family norms), rotated, and k
        / v repeated for the local q heads they serve (GQA)."""
        B, S, _ = x.shape
        q_size, kv_size = self.qkv_proj.q_size, self.qkv_proj.kv_size
        q, k, v = self.qkv_proj(x).split([q_size, kv_size, kv_size], -1)
        q = q.view(B, S, self.num_heads, self.head_dim)
        k = k.view(B, S, self.num_kv_heads, self.head_dim)
        v = v.view(B, S, self.num_kv_heads, self.head_dim)
        if hasattr(self, "q_norm"):
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = self.rotary_emb(positions, q, k)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        group = self.num_heads // self.num_kv_heads
        if group > 1:
            k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
        return q, k, v

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Causal (windowed) SDPA over this rank's heads."""
        S = q.shape[2]
        if self.sliding_window and S > self.sliding_window:
            i = torch.arange(S, device=q.device)
            mask = (i[None, :] <= i[:, None]) & (i[:, None] - i[None, :] < self.sliding_window)
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    def forward(self, positions: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        B, S, _ = x.shape
        o = self.attend(*self.heads(positions, x))
        return self.o_proj(o.transpose(1, 2).reshape(B, S, self.num_heads * self.head_dim))


class MLP(nn.Module):
    """gate_up column-parallel (merged) -> SiLU(gate) * up -> down row-parallel."""

    def __init__(self, cfg: LiveConfig, tp_size: int, tp_rank: int):
        super().__init__()
        s = cfg.spec
        self.gate_up_proj = MergedColumnParallelLinear(s.hidden_size,
                                                       [s.intermediate_size] * 2, tp_size, tp_rank,
                                                       bias=cfg.mlp_bias)
        self.down_proj = RowParallelLinear(s.intermediate_size, s.hidden_size, tp_size,
                                           tp_rank, bias=cfg.mlp_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, -1)
        return self.down_proj(F.silu(gate) * up)


class DecoderLayer(nn.Module):
    """Pre-norm residual block: h += attn(norm(h)); h += mlp(norm(h)), the MLP dense or a sparse MoE block.
    With an SGLang layout's cuts each part is cut over its own group, and under attention DP the FFN runs
    every group's rows when it spans them (rows, dp.DpRows)."""
    attention = Attention  # DeepSeek: mla.MLAttention (mla.MLADecoderLayer)

    def __init__(self, cfg: LiveConfig, tp_size: int, tp_rank: int, index: int = 0,
                 experts: tuple[int, ...] | None = None, cuts: Cuts | None = None,
                 rows: DpRows | None = None):
        super().__init__()
        s = cfg.spec
        self.rows = rows or DpRows(None)
        self.input_layernorm = RMSNorm(s.hidden_size, s.rms_norm_eps)
        self.self_attn = self.attention(cfg, *(cuts.of("attention") if cuts else (tp_size, tp_rank)))
        self.post_attention_layernorm = RMSNorm(s.hidden_size, s.rms_norm_eps)
        if s.is_moe and index in s.moe_layers:  # Qwen3-MoE's mlp_only_layers stay dense (spec.dense_layers)
            self.ffn_name = s.arch.names.mlp.rstrip(".")  # Mixtral: block_sparse_moe, Qwen3-MoE: mlp
            self.add_module(self.ffn_name, SparseMoeBlock(s, cfg.norm_topk_prob, tp_size, tp_rank, experts,
                                                          cfg.routing, cuts))
            self.ffn_width = cuts.tp if cuts else tp_size
        else:
            dense = cuts.of("dense") if cuts else (tp_size, tp_rank)
            self.ffn_name, self.mlp, self.ffn_width = "mlp", MLP(cfg, *dense), dense[0]

    def forward(self, positions: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        h = h + self.self_attn(positions, self.input_layernorm(h))
        ffn = getattr(self, self.ffn_name)
        return h + self.rows.run(ffn, self.post_attention_layernorm(h), self.ffn_width)

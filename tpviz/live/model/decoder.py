"""A decoder-only Llama/Mistral/Qwen2/Qwen3/Phi-3 (and Mixtral/Qwen3-MoE, OLMo-2/3, Gemma-2/3) model built only
from tpviz's TP layers.

Parameter names mirror the Hugging Face checkpoint (`model.layers.0.self_attn.qkv_proj.weight`), with
q/k/v and gate/up fused as in nano-vllm; weights.py maps checkpoint names onto them. MoE blocks: moe.py;
OLMo's post-norm blocks with all-gathered q/k norms: families.py; Gemma's blocks: gemma.py; DeepSeek's MLA:
mla.py (with its MoE and Qwen2-MoE's shared expert in moe.py).
A Stage (pipeline parallelism, expert parallelism) says which layers and experts one rank builds.
"""
from dataclasses import asdict, dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from tpviz.layers import (MergedColumnParallelLinear, ParallelLMHead, QKVParallelLinear, RMSNorm,
                          RowParallelLinear, VocabParallelEmbedding)
from tpviz.live.errors import LiveError
from tpviz.live.model.moe import SparseMoeBlock
from tpviz.live.model.rope import BY_LENGTH, frequencies
from tpviz.deploy.parallel import stage_layers
from tpviz.rules import ruleset
from tpviz.archs import REGISTRY
from tpviz.config.spec import ModelSpec

GELU_BLOCKS = ("gemma2", "gemma3")  # Gemma's GELU-tanh MLPs (gemma.read_gemma); the others run SiLU


@dataclass
class LiveConfig:
    """What the live model needs: the normalized spec plus the few raw-config facts the spec leaves out."""
    spec: ModelSpec
    mlp_bias: bool = False  # Llama's mlp_bias: gate/up/down carry biases (down is row-parallel)
    sliding_window: int | None = None  # Mistral/Mixtral: attend to at most this many previous tokens
    norm_topk_prob: bool = False  # MoE: renormalize the top-k routing weights (Mixtral always does)
    rope: dict = field(default_factory=dict)  # rope.rope_parameters(): type, theta, rotated dims, scaling; {} plain
    local_rope: dict | None = None  # OLMo-3, Gemma-3: the sliding layers' own (unscaled) RoPE, as rope_parameters()
    attn_scale: float | None = None  # Gemma: query_pre_attn_scalar ** -0.5; None: head_dim ** -0.5
    attn_softcap: float | None = None  # Gemma-2: attention scores become c * tanh(scores / c)
    final_softcap: float | None = None  # Gemma: logits become c * tanh(logits / c), after the vocabulary gather
    embed_scale: float | None = None  # Gemma: embeddings times sqrt(hidden_size), rounded to the activation dtype
    routing: dict = field(default_factory=dict)  # DeepSeek: grouped top-k (moe.routing_config); {} softmax top-k
    rope_interleave: bool = False  # DeepSeek MLA: RoPE turns (x0, x1) pairs (GPT-J style), not halves
    swiglu: dict = field(default_factory=dict)  # gpt-oss: the experts' clamped SwiGLU {"alpha", "limit"}
    rules: str = "vllm"
    notes: list[str] = field(default_factory=list)

    @property
    def qkv_bias(self) -> bool:
        return self.spec.attention_bias

    @property
    def o_bias(self) -> bool:
        return self.spec.o_proj_bias

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "LiveConfig":
        return cls(**{**d, "spec": ModelSpec.from_dict(d["spec"])})


@dataclass(frozen=True)
class Stage:
    """One rank's share beyond its TP slice: its pipeline stage's decoder layers and, under expert
    parallelism, the global experts it holds whole (vLLM: PPMissingLayer elsewhere, an expert_map)."""
    layers: tuple[int, ...]
    first: bool = True
    last: bool = True
    experts: tuple[int, ...] | None = None

    @classmethod
    def of(cls, spec: ModelSpec, tp_size: int = 1, tp_rank: int = 0, pp_size: int = 1, pp_rank: int = 0,
           ep: bool = False, placement: str = "linear", rules: str = "vllm") -> "Stage":
        """The rule set's layer partition for pp_rank and, with ep, the experts of EP rank tp_rank (EP size = tp,
        dp 1)."""
        rules = ruleset(rules)
        layers = stage_layers(spec.num_hidden_layers, pp_size, rules)[pp_rank]
        experts = tuple(rules.expert_placement(spec.num_experts, tp_size, placement)[tp_rank]) if ep else None
        return cls(tuple(layers), pp_rank == 0, pp_rank == pp_size - 1, experts)

    def elsewhere(self, name: str) -> bool:
        """A checkpoint tensor another stage or EP rank holds: this rank skips it without reading it."""
        parts = name.split(".")
        if parts[:2] == ["model", "layers"] and len(parts) > 2 and parts[2].isdigit():
            if int(parts[2]) not in self.layers:
                return True
            k = parts.index("experts") if "experts" in parts else -1
            return (self.experts is not None and 0 <= k < len(parts) - 1 and parts[k + 1].isdigit()
                    and int(parts[k + 1]) not in self.experts)
        if parts[:2] == ["model", "embed_tokens"]:
            return not self.first
        return not self.last and (parts[:2] == ["model", "norm"] or parts[0] == "lm_head")


def live_types(block: str | None = None) -> list[str]:
    """The model_types Run live runs (with this block, when given), from the registry."""
    return [t for t, a in REGISTRY.items() if a.live and (block is None or a.live == block)]


def check_supported(spec: ModelSpec) -> None:
    """Raise a one-line LiveError unless the live model can run this architecture faithfully."""
    arch, mla = spec.arch, live_types("mla")
    if spec.is_mla and arch.live != "mla":
        raise LiveError(f"{spec.name} uses MLA ({spec.model_type}), which the live check runs for "
                        f"{', '.join(mla)} only")
    if arch.live == "mla" and not spec.is_mla:
        raise LiveError(f"{spec.name} is a {spec.model_type} config without kv_lora_rank; the live check runs "
                        "DeepSeek with MLA only")
    if spec.is_moe and (not arch.live_moe or (spec.shared_expert_intermediate_size and not arch.live_shared)):
        moe = [t for t, a in REGISTRY.items() if a.live_moe and a.live != "gpt_oss"]
        shared = [t for t, a in REGISTRY.items() if a.live_shared]
        raise LiveError(f"{spec.name} uses {spec.model_type} MoE, which the live check does not support yet; "
                        f"it runs MoE for {', '.join(moe)} only (shared experts: {', '.join(shared)})")
    if arch.live == "mla" and (spec.attention_bias or spec.mlp_bias):
        raise LiveError(f"{spec.name} sets attention_bias or mlp_bias; vLLM 0.33 builds DeepSeek's projections "
                        "without biases, and so does the live check")
    if not arch.live:
        raise LiveError(f"the live check runs {', '.join(live_types())} models; "
                        f"{spec.name} is model_type {spec.model_type!r}")
    if arch.needs_experts and not spec.is_moe:
        raise LiveError(f"{spec.name} is a {arch.hf_class} config without experts (num_local_experts)")
    if spec.is_moe and not 1 <= spec.num_experts_per_tok <= spec.num_experts:
        raise LiveError(f"num_experts_per_tok={spec.num_experts_per_tok} must be between 1 and "
                        f"num_experts={spec.num_experts}")
    if spec.hidden_act != "silu" and arch.live not in GELU_BLOCKS:  # Gemma's GELU-tanh: gemma.read_gemma
        raise LiveError(f"hidden_act={spec.hidden_act!r}: the live check runs SiLU-gated MLPs only")


class RotaryEmbedding(nn.Module):
    """Rotate-half RoPE (Llama layout): pairs dimension i with i + rotary_dim/2 within the first rotary_dim
    (head_dim unless partial_rotary_factor) dims; frequencies and cos/sin multiplier as rope.frequencies gives."""

    def __init__(self, head_dim: int, theta: float, rope: dict | None = None):
        super().__init__()
        self.head_dim, self.rope = head_dim, {"rope_theta": theta, **(rope or {})}
        self.rotary_dim = self.rope.get("rotary_dim", head_dim)
        # a plain attribute, not a buffer, so model.to(bfloat16) cannot round the frequencies
        self.inv_freq, self.scale = frequencies(self.rope, head_dim)

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
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
        return tuple(torch.cat((x[..., :d] * cos + rotate_half(x[..., :d]) * sin, x[..., d:]), -1) for x in (q, k))


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
        self.qkv_proj = QKVParallelLinear(s.hidden_size, s.head_dim, s.num_attention_heads, s.num_key_value_heads,
                                          tp_size, tp_rank, bias=cfg.qkv_bias, rules=cfg.rules)
        self.num_heads, self.num_kv_heads = self.qkv_proj.num_heads, self.qkv_proj.num_kv_heads
        self.o_proj = RowParallelLinear(s.num_attention_heads * s.head_dim, s.hidden_size, tp_size, tp_rank,
                                        bias=cfg.o_bias)
        if s.qk_norm:  # Qwen3: RMSNorm over each head's head_dim, before RoPE
            self.q_norm = RMSNorm(s.head_dim, s.rms_norm_eps)
            self.k_norm = RMSNorm(s.head_dim, s.rms_norm_eps)
        self.rotary_emb = RotaryEmbedding(s.head_dim, s.rope_theta, cfg.rope)

    def heads(self, positions: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """This rank's q, k, v as [B, heads, S, head_dim]: split, normed (if the family norms), rotated, and k / v
        repeated for the local q heads they serve (GQA)."""
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
        self.gate_up_proj = MergedColumnParallelLinear(s.hidden_size, [s.intermediate_size] * 2, tp_size, tp_rank,
                                                       bias=cfg.mlp_bias)
        self.down_proj = RowParallelLinear(s.intermediate_size, s.hidden_size, tp_size, tp_rank, bias=cfg.mlp_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, -1)
        return self.down_proj(F.silu(gate) * up)


class DecoderLayer(nn.Module):
    """Pre-norm residual block: h += attn(norm(h)); h += mlp(norm(h)), the MLP dense or a sparse MoE block."""
    attention = Attention  # DeepSeek: mla.MLAttention (mla.MLADecoderLayer)

    def __init__(self, cfg: LiveConfig, tp_size: int, tp_rank: int, index: int = 0,
                 experts: tuple[int, ...] | None = None):
        super().__init__()
        s = cfg.spec
        self.input_layernorm = RMSNorm(s.hidden_size, s.rms_norm_eps)
        self.self_attn = self.attention(cfg, tp_size, tp_rank)
        self.post_attention_layernorm = RMSNorm(s.hidden_size, s.rms_norm_eps)
        if s.is_moe and index in s.moe_layers:  # Qwen3-MoE's mlp_only_layers stay dense (spec.dense_layers)
            self.ffn_name = s.arch.names.mlp.rstrip(".")  # Mixtral: block_sparse_moe, Qwen3-MoE: mlp
            self.add_module(self.ffn_name, SparseMoeBlock(s, cfg.norm_topk_prob, tp_size, tp_rank, experts,
                                                          cfg.routing))
        else:
            self.ffn_name, self.mlp = "mlp", MLP(cfg, tp_size, tp_rank)

    def forward(self, positions: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        h = h + self.self_attn(positions, self.input_layernorm(h))
        return h + getattr(self, self.ffn_name)(self.post_attention_layernorm(h))


class Elsewhere(nn.Module):
    """A decoder layer held by another pipeline stage (vLLM's PPMissingLayer): no parameters here."""


class DecoderModel(nn.Module):
    """`model.*` of the checkpoint: embedding (first stage), this stage's decoder layers, final norm (last)."""

    def __init__(self, cfg: LiveConfig, tp_size: int, tp_rank: int, stage: Stage):
        super().__init__()
        s = cfg.spec
        if stage.first:
            self.embed_tokens = VocabParallelEmbedding(s.vocab_size, s.hidden_size, tp_size, tp_rank, rules=cfg.rules)
        from tpviz.live.model.blocks import decoder_layer, final_norm  # its blocks build on this module's
        self.layers = nn.ModuleList(decoder_layer(cfg, tp_size, tp_rank, i, stage.experts) if i in stage.layers
                                    else Elsewhere() for i in range(s.num_hidden_layers))
        if stage.last:
            self.norm = final_norm(cfg)


class LiveForCausalLM(nn.Module):
    """The model for one rank; forward returns (logits, gathered to the last stage's TP rank 0, else None;
    the hidden state after each of this stage's steps, the last of which a pipeline stage sends on)."""

    def __init__(self, cfg: LiveConfig, tp_size: int = 1, tp_rank: int = 0, stage: Stage | None = None):
        super().__init__()
        check_supported(cfg.spec)
        self.cfg, self.tp_size, self.tp_rank = cfg, tp_size, tp_rank
        self.stage = stage = stage or Stage(tuple(range(cfg.spec.num_hidden_layers)))
        self.model = DecoderModel(cfg, tp_size, tp_rank, stage)
        if stage.last:
            tied = cfg.spec.tie_word_embeddings and stage.first  # same padded row block per rank: one Parameter
            with torch.device("meta" if tied else torch.get_default_device()):  # a tied head allocates nothing
                self.lm_head = ParallelLMHead(cfg.spec.vocab_size, cfg.spec.hidden_size, tp_size, tp_rank,
                                              rules=cfg.rules)
            if tied:
                self.lm_head.weight = self.model.embed_tokens.weight

    def forward(self, input_ids: torch.Tensor, h: torch.Tensor | None = None
                ) -> tuple[torch.Tensor | None, dict[str, torch.Tensor]]:
        """Logits [B, S, vocab] (padding trimmed) on the last stage, and the hidden state after each step;
        `h` is what the previous pipeline stage sent (None on the first stage)."""
        positions = torch.arange(input_ids.shape[1], device=input_ids.device).expand_as(input_ids)
        hidden = {}
        if self.stage.first:
            h = self.model.embed_tokens(input_ids)
            if self.cfg.embed_scale:  # Gemma: the scale rounded to the activation dtype first, as transformers does
                h = h * torch.tensor(self.cfg.embed_scale, dtype=h.dtype, device=h.device)
            hidden["embed"] = h
        for i in self.stage.layers:
            h = hidden[f"layer {i}"] = self.model.layers[i](positions, h)
        if not self.stage.last:
            return None, hidden
        h = hidden["final norm"] = self.model.norm(h)
        logits = self.lm_head(h)  # None on TP ranks but 0: rank 0 gathered the whole vocabulary
        if logits is not None and self.cfg.final_softcap:  # Gemma: elementwise, on the gathered logits
            logits = torch.tanh(logits / self.cfg.final_softcap) * self.cfg.final_softcap
        return logits, hidden

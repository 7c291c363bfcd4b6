"""Gemma-2 and Gemma-3 (text) in the live model, computed as transformers 5 does and split as vLLM 0.33 splits
them.

What differs from Llama's blocks:
- every RMSNorm scales by (1 + weight), in float32 (checkpoints store the offset; vLLM's GemmaRMSNorm);
- the embedding is multiplied by sqrt(hidden_size), that number first rounded to the activation dtype;
- four norms a block: h += post_attention_layernorm(attn(input_layernorm(h))), then
  h += post_feedforward_layernorm(mlp(pre_feedforward_layernorm(h)));
- attention scores are scaled by query_pre_attn_scalar ** -0.5 (not head_dim ** -0.5); Gemma-2 soft-caps them,
  c * tanh(s / c) before the mask (Gemma-3 carries attn_logit_softcapping but neither transformers nor vLLM
  applies it);
- sliding-window layers by layer_types (Gemma-2: every other layer, Gemma-3: sliding_window_pattern, 5 of 6);
- a GELU-tanh gated MLP (hidden_activation gelu_pytorch_tanh, the only one vLLM accepts);
- Gemma-3: per-head q_norm / k_norm (the (1 + w) form, replicated under TP: each head is whole on one rank),
  and two RoPEs: rope_local_base_freq (unscaled) on sliding layers, rope_theta / rope_scaling on full ones;
- the final logits are soft-capped, c * tanh(logits / c), on the last stage's TP rank 0 after the vocabulary
  gather (LiveForCausalLM's final_softcap hook; vLLM's LogitsProcessor soft_cap).
None of these adds a collective: soft-capping and the norms are elementwise or within one head.
"""
import math

import torch
import torch.nn.functional as F
from torch import nn

from tpviz.layers import RMSNorm
from tpviz.live.errors import LiveError
from tpviz.archs import arch_of
from tpviz.live.model.config import LiveConfig
from tpviz.live.model.decoder import MLP, Attention, RotaryEmbedding
from tpviz.live.model.rope import rope_parameters

ACTIVATION = "gelu_pytorch_tanh"
# transformers 5 defaults when a config leaves a field out (Gemma-2 soft-caps by default, Gemma-3 does not)
SOFTCAP_DEFAULTS = {"gemma2": (50.0, 30.0), "gemma3": (None, None)}  # by live block


class GemmaRMSNorm(RMSNorm):
    """y = x / rms(x) * (1 + weight), all in float32 (the checkpoint stores the offset from 1)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x.float()
        y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + self.eps)
        return (y * (1.0 + self.weight.float())).to(x.dtype)


def _positive(raw: dict, key: str, default) -> float | None:
    """raw[key] (default when absent; null stays None) as a positive finite number, else one LiveError
    line."""
    v = raw.get(key, default)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
        raise LiveError(f"{key}={v!r} must be a positive number")
    return float(v)


def gemma_ropes(block: str, raw: dict, head_dim: int, theta: float) -> tuple[dict, dict | None]:
    """(the model-wide or full layers' RoPE, Gemma-3's sliding layers' RoPE or None), as rope_parameters
    gives. Gemma-3 reads rope_parameters per layer type (transformers 5), else rope_theta (default 1e6) with
    rope_scaling for the full layers and rope_local_base_freq (default 1e4, never scaled) for the sliding
    ones."""
    if block == "gemma2":
        return rope_parameters(raw, head_dim, theta), None
    rope = raw.get("rope_parameters") or {}
    if not isinstance(rope, dict):
        raise LiveError(f"rope_parameters={rope!r} must be an object")
    if rope and not any(isinstance(rope.get(k), dict) for k in ("full_attention", "sliding_attention")):
        raise LiveError("Gemma-3 rope_parameters must be given per layer type "
                        "(full_attention, sliding_attention)")
    full, local = ({"rope_type": "default", **(rope.get(k) or {})} for k in ("full_attention",
                                                                             "sliding_attention"))
    if isinstance(raw.get("rope_scaling"), dict):  # legacy configs: the scaling is the full layers'
        full.update(raw["rope_scaling"])
    full.setdefault("rope_theta", raw.get("rope_theta") or 1_000_000.0)
    local.setdefault("rope_theta", raw.get("rope_local_base_freq") or 10_000.0)
    plain = {**raw, "rope_scaling": None}
    return (rope_parameters({**plain, "rope_parameters": full}, head_dim, full["rope_theta"]),
            rope_parameters({**plain, "rope_parameters": local}, head_dim, local["rope_theta"]))


def read_gemma(cfg: LiveConfig, raw: dict, multimodal: bool = False) -> None:
    """Fill cfg with the Gemma facts the spec leaves out (raw: the text config of a `multimodal` wrapper, or
    the config itself), or refuse in one line."""
    s, kind = cfg.spec, cfg.spec.arch.live
    act = raw.get("hidden_activation") or ACTIVATION  # what transformers' Gemma reads (not hidden_act)
    if act != ACTIVATION:
        raise LiveError(f"hidden_activation={act!r}: Gemma runs {ACTIVATION} (vLLM accepts no other)")
    if raw.get("use_bidirectional_attention"):
        raise LiveError("use_bidirectional_attention=true (non-causal Gemma) is not "
                        "supported by the live check")
    attn_cap, final_cap = SOFTCAP_DEFAULTS[kind]
    attn_cap = _positive(raw, "attn_logit_softcapping", attn_cap)
    if kind != "gemma2" and attn_cap is not None:
        cfg.notes.append(f"attn_logit_softcapping={attn_cap:g} is not applied: transformers "
                         "and vLLM ignore it for Gemma-3, and so does the live check")
        attn_cap = None
    cfg.attn_softcap, cfg.final_softcap = attn_cap, _positive(raw, "final_logit_softcapping", final_cap)
    if multimodal and cfg.final_softcap:  # vLLM's Gemma-3 wrapper runs Gemma3ForCausalLM's logits processor
        cfg.notes.append(f"final_logit_softcapping={cfg.final_softcap:g} is applied, as vLLM "
                         "does; transformers' Gemma3ForConditionalGeneration leaves its logits uncapped")
    cfg.attn_scale = _positive(raw, "query_pre_attn_scalar", 256) ** -0.5
    cfg.embed_scale = s.hidden_size ** 0.5
    cfg.rope, cfg.local_rope = gemma_ropes(kind, raw, s.head_dim, s.rope_theta)


def hf_gemma_config(cfg: LiveConfig) -> dict:
    """The Gemma fields of a random checkpoint's config.json (Gemma2ForCausalLM / Gemma3ForCausalLM, text
    only)."""
    s = cfg.spec
    scalar = cfg.attn_scale ** -2 if cfg.attn_scale else 256
    windows = [layer.mixer.window for layer in s.layers if layer.mixer.kind == "sliding_attention"]
    text = s.arch.text_model or s.model_type  # a multimodal Gemma-3 runs (and writes) its text decoder
    out = {"model_type": text, "architectures": [arch_of(text).hf_class],
           "hidden_act": ACTIVATION, "hidden_activation": ACTIVATION,
           "query_pre_attn_scalar": round(scalar) if abs(scalar - round(scalar)) < 1e-6 else scalar,
           "attn_logit_softcapping": cfg.attn_softcap, "final_logit_softcapping": cfg.final_softcap,
           "layer_types": ["sliding_attention" if layer.mixer.kind == "sliding_attention"
                           else "full_attention" for layer in s.layers],
           "sliding_window": max(windows, default=4096)}
    ropes = {"full_attention": cfg.rope, "sliding_attention": cfg.local_rope}
    ropes = {k: {key: v for key, v in p.items() if key != "rotary_dim"} for k, p in ropes.items() if p}
    if s.arch.live == "gemma2":
        out.update(rope_parameters=ropes.get("full_attention") or {"rope_type": "default",
                                                                   "rope_theta": s.rope_theta})
    else:
        out.update(rope_parameters=ropes)
    return out


class GemmaMLP(MLP):
    """gate_up column-parallel -> GELU-tanh(gate) * up -> down row-parallel."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, -1)
        return self.down_proj(F.gelu(gate, approximate="tanh") * up)


class GemmaAttention(Attention):
    """This rank's heads: QKV -> (Gemma-3) per-head (1 + w) q/k norms -> RoPE of the layer's type -> scores
    scaled by query_pre_attn_scalar ** -0.5, soft-capped (Gemma-2), causal / windowed mask, float32
    softmax."""

    def __init__(self, cfg: LiveConfig, tp_size: int, tp_rank: int, index: int):
        super().__init__(cfg, tp_size, tp_rank)
        s = cfg.spec
        if s.qk_norm:  # Gemma-3: per head, so replicated weights and no collective
            self.q_norm = GemmaRMSNorm(s.head_dim, s.rms_norm_eps)
            self.k_norm = GemmaRMSNorm(s.head_dim, s.rms_norm_eps)
        mixer = s.layers[index].mixer if index < len(s.layers) else None
        sliding = mixer is not None and mixer.kind == "sliding_attention"
        self.sliding_window = mixer.window if sliding else None
        if sliding and cfg.local_rope is not None:  # Gemma-3's local base frequency, never scaled
            self.rotary_emb = RotaryEmbedding(s.head_dim, cfg.local_rope["rope_theta"], cfg.local_rope)
        self.scale = cfg.attn_scale or s.head_dim ** -0.5
        self.softcap = cfg.attn_softcap

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Eager attention as Gemma needs it: scaled, soft-capped scores, causal / windowed mask, fp32
        softmax."""
        S = q.shape[2]
        scores = torch.matmul(q, k.transpose(2, 3)) * self.scale
        if self.softcap:
            scores = torch.tanh(scores / self.softcap) * self.softcap
        i = torch.arange(S, device=q.device)
        allowed = i[None, :] <= i[:, None]
        if self.sliding_window:
            allowed &= i[:, None] - i[None, :] < self.sliding_window
        scores = scores.masked_fill(~allowed, float("-inf"))
        return torch.matmul(torch.softmax(scores, -1, dtype=torch.float32).to(q.dtype), v)


class GemmaDecoderLayer(nn.Module):
    """h += post_attention_layernorm(attn(input_layernorm(h))); h += post_feedforward_layernorm(mlp(
    pre_feedforward_layernorm(h))), every norm (1 + w)."""

    def __init__(self, cfg: LiveConfig, tp_size: int, tp_rank: int, index: int = 0):
        super().__init__()
        s = cfg.spec
        self.input_layernorm = GemmaRMSNorm(s.hidden_size, s.rms_norm_eps)
        self.self_attn = GemmaAttention(cfg, tp_size, tp_rank, index)
        self.post_attention_layernorm = GemmaRMSNorm(s.hidden_size, s.rms_norm_eps)
        self.pre_feedforward_layernorm = GemmaRMSNorm(s.hidden_size, s.rms_norm_eps)
        self.ffn_name, self.mlp = "mlp", GemmaMLP(cfg, tp_size, tp_rank)
        self.post_feedforward_layernorm = GemmaRMSNorm(s.hidden_size, s.rms_norm_eps)

    def forward(self, positions: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        h = h + self.post_attention_layernorm(self.self_attn(positions, self.input_layernorm(h)))
        return h + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(h)))

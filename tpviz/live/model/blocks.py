"""Decoder families whose blocks differ from Llama's, split the way vLLM 0.33 splits them.

Phi-3 runs Llama's blocks (vLLM: Phi3ForCausalLM is LlamaForCausalLM); only its checkpoint differs: q/k/v and
gate/up are fused on disk, and the fused layers' loaders split them (loaded_shard_id None). Its
sliding_window holds for every layer (vLLM: model-wide when the config has no layer_types); source.py.

OLMo-2 and OLMo-3 (vLLM 0.33 runs them through its Transformers backend) normalize after each sublayer instead
of before it, and their q_norm / k_norm span the WHOLE q and k projections (num_heads * head_dim), not one
head. Under TP each rank holds only its heads, so vLLM's TP-aware RMSNorm all-gathers q (and k) over the TP
group, normalizes the full width with the replicated weight, and keeps this rank's slice again. That needs the
k slices to tile k exactly: with KV heads replicated (tp > num_key_value_heads) vLLM refuses, and so does this
model. OLMo-3 adds sliding-window attention on its `layer_types` sliding layers, with a RoPE of their own
(rope_parameters per layer type; transformers and vLLM scale only the full layers').
"""
import torch
import torch.distributed as dist
from torch import nn

from tpviz.errors import TPGroupError, TPSizeError
from tpviz.layers import RMSNorm, tp_group
from tpviz.live.model.gemma import GemmaDecoderLayer, GemmaRMSNorm
from tpviz.live.model.gptoss import GptOssDecoderLayer
from tpviz.live.model.mla import MLADecoderLayer
from tpviz.live.model.config import Cuts, LiveConfig
from tpviz.live.model.dp import DpRows
from tpviz.live.errors import LiveError
from tpviz.live.model.decoder import MLP, Attention, DecoderLayer, RotaryEmbedding
from tpviz.live.model.rope import rope_parameters



def full_rope_config(raw: dict) -> dict:
    """The raw config as rope.rope_parameters reads it for the model-wide RoPE: rope_parameters given per
    layer type (OLMo-3, transformers 5) are the full-attention layers' for it."""
    rope = raw.get("rope_parameters")
    if isinstance(rope, dict) and isinstance(rope.get("full_attention"), dict):
        return {**raw, "rope_parameters": rope["full_attention"]}
    return raw


def sliding_rope(spec, raw: dict, head_dim: int, theta: float) -> dict | None:
    """OLMo-3's sliding layers: their own RoPE (rope_parameters["sliding_attention"]; from a legacy flat
    config, plain RoPE with rope_theta: transformers and vLLM scale only the full layers). None for other
    blocks, and for a model without sliding layers."""
    if spec.arch.live != "olmo" or all(layer.mixer.kind != "sliding_attention" for layer in spec.layers):
        return None
    rope = raw.get("rope_parameters")
    if isinstance(rope, dict) and isinstance(rope.get("sliding_attention"), dict):
        local = rope["sliding_attention"]
    else:
        local = {"rope_type": "default",
                 "rope_theta": raw.get("rope_theta") or (rope or {}).get("rope_theta")}
    return rope_parameters({**raw, "rope_scaling": None, "rope_parameters": local}, head_dim, theta)


def rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """tpviz's RMSNorm with an explicit weight (float32 inside, like the reference)."""
    y = x.float()
    y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + eps)
    return (y * weight.float()).to(x.dtype)


class GatheredRMSNorm(RMSNorm):
    """RMSNorm over a whole projection whose heads are split over TP ranks (OLMo's q_norm / k_norm).

    The weight is replicated at full width. forward takes this rank's [..., local heads, head_dim],
    all-gathers the ranks' slices along the last dim (rank order is head order), normalizes, and returns its
    own slice. `gather = False` is the injectable bug: each rank normalizes only its slice (a per-rank
    variance)."""

    def __init__(self, width: int, eps: float, tp_size: int, tp_rank: int):
        super().__init__(width, eps)
        self.tp_size, self.tp_rank = tp_size, tp_rank
        self.gather = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape, x = x.shape, x.flatten(-2)
        local = x.shape[-1]
        if self.tp_size == 1:
            return rms(x, self.weight, self.eps).view(shape)
        if not self.gather:
            return rms(x, self.weight.narrow(0, self.tp_rank * local, local), self.eps).view(shape)
        group = tp_group(self.tp_size)
        if group is None:
            raise TPGroupError(f"a full-width q/k norm at tp_size={self.tp_size} "
                               "all-gathers over the TP group; start one rank per tp slice")
        parts = [torch.empty_like(x) for _ in range(self.tp_size)]
        dist.all_gather(parts, x.contiguous(), group=group)
        full = rms(torch.cat(parts, -1), self.weight, self.eps)
        return full.narrow(-1, self.tp_rank * local, local).contiguous().view(shape)


class OlmoAttention(Attention):
    """Llama attention with whole-projection q/k norms (all-gathered) and, on OLMo-3's sliding layers, a
    window and an unscaled RoPE of their own."""

    def __init__(self, cfg: LiveConfig, tp_size: int, tp_rank: int, index: int):
        super().__init__(cfg, tp_size, tp_rank)
        s, qkv = cfg.spec, self.qkv_proj
        # also refused by the layout check (tpviz.plan.attention.no_kv_replicas)
        if qkv.num_kv_head_replicas > 1:
            raise TPSizeError(f"num_key_value_heads={s.num_key_value_heads} is fewer than tp_size={tp_size}: "
                              "k_norm spans all KV heads and vLLM 0.33 all-gathers k to "
                              "apply it, which fails when KV heads are replicated")
        self.q_norm = GatheredRMSNorm(s.num_attention_heads * s.head_dim, s.rms_norm_eps, tp_size, tp_rank)
        self.k_norm = GatheredRMSNorm(s.num_key_value_heads * s.head_dim, s.rms_norm_eps, tp_size, tp_rank)
        mixer = s.layers[index].mixer if index < len(s.layers) else None
        sliding = mixer is not None and mixer.kind == "sliding_attention"
        self.sliding_window = mixer.window if sliding else None  # OLMo-3: only its sliding layers have one
        if sliding and cfg.local_rope is not None:  # scaling (YaRN) is for the full layers only
            self.rotary_emb = RotaryEmbedding(s.head_dim, cfg.local_rope["rope_theta"], cfg.local_rope)


class PostNormDecoderLayer(nn.Module):
    """OLMo-2/3 block: h += post_attention_layernorm(attn(h)); h += post_feedforward_layernorm(mlp(h))."""

    def __init__(self, cfg: LiveConfig, tp_size: int, tp_rank: int, index: int = 0):
        super().__init__()
        s = cfg.spec
        self.self_attn = OlmoAttention(cfg, tp_size, tp_rank, index)
        self.post_attention_layernorm = RMSNorm(s.hidden_size, s.rms_norm_eps)
        self.ffn_name, self.mlp = "mlp", MLP(cfg, tp_size, tp_rank)
        self.post_feedforward_layernorm = RMSNorm(s.hidden_size, s.rms_norm_eps)

    def forward(self, positions: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        h = h + self.post_attention_layernorm(self.self_attn(positions, h))
        return h + self.post_feedforward_layernorm(self.mlp(h))


def decoder_layer(cfg: LiveConfig, tp_size: int, tp_rank: int, index: int,
                  experts: tuple[int, ...] | None = None, cuts: Cuts | None = None,
                  rows: DpRows | None = None) -> nn.Module:
    """Layer `index` of this family: OLMo's post-norm block, Gemma's four-norm block, else Llama's pre-norm
    block. Only Llama's and MLA's blocks take an SGLang layout's own groups (cuts) for their parts."""
    block = cfg.spec.arch.live
    if cuts is not None and block not in ("llama", "mla"):
        if any(cuts.of(role) != (tp_size, tp_rank) for role in ("attention", "dense", "experts", "shared")):
            raise LiveError(f"the live check runs SGLang's carved layouts (--attn-dp-size, --ep, "
                            f"--moe-dense-tp-size) for Llama-like and DeepSeek blocks, "
                            f"not {cfg.spec.model_type}")
    if block not in ("llama", "mla"):
        cuts = rows = None
    if block in ("gemma2", "gemma3"):
        return GemmaDecoderLayer(cfg, tp_size, tp_rank, index)
    if block == "olmo":  # h + norm(attn(h)), h + norm(mlp(h)); whole-projection q/k norms
        return PostNormDecoderLayer(cfg, tp_size, tp_rank, index)
    if block == "gpt_oss":  # sinks, biased router, clamped SwiGLU experts (MXFP4 dequantized on load)
        return GptOssDecoderLayer(cfg, tp_size, tp_rank, index, experts)
    if cfg.spec.is_mla:  # DeepSeek: MLA, then a dense MLP or the MoE block with shared experts
        return MLADecoderLayer(cfg, tp_size, tp_rank, index, experts, cuts, rows)
    return DecoderLayer(cfg, tp_size, tp_rank, index, experts, cuts, rows)


def final_norm(cfg: LiveConfig) -> nn.Module:
    """The last stage's final norm: Gemma's (1 + w) RMSNorm, else the plain one."""
    gemma = cfg.spec.arch.live in ("gemma2", "gemma3")
    return (GemmaRMSNorm if gemma else RMSNorm)(cfg.spec.hidden_size, cfg.spec.rms_norm_eps)

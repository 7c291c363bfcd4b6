"""gpt-oss in the live model, computed as transformers 5 does (modeling_gpt_oss.py) and split as vLLM 0.33
splits it (models/gpt_oss.py).

What differs from Llama's blocks:
- attention sinks: a learned logit per head (`self_attn.sinks`) joins each row's softmax denominator and is
  dropped after it; the sinks split over TP with their heads (no collective). q/k/v and o carry biases (o
  row-parallel: its bias added once); even layers slide (layer_types), with the config's window; YaRN RoPE as
  the config says;
- the router is a replicated linear WITH a bias; softmax over the top-k logits (not over all experts);
- experts are stored stacked and transposed: gate_up_proj [E, hidden, 2*I] with gate / up INTERLEAVED columns
  (gate at even, up at odd), down_proj [E, I, hidden], each with a bias; the clamped SwiGLU
  (up.clamp(+-limit) + 1) * gate.clamp(max=limit) * sigmoid(alpha * gate);
- under TP each rank takes ONE contiguous block [start, end) of the intermediate dim for gate and up alike,
  i.e. interleaved columns [2*start, 2*end), and the same rows of down_proj; down's bias is added on rank 0
  only, and the block reduces once. vLLM's cut: unquantized ceil(I / tp) per rank, MXFP4 ceil(I / 32 / tp) *
  32 (whole 32-value scale blocks; tpviz.layers.mxfp4.mxfp4_rows, as the explorer maps it): the last ranks may
  get fewer rows or none. Under expert parallelism a rank holds its experts whole.
- MXFP4 checkpoints (the released gpt-oss): `*_blocks` (uint8, two e2m1 values a byte, low nibble first) and
  `*_scales` (uint8 E8M0 exponents, one per 32 values) are dequantized to the run dtype while loading, from
  this rank's slices of both only.
"""
import math

import torch
import torch.distributed as dist
from torch import nn

from tpviz.errors import TensorError
from tpviz.layers import RMSNorm, ReplicatedLinear, tp_group
from tpviz.layers.mxfp4 import mxfp4_rows
from tpviz.live.errors import LiveError
from tpviz.live.model.config import LiveConfig
from tpviz.live.model.decoder import Attention
from tpviz.live.model.moe import SparseMoeBlock
from tpviz.live.check.routing import note as note_routing
from tpviz.live.model.rope import rope_parameters

SWIGLU_DEFAULTS = {"alpha": 1.702, "limit": 7.0}  # transformers' GptOssConfig swiglu_alpha / swiglu_limit
FP4_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
BLOCK = 32  # MXFP4 values per E8M0 scale
PACKED = ("blocks", "scales")  # the shard ids an MXFP4 expert weight is loaded from
# transformers' GptOssConfig when a config names no RoPE (vLLM reads the same through it): YaRN, not plain
# RoPE
DEFAULT_ROPE = {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                "original_max_position_embeddings": 4096}


def is_mxfp4(cfg: LiveConfig) -> bool:
    """A gpt-oss MXFP4 checkpoint: the one quantized format Run live loads (dequantizing while it reads)."""
    q = cfg.spec.quant
    return cfg.spec.arch.mxfp4 and q is not None and q.scheme == "mxfp4"


def read_gpt_oss(cfg: LiveConfig, raw: dict) -> None:
    """Fill cfg.swiglu from the config (transformers' defaults), and refuse MXFP4 experts vLLM could not
    cut."""
    out = {}
    for key, default in SWIGLU_DEFAULTS.items():
        v = raw.get(f"swiglu_{key}", default)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
            raise LiveError(f"swiglu_{key}={v!r} must be a positive number")
        out[key] = float(v)
    cfg.swiglu = out
    if not (raw.get("rope_scaling") or raw.get("rope_parameters")):
        s = cfg.spec
        cfg.rope = rope_parameters({**raw, "rope_parameters": {**DEFAULT_ROPE, "rope_theta": s.rope_theta}},
                                   s.head_dim, s.rope_theta)
        cfg.notes.append("the config names no RoPE scaling: YaRN (factor 32, original 4096 positions) as "
                         "transformers' GptOssConfig defaults and vLLM runs it")
    if is_mxfp4(cfg) and cfg.spec.moe_intermediate_size % BLOCK:
        raise LiveError("model.layers.0.mlp.experts: MXFP4 experts need intermediate_size "
                        f"divisible by {BLOCK} (one scale block), got {cfg.spec.moe_intermediate_size}")


def expert_rows(inter: int, tp_size: int, tp_rank: int, mxfp4: bool) -> tuple[int, int]:
    """The intermediate rows [start, end) this rank's experts hold, as vLLM 0.33 cuts them."""
    if mxfp4:
        return mxfp4_rows(inter, tp_size, tp_rank)
    per = -(-inter // tp_size)
    return min(tp_rank * per, inter), min((tp_rank + 1) * per, inter)


def dequantize_mxfp4(blocks: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """[..., rows, G, 16] uint8 blocks with [..., rows, G] uint8 exponents -> [..., rows, G * 32] values."""
    if blocks.shape[:-1] != scales.shape:
        raise TensorError(f"MXFP4 blocks {tuple(blocks.shape)} do not match scales {tuple(scales.shape)}")
    lut = torch.tensor(FP4_VALUES, dtype=torch.float32)
    b = blocks.to(torch.uint8)
    vals = torch.stack((lut[(b & 0x0F).long()], lut[(b >> 4).long()]), -1).flatten(-2)  # low nibble first
    vals = torch.ldexp(vals, (scales.to(torch.int32) - 127)[..., None].float())
    return vals.flatten(-2).to(dtype)


class GptOssAttention(Attention):
    """Llama's attention (biases, YaRN RoPE) with this rank's attention sinks and the layer's window."""

    def __init__(self, cfg: LiveConfig, tp_size: int, tp_rank: int, index: int):
        super().__init__(cfg, tp_size, tp_rank)
        mixer = cfg.spec.layers[index].mixer if index < len(cfg.spec.layers) else None
        self.sliding_window = (mixer.window if mixer is not None
                               and mixer.kind == "sliding_attention" else None)
        self.scale, self.tp_rank = self.head_dim ** -0.5, tp_rank
        self.sinks = nn.Parameter(torch.zeros(self.num_heads), requires_grad=False)
        self.sinks.weight_loader = self.load_sinks
        self.use_sinks = True  # False: plain softmax (tests show the sinks matter)

    def load_sinks(self, param: nn.Parameter, loaded: torch.Tensor) -> None:
        n = self.num_heads  # this rank's query heads: a contiguous block, as the q rows of qkv_proj
        param.data.copy_(loaded.narrow(0, self.tp_rank * n, n))

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Eager attention: scaled scores, causal / windowed mask, softmax with a sink column, sink
        dropped."""
        B, _, S, _ = q.shape
        scores = torch.matmul(q, k.transpose(2, 3)) * self.scale
        i = torch.arange(S, device=q.device)
        allowed = i[None, :] <= i[:, None]
        if self.sliding_window:
            allowed &= i[:, None] - i[None, :] < self.sliding_window
        scores = scores.masked_fill(~allowed, float("-inf"))
        if self.use_sinks:
            sinks = self.sinks.to(scores.dtype).view(1, -1, 1, 1).expand(B, -1, S, 1)
            scores = torch.cat((scores, sinks), -1)
        scores = scores - scores.amax(-1, keepdim=True)
        probs = torch.softmax(scores.float(), -1).to(q.dtype)[..., :S]
        return torch.matmul(probs, v)


class GptOssExperts(nn.Module):
    """This rank's experts (all, or under EP its own whole) over its intermediate rows, in the checkpoint's
    stacked, transposed, interleaved layout: gate_up_proj [E, hidden, 2n], down_proj [E, n, hidden],
    biases."""

    def __init__(self, cfg: LiveConfig, tp_size: int, tp_rank: int, experts: tuple[int, ...] | None):
        super().__init__()
        s, H = cfg.spec, cfg.spec.hidden_size
        self.ids = list(range(s.num_experts)) if experts is None else list(experts)
        # EP: whole experts, every rank adds its own biases
        self.tp_rank = 0 if experts is not None else tp_rank
        self.start, self.end = (0, s.moe_intermediate_size) if experts is not None else \
            expert_rows(s.moe_intermediate_size, tp_size, tp_rank, is_mxfp4(cfg))
        n, E = self.end - self.start, len(self.ids)
        self.alpha, self.limit = cfg.swiglu["alpha"], cfg.swiglu["limit"]
        # load_weights: hand the loader lazy checkpoint tensors, it reads only this rank's part
        self.tp_dim = 1
        self.packed_parts = set(PACKED)  # an MXFP4 weight is complete once its blocks and its scales are in
        self._pending: dict[str, dict] = {}
        for name, shape in (("gate_up_proj", (E, H, 2 * n)), ("gate_up_proj_bias", (E, 2 * n)),
                            ("down_proj", (E, n, H)), ("down_proj_bias", (E, H))):
            p = nn.Parameter(torch.zeros(shape), requires_grad=False)
            p.weight_loader = self.weight_loader
            self.register_parameter(name, p)
        self.bias_on_all_ranks = False  # the bias-all-ranks injection: down's bias added on every TP rank
        self.clamp = True  # False: plain SwiGLU (tests show the clamp matters)

    def _experts(self, t) -> torch.Tensor:
        """This rank's experts of a (lazy) stacked tensor, read expert by expert unless they are all of
        them."""
        if self.ids == list(range(t.shape[0])):
            return t.narrow(0, 0, t.shape[0])
        return torch.cat([t.narrow(0, e, 1) for e in self.ids])

    def _rows(self, t, dim: int, unit: int = 1, interleaved: bool = False):
        """The lazy view of this rank's intermediate rows along dim, counted in stored units (MXFP4: 32 values
        a scale, 16 bytes a block row); a cut that splits a block is refused, naming the tensor."""
        k = 2 if interleaved else 1
        a, b = k * self.start, k * self.end
        if a % unit or b % unit:
            raise TensorError(f"{getattr(t, 'name', 'tensor')}: this rank's rows {a}:{b} do not align to "
                              f"{unit}-value MXFP4 blocks; vLLM cuts experts in whole blocks")
        return lazy_narrow(t, dim, a // unit, (b - a) // unit)

    def weight_loader(self, param: nn.Parameter, loaded, shard_id=None) -> None:
        name = next(k for k, v in self._parameters.items() if v is param)
        if name == "down_proj_bias":  # whole on every rank, added on TP rank 0 only (vLLM zeroes the others)
            param.data.copy_(self._experts(loaded))
        elif self.end == self.start:  # vLLM's cut left this rank no rows: nothing to read
            return
        elif shard_id in PACKED:
            self._load_packed(name, param, loaded, shard_id)
        else:
            gate_up = name.startswith("gate_up")
            dim = loaded.ndim - 1 if gate_up else 1  # interleaved columns (weight and bias) / down's rows
            param.data.copy_(self._experts(self._rows(loaded, dim, interleaved=gate_up)))

    def _load_packed(self, name: str, param: nn.Parameter, loaded, part: str) -> None:
        """MXFP4: gate_up blocks [E, 2I, H/32, 16] / scales [E, 2I, H/32] cut along the interleaved rows; down
        blocks [E, H, I/32, 16] / scales [E, H, I/32] along the intermediate dim in whole 32-value blocks.
        Dequantized once both parts of this rank's slice are read."""
        if name not in ("gate_up_proj", "down_proj"):
            raise TensorError(f"{getattr(loaded, 'name', name)}: gpt-oss has no MXFP4 {name}")
        got = self._rows(loaded, 1, interleaved=True) if name == "gate_up_proj" else \
            self._rows(loaded, 2, BLOCK)  # dim 2 counts 32-value blocks in both
        pending = self._pending.setdefault(name, {})
        pending[part] = self._experts(got)
        if len(pending) < 2:
            return
        w = dequantize_mxfp4(pending.pop("blocks"), pending.pop("scales"), torch.float32)
        param.data.copy_(w.transpose(1, 2))  # [E, 2n, H] -> [E, H, 2n]; [E, H, n] -> [E, n, H]

    def forward(self, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        out = torch.zeros_like(x)
        slots = ids.T  # [top_k, tokens], as transformers lists the hits
        add_bias = self.tp_rank == 0 or self.bias_on_all_ranks
        for k, e in enumerate(self.ids):
            slot, token = torch.where(slots == e)
            if token.numel() == 0:
                continue
            gate_up = x[token] @ self.gate_up_proj[k] + self.gate_up_proj_bias[k]
            gate, up = gate_up[..., ::2], gate_up[..., 1::2]
            if self.clamp:
                gate, up = gate.clamp(max=self.limit), up.clamp(-self.limit, self.limit)
            y = ((up + 1) * (gate * torch.sigmoid(gate * self.alpha))) @ self.down_proj[k]
            if add_bias:
                y = y + self.down_proj_bias[k]
            out.index_add_(0, token, (y * weights[token, slot, None]).to(out.dtype))
        return out


def lazy_narrow(t, dim: int, start: int, length: int):
    """t.narrow without reading: a CheckpointTensor's narrower view (read later), or a tensor view."""
    return t.split([start, length, t.shape[dim] - start - length], dim)[1] if hasattr(t, "materialize") \
        else t.narrow(dim, start, length)


class GptOssMoe(SparseMoeBlock):
    """Replicated router with bias -> softmax over the top-k logits -> this rank's experts -> one
    all_reduce."""

    def __init__(self, cfg: LiveConfig, tp_size: int, tp_rank: int, experts: tuple[int, ...] | None):
        nn.Module.__init__(self)
        s = cfg.spec
        self.top_k, self.tp_size = s.num_experts_per_tok, tp_size
        self.router = ReplicatedLinear(s.hidden_size, s.num_experts, tp_size, tp_rank, bias=True)
        self.experts = GptOssExperts(cfg, tp_size, tp_rank, experts)
        self.reduce_results = True  # the skip-allreduce injection turns it off

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        logits = self.router(x)
        top, ids = torch.topk(logits, self.top_k, dim=-1)
        if (forced := note_routing(self, logits, ids)) is not ids:  # the check's fp32 reference
            top, ids = logits.gather(1, forced), forced
        out = self.experts(x, torch.softmax(top, dim=-1), ids)
        if self.reduce_results and (group := tp_group(self.tp_size)) is not None:
            dist.all_reduce(out, group=group)
        return out.view(shape)


class GptOssDecoderLayer(nn.Module):
    """Pre-norm block: h += attn(norm(h)) with sinks; h += moe(norm(h))."""

    def __init__(self, cfg: LiveConfig, tp_size: int, tp_rank: int, index: int = 0,
                 experts: tuple[int, ...] | None = None):
        super().__init__()
        s = cfg.spec
        self.input_layernorm = RMSNorm(s.hidden_size, s.rms_norm_eps)
        self.self_attn = GptOssAttention(cfg, tp_size, tp_rank, index)
        self.post_attention_layernorm = RMSNorm(s.hidden_size, s.rms_norm_eps)
        self.ffn_name, self.mlp = "mlp", GptOssMoe(cfg, tp_size, tp_rank, experts)

    def forward(self, positions: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        h = h + self.self_attn(positions, self.input_layernorm(h))
        return h + self.mlp(self.post_attention_layernorm(h))


def hf_gpt_oss_config(cfg: LiveConfig) -> dict:
    """The gpt-oss fields of a random checkpoint's config.json (GptOssForCausalLM, unquantized)."""
    s = cfg.spec
    windows = [layer.mixer.window for layer in s.layers if layer.mixer.kind == "sliding_attention"]
    return {"architectures": ["GptOssForCausalLM"], "num_local_experts": s.num_experts,
            "num_experts_per_tok": s.num_experts_per_tok, "intermediate_size": s.moe_intermediate_size,
            "layer_types": ["sliding_attention" if layer.mixer.kind == "sliding_attention"
                            else "full_attention" for layer in s.layers],
            "sliding_window": max(windows, default=128), "attention_bias": True,
            "swiglu_alpha": cfg.swiglu.get("alpha", SWIGLU_DEFAULTS["alpha"]),
            "swiglu_limit": cfg.swiglu.get("limit", SWIGLU_DEFAULTS["limit"]),
            "rope_parameters": {k: v for k, v in cfg.rope.items() if k != "rotary_dim"} or None}

"""Qwen2.5-VL's vision tower on one TP rank at full size, built from tpviz's layers as vLLM 0.33's
qwen2_5_vl.py builds it and loaded tensor by tensor from the plan (plan/tower.py) through the layers' own
weight_loaders: the map the explorer draws is what runs. Window order, rotary angles and attention spans hold
no weight, so the caller passes them (as transformers computes them); every weight is this rank's share."""
import torch
import torch.nn.functional as F
from torch import nn

from tpviz.config.spec import ModelSpec
from tpviz.layers import (ColumnParallelLinear, MergedColumnParallelLinear, QKVParallelLinear,
                          ReplicatedLinear, RMSNorm, RowParallelLinear)
from tpviz.live.errors import LiveError
from tpviz.plan.tensors import tensors
from tpviz.plan.tower import tower_plans
from tpviz.trace.tracer import load


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """NeoX-style rotary over each head: [seq, heads, d] with cos / sin [seq, d]."""
    half = x.shape[-1] // 2
    turned = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos.unsqueeze(1) + turned * sin.unsqueeze(1)


class VisionBlock(nn.Module):
    def __init__(self, hidden: int, heads: int, inter: int, tp: int, rank: int, dtype):
        super().__init__()
        self.d, self.local = hidden // heads, heads // tp
        self.norm1, self.norm2 = RMSNorm(hidden, 1e-6, dtype), RMSNorm(hidden, 1e-6, dtype)
        self.qkv = QKVParallelLinear(hidden, self.d, heads, heads, tp, rank, bias=True, dtype=dtype)
        self.proj = RowParallelLinear(hidden, hidden, tp, rank, bias=True, dtype=dtype)
        self.gate_up = MergedColumnParallelLinear(hidden, [inter, inter], tp, rank, bias=True, dtype=dtype)
        self.down = RowParallelLinear(inter, hidden, tp, rank, bias=True, dtype=dtype)

    def forward(self, x, cos, sin, spans: list[int]) -> torch.Tensor:
        n = x.shape[0]
        q, k, v = self.qkv(self.norm1(x)).view(n, 3, self.local, self.d).unbind(1)  # this rank's heads
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        heads_first = [(t.transpose(0, 1) for t in (q[a:b], k[a:b], v[a:b]))
                       for a, b in zip(spans, spans[1:])]
        out = torch.cat([F.scaled_dot_product_attention(*one).transpose(0, 1) for one in heads_first])
        x = x + self.proj(out.reshape(n, -1))  # row-parallel: all-reduced over the heads
        gate, up = self.gate_up(self.norm2(x)).chunk(2, dim=-1)
        return x + self.down(F.silu(gate) * up)


class VisionTower(nn.Module):
    """Patch embedding (whole), the blocks, then the merger of merge² patches (column, GELU, row)."""

    def __init__(self, spec: ModelSpec, tp: int, rank: int, dtype=torch.float32):
        super().__init__()
        t = spec.tower
        if t is None or t.kind != "qwen2_5_vl":
            raise LiveError("the live vision tower runs Qwen2.5-VL's (qwen2_5_vl) alone")
        if spec.config.get("vision_config", {}).get("hidden_act", "silu") != "silu":
            raise LiveError("the live Qwen2.5-VL tower runs SiLU MLPs only")
        self.spec = spec
        self.merge = wide = t.merge ** 2 * t.hidden  # the merger's input: merge² patches side by side
        self.patch = ReplicatedLinear(int(torch.tensor(t.patch).prod()), t.hidden, tp, rank, dtype=dtype)
        self.blocks = nn.ModuleList(VisionBlock(t.hidden, t.heads, t.intermediate, tp, rank, dtype)
                                    for _ in range(t.depth))
        self.ln_q = RMSNorm(t.hidden, 1e-6, dtype)
        self.mlp0 = ColumnParallelLinear(wide, wide, tp, rank, bias=True, dtype=dtype)
        self.mlp2 = RowParallelLinear(wide, t.out_hidden, tp, rank, bias=True, dtype=dtype)

    def by_plan_name(self) -> dict[str, nn.Parameter]:
        """This module's parameters under the plan's names for them (vLLM's)."""
        p = self.spec.tower.prefix
        out = {f"{p}patch_embed.proj.weight": self.patch.weight}
        for i, b in enumerate(self.blocks):
            for name, layer in (("norm1", b.norm1), ("norm2", b.norm2), ("attn.qkv", b.qkv),
                                ("attn.proj", b.proj), ("mlp.gate_up_proj", b.gate_up),
                                ("mlp.down_proj", b.down)):
                out.update({f"{p}blocks.{i}.{name}.{k}": v for k, v in layer.named_parameters()})
        merger = (("merger.ln_q", self.ln_q), ("merger.mlp.0", self.mlp0), ("merger.mlp.2", self.mlp2))
        for name, layer in merger:
            out.update({f"{p}{name}.{k}": v for k, v in layer.named_parameters()})
        return out

    def load(self, weights: dict[str, torch.Tensor]) -> int:
        """Every tower tensor of the plan into its parameter, through that parameter's weight_loader; the
        count loaded. A parameter the plan does not fill, or a tensor it names that is absent, is an error."""
        params, filled = self.by_plan_name(), set()
        for t in tensors(tower_plans(self.spec, "vllm")):
            # the name as saved before transformers 4.52 (visual.*), or after (model.visual.*)
            tensor = weights.get(t.name, weights.get(f"model.{t.name}"))
            if tensor is None:
                raise LiveError(f"the checkpoint has no {t.name}, which the map loads into {t.param}")
            if t.param not in params:
                raise LiveError(f"the live tower has no {t.param}, which the map loads {t.name} into")
            param = params[t.param]
            if param.dim() == 2 and tensor.dim() > 2:  # the Conv3d patch kernel: a linear layer over a patch
                tensor = tensor.reshape(tensor.shape[0], -1)
            with torch.no_grad():
                load(param, tensor.to(param.dtype), t.shard_id)
            filled.add(t.param)
        if missing := sorted(set(params) - filled):
            raise LiveError(f"the plan loads nothing into {missing[0]} ({len(missing)} parameters)")
        return len(filled)

    def forward(self, pixels, window_index, cos, sin, spans: list[list[int]]) -> torch.Tensor:
        """pixels [patches, C·T·P·P]; window_index orders merge² patch groups into windows; spans: each
        block's attention spans (cu_seqlens) in that order."""
        x = self.patch(pixels.reshape(pixels.shape[0], -1))
        unit = self.spec.tower.merge ** 2
        x = x.view(-1, unit, x.shape[-1])[window_index].reshape(x.shape)
        for block, cu in zip(self.blocks, spans):
            x = block(x, cos, sin, cu)
        y = self.mlp2(F.gelu(self.mlp0(self.ln_q(x).view(-1, self.merge))))
        return y[torch.argsort(window_index)]

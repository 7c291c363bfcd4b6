"""Norms. RMSNorm and LayerNorm are replicated: every rank holds the whole weight and normalises the whole
hidden state. ShardedRMSNorm is cut with the projection it follows (traced for the map; Run live does not run
it)."""
import torch
from torch import nn

from tpviz.layers.linear import copy_checked, default_weight_loader


class RMSNorm(nn.Module):
    """y = x / rms(x) * weight, computed in float32 like the reference implementations."""

    def __init__(self, hidden_size: int, eps: float = 1e-6, dtype: torch.dtype | None = None):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden_size, dtype=dtype), requires_grad=False)
        self.weight.weight_loader = default_weight_loader

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return (x * self.weight.float()).to(dtype)


class LayerNorm(nn.Module):
    """Replicated LayerNorm with weight and bias (GPT-2, NeoX, BLOOM, Falcon, StarCoder), or weight alone
    (Cohere)."""

    def __init__(self, hidden_size: int, eps: float = 1e-5, dtype: torch.dtype | None = None,
                 bias: bool = True):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden_size, dtype=dtype), requires_grad=False)
        self.weight.weight_loader = default_weight_loader
        self.bias = None
        if bias:
            self.bias = nn.Parameter(torch.zeros(hidden_size, dtype=dtype), requires_grad=False)
            self.bias.weight_loader = default_weight_loader

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bias = None if self.bias is None else self.bias.float()
        return nn.functional.layer_norm(x.float(), x.shape[-1:], self.weight.float(), bias,
                                        self.eps).to(x.dtype)


class ShardedRMSNorm(nn.Module):
    """An RMSNorm over a whole column-split projection whose weight is cut like the projection (MiniMax-M2's
    q_norm / k_norm, vLLM 0.33 minimax_rms_norm/rms_norm_tp.py): each rank holds the slice of its own rows and
    all-reduces the per-token variance. shards: how many slices the weight is cut into (tp, or the KV heads
    when they are fewer than tp), shard: this rank's slice (tp_rank, or tp_rank // replicas)."""

    def __init__(self, size: int, shards: int, shard: int, eps: float = 1e-6,
                 dtype: torch.dtype | None = None):
        super().__init__()
        self.eps, self.shards, self.shard = eps, shards, shard
        self.weight = nn.Parameter(torch.ones(size // shards, dtype=dtype), requires_grad=False)
        self.weight.weight_loader = self.weight_loader

    def weight_loader(self, param: nn.Parameter, loaded_weight: torch.Tensor) -> None:
        """Cut 1: the slice of this rank's shard, shard_size rows from shard * shard_size."""
        size = loaded_weight.shape[0] // self.shards
        copy_checked(param.data, loaded_weight[self.shard * size:(self.shard + 1) * size])

"""Replicated RMSNorm: every rank holds the whole weight and normalises the whole hidden state."""
import torch
from torch import nn

from tpviz.layers.linear import default_weight_loader


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

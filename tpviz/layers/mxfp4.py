"""gpt-oss MXFP4 experts as vLLM 0.33 loads them (models/gpt_oss.py _load_weights_mxfp4,
quantization/mxfp4.py).

Each GPU's share of the expert intermediate size is cut in whole 32-value blocks: P = ceil((I/32)/tp) * 32
rows, rank r takes [r*P, min((r+1)*P, I)), so the last GPUs get fewer rows, or none. The parameter is
allocated for I/tp rounded up to the MoE kernel's alignment (64 for Triton, vLLM's Hopper default), and
the slice is copied to its front: the rest is padding.
"""
import math

import torch
from torch import nn

from tpviz.errors import ConfigError
from tpviz.rules import check_tp, divide

ALIGN = 64  # the Triton MoE backend rounds each GPU's intermediate size to this (oracle/mxfp4.py)


def mxfp4_rows(inter: int, tp: int, rank: int) -> tuple[int, int]:
    """The expert-intermediate rows [start, end) rank loads (end == start: none)."""
    per = math.ceil((inter // 32) / tp) * 32
    return min(rank * per, inter), min((rank + 1) * per, inter)


def check_blocks(intermediate_size: int) -> None:
    """MXFP4 packs 32 values per scale along the down's contraction dim, and GPUs get whole blocks of it."""
    if intermediate_size % 32:
        raise ConfigError(f"MXFP4 experts need intermediate_size divisible by 32 (one scale block), "
                          f"got {intermediate_size}")


def _param(shape: tuple, loader) -> nn.Parameter:
    p = nn.Parameter(torch.zeros(shape, dtype=torch.float64), requires_grad=False)
    p.weight_loader = loader
    return p


class _Mxfp4Split(nn.Module):
    """What both expert projections share: this GPU's rows [start, end) of the intermediate dim, and the
    allocated size (I/tp rounded up to the kernel's alignment)."""

    def __init__(self, intermediate_size: int, tp_size: int, tp_rank: int, tp_dim: int):
        super().__init__()
        check_tp(tp_size, tp_rank)
        check_blocks(intermediate_size)
        self.tp_dim, self.tp_size, self.tp_rank = tp_dim, tp_size, tp_rank
        self.alloc = math.ceil(divide(intermediate_size, tp_size, "intermediate_size") / ALIGN) * ALIGN
        self.start, self.end = mxfp4_rows(intermediate_size, tp_size, tp_rank)


class Mxfp4GateUp(_Mxfp4Split):
    """One expert's gate/up (w13) on one GPU: rows are gate and up interleaved, so rank r takes rows
    [2*start, 2*end) of blocks, scales and bias alike."""

    def __init__(self, hidden_size: int, intermediate_size: int, tp_size: int, tp_rank: int):
        super().__init__(intermediate_size, tp_size, tp_rank, tp_dim=0)
        alloc = self.alloc
        self.blocks = _param((2 * alloc, max(1, hidden_size // 2)), self.weight_loader)  # 2 fp4 per byte
        self.scales = _param((2 * alloc, max(1, hidden_size // 32)), self.weight_loader)  # one E8M0 per 32
        self.bias = _param((2 * alloc,), self.weight_loader)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor) -> None:
        rows = loaded[2 * self.start:2 * self.end]
        param.data[:rows.size(0)].copy_(rows)


class Mxfp4Down(_Mxfp4Split):
    """One expert's down (w2) on one GPU: columns [start, end) of the intermediate dim, counted in the
    stored units (2 fp4 per byte for blocks, 32 values per scale); the bias is loaded by rank 0 only."""

    def __init__(self, hidden_size: int, intermediate_size: int, tp_size: int, tp_rank: int):
        super().__init__(intermediate_size, tp_size, tp_rank, tp_dim=1)
        alloc = self.alloc
        self.blocks = _param((hidden_size, alloc // 2), self.weight_loader)
        self.scales = _param((hidden_size, alloc // 32), self.weight_loader)
        self.bias = _param((hidden_size,), self.weight_loader)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor) -> None:
        if param.dim() == 1:  # vLLM zeroes the bias on every rank but 0, so the all-reduce adds it once
            if self.tp_rank == 0:
                param.data.copy_(loaded)
            return
        unit = 2 if param is self.blocks else 32
        cols = loaded[:, self.start // unit:self.end // unit]
        param.data[:, :cols.size(1)].copy_(cols)

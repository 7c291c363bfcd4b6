"""Non-attention mixers as vLLM 0.33 shards them: Gated DeltaNet, Mamba1, Mamba2 and LFM2's short convolution.

Each class builds one rank's parameters with the loaders vLLM attaches (layers/mamba/*.py) and reports
the recurrent state it holds per sequence (MambaStateShapeCalculator). Only the shapes and loaders are
modelled: the live check does not run these mixers.
"""
import torch
from torch import nn

from tpviz.layers.linear import (ColumnParallelLinear, MergedColumnParallelLinear,
                                 RowParallelLinear, copy_checked)
from tpviz.rules import check_tp, divide


def sharded_loader(tp_rank: int):
    """vLLM's sharded_weight_loader(0): rank r takes the r-th block of rows."""
    def loader(param: nn.Parameter, loaded: torch.Tensor) -> None:
        n = param.size(0)
        copy_checked(param.data, loaded.narrow(0, tp_rank * n, n))
    return loader


def segmented_loader(segments: list[tuple[int, int, bool]], tp_size: int, tp_rank: int):
    """vLLM's mamba_v2_sharded_weight_loader: the tensor is a run of segments (full size, extra rows added
    by group replication, duplicate); each rank takes its chunk of every segment, in order. A duplicated
    segment (n_groups = 1) gives every rank the whole of it."""
    def loader(param: nn.Parameter, loaded: torch.Tensor) -> None:
        boundary = loaded_boundary = 0
        for full, extra, duplicate in segments:
            shard = full // tp_size
            skip = (0 if duplicate else tp_rank) * shard
            take = min(shard, full - extra - skip)
            start = loaded_boundary + skip
            copy_checked(param.data[boundary:boundary + take], loaded[start:start + take])
            boundary += shard
            loaded_boundary += full - extra
    return loader


def _vector(size: int, tp_size: int, tp_rank: int, what: str) -> nn.Parameter:
    p = nn.Parameter(torch.empty(divide(size, tp_size, what)), requires_grad=False)
    p.weight_loader = sharded_loader(tp_rank)
    return p


def _conv(kernel: int, channels: int, tp_size: int, tp_rank: int, bias: bool, loader=None, sizes=None):
    """A depthwise conv1d held as a column-parallel [channels/tp, 1, kernel] weight, as vLLM unsqueezes it."""
    conv = (MergedColumnParallelLinear(kernel, sizes, tp_size, tp_rank, bias=bias) if sizes
            else ColumnParallelLinear(kernel, channels, tp_size, tp_rank, bias=bias))
    conv.weight.data = conv.weight.data.unsqueeze(1)
    if loader:
        conv.weight.weight_loader = loader
        if bias:
            conv.bias.weight_loader = loader
    return conv


class GatedDeltaNet(nn.Module):
    """Gated DeltaNet linear attention. Qwen3-Next stores in_proj_qkvz and in_proj_ba interleaved per
    key-head group ([q, k, v..., z...] of one key head, then the next), so a plain row split gives each rank
    whole key-head groups. Qwen3.5 (interleaved=False) stores in_proj_qkv, in_proj_z, in_proj_b and
    in_proj_a apart: merged tables of [q | k | v | z] and [b | a], each part cut by rank. conv1d is stored
    flat [q | k | v] and each rank takes its chunk of each."""

    def __init__(self, hidden_size: int, num_k_heads: int, num_v_heads: int, head_k_dim: int, head_v_dim: int,
                 conv_kernel: int, tp_size: int, tp_rank: int, dtype: torch.dtype | None = None,
                 interleaved: bool = True):
        super().__init__()
        check_tp(tp_size, tp_rank)
        divide(num_k_heads, tp_size, "linear_num_key_heads")  # the interleaved groups are split whole
        self.num_k_heads, self.num_v_heads, self.tp_size = num_k_heads, num_v_heads, tp_size
        self.head_k_dim, self.head_v_dim, self.conv_kernel = head_k_dim, head_v_dim, conv_kernel
        key_dim, value_dim = num_k_heads * head_k_dim, num_v_heads * head_v_dim
        self.conv_dim = 2 * key_dim + value_dim
        qkvz = [2 * key_dim + 2 * value_dim] if interleaved else [key_dim, key_dim, value_dim, value_dim]
        ba = [2 * num_v_heads] if interleaved else [num_v_heads, num_v_heads]
        self.in_proj_qkvz = MergedColumnParallelLinear(hidden_size, qkvz, tp_size, tp_rank, dtype=dtype)
        self.in_proj_ba = MergedColumnParallelLinear(hidden_size, ba, tp_size, tp_rank, dtype=dtype)
        self.conv1d = _conv(conv_kernel, self.conv_dim, tp_size, tp_rank, False,
                            segmented_loader([(key_dim, 0, False)] * 2
                                             + [(value_dim, 0, False)], tp_size, tp_rank))
        self.A_log = _vector(num_v_heads, tp_size, tp_rank, "linear_num_value_heads")
        self.dt_bias = _vector(num_v_heads, tp_size, tp_rank, "linear_num_value_heads")
        # per head: replicated
        self.norm = nn.Parameter(torch.ones(head_v_dim, dtype=dtype), requires_grad=False)
        self.norm.weight_loader = lambda p, w: copy_checked(p.data, w)
        self.out_proj = RowParallelLinear(value_dim, hidden_size, tp_size, tp_rank, dtype=dtype)

    def state_shapes(self) -> list[tuple[int, ...]]:
        """Conv state [conv_dim/tp, kernel-1] and recurrent state [v_heads/tp, head_v_dim, head_k_dim]."""
        return [(self.conv_dim // self.tp_size, self.conv_kernel - 1),
                (self.num_v_heads // self.tp_size, self.head_v_dim, self.head_k_dim)]


class Mamba2Mixer(nn.Module):
    """Mamba2 (Nemotron-H): in_proj = [z | x | B | C | dt]. When tp divides n_groups each part is cut by
    rank; with one group (tp does not divide it) B and C are replicated so every rank keeps its heads'
    group."""

    def __init__(self, hidden_size: int, num_heads: int, head_dim: int, n_groups: int, state_size: int,
                 conv_kernel: int, tp_size: int, tp_rank: int, conv_bias: bool = True, bias: bool = False,
                 dtype: torch.dtype | None = None):
        super().__init__()
        check_tp(tp_size, tp_rank)
        divide(num_heads, tp_size, "mamba_num_heads", generic=True)  # named as the config names it
        if n_groups % tp_size and n_groups != 1:
            divide(n_groups, tp_size, "n_groups")  # vLLM replicates a single group only
        self.num_heads, self.head_dim, self.state_size, self.tp_size = (num_heads, head_dim,
                                                                        state_size, tp_size)
        self.conv_kernel, inter = conv_kernel, num_heads * head_dim
        groups = n_groups if n_groups % tp_size == 0 else tp_size  # replicated up to one group per rank
        gs = groups * state_size
        self.conv_dim = inter + 2 * gs
        if n_groups % tp_size == 0:
            self.in_proj = MergedColumnParallelLinear(hidden_size,
                                                      [inter, inter, gs, gs, num_heads], tp_size, tp_rank,
                                                      bias=bias, dtype=dtype)
            self.conv1d = _conv(conv_kernel, self.conv_dim, tp_size, tp_rank, conv_bias,
                                sizes=[inter, gs, gs])
        else:
            group = (gs, (groups - n_groups) * state_size, n_groups == 1)
            segments = [(inter, 0, False), group, group]
            self.in_proj = ColumnParallelLinear(hidden_size,
                                                inter + self.conv_dim + num_heads, tp_size, tp_rank,
                                                bias=bias, dtype=dtype)
            self.in_proj.weight.weight_loader = segmented_loader(
                [(inter, 0, False)] + segments + [(num_heads, 0, False)], tp_size, tp_rank)
            self.conv1d = _conv(conv_kernel, self.conv_dim, tp_size, tp_rank, conv_bias,
                                segmented_loader(segments, tp_size, tp_rank))
        self.A_log = _vector(num_heads, tp_size, tp_rank, "mamba_num_heads")
        self.D = _vector(num_heads, tp_size, tp_rank, "mamba_num_heads")
        self.dt_bias = _vector(num_heads, tp_size, tp_rank, "mamba_num_heads")
        # gated norm, per group
        self.norm = _vector(inter, tp_size, tp_rank, "mamba_num_heads * mamba_head_dim")
        self.out_proj = RowParallelLinear(inter, hidden_size, tp_size, tp_rank, bias=bias, dtype=dtype)

    def state_shapes(self) -> list[tuple[int, ...]]:
        """Conv state [conv_dim/tp, kernel-1] and SSM state [heads/tp, head_dim, state_size]."""
        return [(self.conv_dim // self.tp_size, self.conv_kernel - 1),
                (self.num_heads // self.tp_size, self.head_dim, self.state_size)]


class MambaMixer(nn.Module):
    """Mamba1 (Jamba; vLLM 0.33 layers/mamba/mamba_mixer.py): in_proj = [x | gate] (merged column), a
    depthwise conv1d over the inner channels (column), x_proj row-parallel (each rank projects its channels
    to dt | B | C, all-reduced: a small collective of its own), dt_proj column-parallel back to the inner
    channels, A and D by channel, out_proj row-parallel. The dt / B / C norms are replicated (planned apart).
    """

    def __init__(self, hidden_size: int, inner: int, state_size: int, dt_rank: int, conv_kernel: int,
                 tp_size: int, tp_rank: int, conv_bias: bool = True, bias: bool = False,
                 dtype: torch.dtype | None = None):
        super().__init__()
        check_tp(tp_size, tp_rank)
        what = "mamba_expand * hidden_size"
        divide(inner, tp_size, what, generic=True)  # vLLM's column layers and state divide it; named as the
        # config names it (Jamba's mamba_expand, Mamba's intermediate_size)
        self.inner, self.state_size, self.conv_kernel, self.tp_size = inner, state_size, conv_kernel, tp_size
        self.conv1d = _conv(conv_kernel, inner, tp_size, tp_rank, conv_bias)
        self.in_proj = MergedColumnParallelLinear(hidden_size, [inner] * 2, tp_size, tp_rank, bias=bias,
                                                  dtype=dtype)
        self.x_proj = RowParallelLinear(inner, dt_rank + 2 * state_size, tp_size, tp_rank, dtype=dtype)
        self.dt_proj = ColumnParallelLinear(dt_rank, inner, tp_size, tp_rank, bias=True, dtype=dtype)
        # A: [inner/tp, state], float32 in vLLM, loaded as -exp(A_log); rank r takes its block of rows
        self.A = nn.Parameter(torch.empty(divide(inner, tp_size, what), state_size, dtype=dtype),
                              requires_grad=False)
        self.A.weight_loader = sharded_loader(tp_rank)
        self.D = _vector(inner, tp_size, tp_rank, what)
        self.out_proj = RowParallelLinear(inner, hidden_size, tp_size, tp_rank, bias=bias, dtype=dtype)

    def state_shapes(self) -> list[tuple[int, ...]]:
        """Conv state [inner/tp, kernel-1] and SSM state [inner/tp, state] (mamba1_state_shape)."""
        return [(self.inner // self.tp_size, self.conv_kernel - 1),
                (self.inner // self.tp_size, self.state_size)]


class ShortConv(nn.Module):
    """LFM2's gated short convolution: in_proj = [B | C | x] (merged column), a depthwise conv over the
    hidden channels (column), out_proj (row)."""

    def __init__(self, hidden_size: int, conv_kernel: int, tp_size: int, tp_rank: int, bias: bool = False,
                 dtype: torch.dtype | None = None, input_size: int | None = None):
        super().__init__()
        check_tp(tp_size, tp_rank)
        self.hidden_size, self.conv_kernel, self.tp_size = hidden_size, conv_kernel, tp_size
        # the residual width (a probe when tracing); channels stay hidden_size
        inp = input_size or hidden_size
        self.in_proj = MergedColumnParallelLinear(inp, [hidden_size] * 3, tp_size, tp_rank,
                                                  bias=bias, dtype=dtype)
        self.conv = _conv(conv_kernel, hidden_size, tp_size, tp_rank, bias)
        self.out_proj = RowParallelLinear(hidden_size, inp, tp_size, tp_rank, bias=bias, dtype=dtype)

    def state_shapes(self) -> list[tuple[int, ...]]:
        """Conv state [hidden/tp, kernel-1]."""
        return [(divide(self.hidden_size, self.tp_size, "hidden_size"), self.conv_kernel - 1)]

"""Kimi-Linear's layers as vLLM 0.33 builds them (models/kimi_k3, layers/mamba/gdn/kimi_gdn_linear_attn.py).

Kimi Delta Attention (KDA) is a Gated DeltaNet whose q, k and v each have num_heads heads of head_dim (no
key/value head groups): every per-head part is cut by heads over tp, the low-rank gates' down projections
(f_a, g_a) are whole on every GPU. KimiMoE pads each GPU's share of the routed experts up to a floor when
tp cuts them finer (PaddedExpertsGateUp / PaddedExpertsDown). Only shapes and loaders are modelled: the live
check does not run these layers.
"""
import torch
from torch import nn

from tpviz.errors import WeightsError
from tpviz.layers.linear import (ColumnParallelLinear, MergedColumnParallelLinear, ReplicatedLinear,
                                 RowParallelLinear, check_rows, copy_checked)
from tpviz.rules import check_tp, divide

F_A = 4  # in_proj_qkvgfab's shard id of f_a_proj, the part vLLM keeps whole on every GPU


class KdaInProj(MergedColumnParallelLinear):
    """in_proj_qkvgfab = [q | k | v | b | f_a]: q, k, v (num_heads x head_dim rows each) and b (one row per
    head) cut by heads; f_a (head_dim rows) held whole, as vLLM reserves head_dim x tp rows for it and loads
    it from rank 0's view (_KimiGDNMergedColumnParallelLinear)."""

    def __init__(self, input_size: int, heads: int, head_dim: int, tp_size: int, tp_rank: int,
                 dtype: torch.dtype | None = None):
        self.head_dim = head_dim
        proj = heads * head_dim
        super().__init__(input_size, [proj, proj, proj, heads, head_dim * tp_size], tp_size, tp_rank,
                         dtype=dtype)

    def weight_loader(self, param: nn.Parameter, loaded_weight: torch.Tensor, loaded_shard_id: int):
        if loaded_shard_id != F_A:
            return super().weight_loader(param, loaded_weight, loaded_shard_id)
        check_rows(loaded_weight, self.head_dim, 0)
        offset = sum(self.output_sizes[:F_A]) // self.tp_size
        copy_checked(param.data.narrow(0, offset, self.head_dim), loaded_weight)


def a_log_loader(tp_rank: int):
    """vLLM's a_log_weight_loader: A_log stored [1, 1, heads, 1] (or [heads]), each GPU its heads."""
    def loader(param: nn.Parameter, loaded: torch.Tensor) -> None:
        if loaded.dim() == 4:
            if loaded.shape[:2] != (1, 1) or loaded.shape[-1] != 1:
                raise WeightsError(f"A_log has shape {tuple(loaded.shape)}, expected [1, 1, heads, 1]")
            loaded = loaded.reshape(loaded.shape[2])
        n = param.size(0)
        copy_checked(param.data, loaded.narrow(0, tp_rank * n, n))
    return loader


def _sharded(size: int, tp_size: int, tp_rank: int, what: str, dtype: torch.dtype) -> nn.Parameter:
    """A vector cut in rank order (vLLM's sharded_weight_loader(0))."""
    p = nn.Parameter(torch.empty(divide(size, tp_size, what), dtype=dtype), requires_grad=False)
    n = p.size(0)
    p.weight_loader = lambda param, loaded: copy_checked(param.data, loaded.narrow(0, tp_rank * n, n))
    return p


class KimiDeltaAttention(nn.Module):
    """One rank's KDA mixer (vLLM's KimiGatedDeltaNetAttention without the full-rank gate): in_proj_qkvgfab,
    the fused float32 conv1d [q | k | v] (each rank its heads of each), f_b_proj and g_b_proj column-parallel
    over the heads, g_a_proj replicated, A_log (per head) and dt_bias (per head and channel) in float32, the
    gated o_norm over one head (replicated), o_proj row-parallel."""

    def __init__(self, hidden_size: int, heads: int, head_dim: int, conv_kernel: int, tp_size: int,
                 tp_rank: int, dtype: torch.dtype | None = None, fp32: torch.dtype = torch.float32,
                 gate_rank: int | None = None):
        """fp32: the dtype of the parts vLLM keeps in float32 (conv1d, A_log, dt_bias; the tracer passes its
        own exact dtype); gate_rank: f_b_proj's and g_b_proj's input width (head_dim; the tracer probes it
        narrower)."""
        super().__init__()
        check_tp(tp_size, tp_rank)
        divide(heads, tp_size, "linear_attn_config.num_heads")  # vLLM asserts it
        self.heads, self.head_dim, self.conv_kernel, self.tp_size = heads, head_dim, conv_kernel, tp_size
        proj = heads * head_dim
        self.in_proj_qkvgfab = KdaInProj(hidden_size, heads, head_dim, tp_size, tp_rank, dtype=dtype)
        # three checkpoint tensors (q_conv1d, k_conv1d, v_conv1d) into one [3 x proj / tp, 1, kernel] table
        self.conv1d = MergedColumnParallelLinear(conv_kernel, [proj] * 3, tp_size, tp_rank, dtype=fp32)
        self.conv1d.weight.data = self.conv1d.weight.data.unsqueeze(1)
        self.f_b_proj = ColumnParallelLinear(gate_rank or head_dim, proj, tp_size, tp_rank, dtype=dtype)
        self.g_a_proj = ReplicatedLinear(hidden_size, head_dim, dtype=dtype)
        self.g_b_proj = ColumnParallelLinear(gate_rank or head_dim, proj, tp_size, tp_rank, dtype=dtype)
        self.dt_bias = _sharded(proj, tp_size, tp_rank, "linear_attn_config.num_heads * head_dim", fp32)
        self.A_log = nn.Parameter(torch.empty(heads // tp_size, dtype=fp32),
                                  requires_grad=False)
        self.A_log.weight_loader = a_log_loader(tp_rank)
        self.o_norm = nn.Parameter(torch.ones(head_dim, dtype=dtype), requires_grad=False)
        self.o_norm.weight_loader = lambda p, w: copy_checked(p.data, w)
        self.o_proj = RowParallelLinear(proj, hidden_size, tp_size, tp_rank, dtype=dtype)

    def state_shapes(self) -> list[tuple[int, ...]]:
        """vLLM's kda_state_shape: conv state [3 x heads x head_dim / tp, kernel - 1], recurrent state
        [heads / tp, head_dim, head_dim]."""
        return [(3 * self.heads * self.head_dim // self.tp_size, self.conv_kernel - 1),
                (self.heads // self.tp_size, self.head_dim, self.head_dim)]


def padded_partition(size: int, tp_size: int, floor: int) -> int:
    """KimiMoE's routed-expert rows per GPU: size / tp, or the floor when tp > 1 cuts finer (vLLM 0.33 pads
    moe_intermediate_size to floor x tp and zeroes the rest)."""
    per = divide(size, tp_size, "moe_intermediate_size")
    return floor if tp_size > 1 and per < floor else per


class PaddedExpertsGateUp(MergedColumnParallelLinear):
    """One routed expert's w13 (w1 | w3) on one GPU, each half padded to the floor: rank r's rows of w1 and of
    w3 land at the front of their half, the rest stays zero (FusedMoE._load_w13 with the unpadded
    per-rank size)."""

    def __init__(self, input_size: int, size: int, floor: int, tp_size: int, tp_rank: int,
                 dtype: torch.dtype | None = None):
        self.per = divide(size, tp_size, "moe_intermediate_size")
        alloc = padded_partition(size, tp_size, floor)
        super().__init__(input_size, [alloc * tp_size] * 2, tp_size, tp_rank, dtype=dtype)
        self.size, self.alloc = size, alloc

    def weight_loader(self, param: nn.Parameter, loaded_weight: torch.Tensor, loaded_shard_id: int):
        check_rows(loaded_weight, self.size, 0)
        half = param.data.narrow(0, int(loaded_shard_id) * self.alloc, self.per)
        copy_checked(half, loaded_weight.narrow(0, self.tp_rank * self.per, self.per))


class PaddedExpertsDown(RowParallelLinear):
    """One routed expert's w2 on one GPU: its columns padded to the floor, rank r's columns at the front
    (FusedMoE._load_w2)."""

    def __init__(self, size: int, output_size: int, floor: int, tp_size: int, tp_rank: int,
                 dtype: torch.dtype | None = None):
        self.per = divide(size, tp_size, "moe_intermediate_size")
        alloc = padded_partition(size, tp_size, floor)
        super().__init__(alloc * tp_size, output_size, tp_size, tp_rank, dtype=dtype)
        self.size = size

    def weight_loader(self, param: nn.Parameter, loaded_weight: torch.Tensor):
        check_rows(loaded_weight, self.size, 1)
        copy_checked(param.data.narrow(1, 0, self.per), loaded_weight.narrow(1, self.tp_rank * self.per,
                                                                             self.per))

"""Quantized parameters of the TP linear layers: created per QTensor, loaded by vLLM's parameter rules.

vLLM gives each stored tensor a parameter class (ModelWeightParameter, BlockQuantScaleParameter,
PackedvLLMParameter, PerTensorScaleParameter, ...) whose loader cuts it along its output or input dim in
its own units (parameter.py, linear.py). Here one generic loader does the same from the QTensor's dims
and units, so the tracer reads the layout of a block scale or a packed weight off the loader like any other.
"""
import math

import torch
from torch import nn

from tpviz.errors import TPSizeError
from tpviz.layers.storage import QTensor


class QuantContext:
    """What a layer needs to quantize itself: the stored tensors, the rule set's checks, and whether it is an
    expert (moe_hidden: the hidden size its refined scale blocks must divide)."""

    def __init__(self, tensors: list[QTensor], check=None, moe_hidden: int = 0):
        self.tensors, self.check, self.moe_hidden = tensors, check, moe_hidden


def units(layer: nn.Module, qt: QTensor) -> tuple[int, int]:
    """A tensor's (out, in) units on this layer: block scales refined to smaller blocks (vLLM >= 0.29 MoE)
    shrink."""
    refine = getattr(layer, "refine", 1) if qt.out_unit > 1 and qt.in_unit > 1 else 1
    return qt.out_unit // refine, qt.in_unit // refine


def create(layer: nn.Module, ctx: QuantContext, out_sizes: list[int], in_size: int) -> None:
    """Register one parameter per stored tensor, sized for this rank (out_sizes: its logical output parts)."""
    layer.problem = layer.warning = None
    layer.refine = 1
    if ctx.check:
        ctx.check(layer, out_sizes, in_size)
    for qt in ctx.tensors:
        out_unit, in_unit = units(layer, qt)
        if qt.per_shard:
            shape = (len(out_sizes),)
        elif qt.vector:
            shape = (math.ceil(in_size / in_unit),)
        else:
            dims = [1, 1]
            # vLLM's fused MoE gives each merged part (gate, up) its own scale rows
            if qt.out_dim is not None:
                dims[qt.out_dim] = (sum(math.ceil(s / out_unit) for s in out_sizes) if ctx.moe_hidden
                                    else math.ceil(sum(out_sizes) / out_unit))
            if qt.in_dim is not None:  # a whole input dim on a row layer spans every GPU's inputs
                whole = not qt.in_split and layer.tp_dim == 1
                dims[qt.in_dim] = math.ceil(in_size * (layer.tp_size if whole else 1) / in_unit)
            shape = (2,) if qt.out_dim is None and qt.in_dim is None else tuple(dims)
        param = nn.Parameter(torch.zeros(shape, dtype=torch.float64), requires_grad=False)
        param.qtensor, param.weight_loader = qt, layer.weight_loader
        setattr(layer, qt.name, param)


def _copy(target: torch.Tensor, source: torch.Tensor, what: str) -> None:
    if tuple(target.shape) != tuple(source.shape):
        raise TPSizeError(f"{what}: the checkpoint slice {tuple(source.shape)} does not fit the parameter "
                          f"{tuple(target.shape)}")
    target.copy_(source)


def load(layer: nn.Module, param: nn.Parameter, loaded: torch.Tensor, shard_id=None) -> None:
    """Load one stored tensor of a quantized layer the way vLLM's parameter classes do."""
    qt: QTensor = param.qtensor
    parts = layer.partition_sizes() if hasattr(layer, "partition_sizes") else None
    if qt.per_shard:  # one scalar per logical shard; a fused checkpoint's scale fills every slot
        value = loaded.reshape(-1)[:1]
        if shard_id is None:
            param.data.copy_(value.expand_as(param.data))
        else:
            index = layer.shard_index(shard_id)
            param.data[index:index + 1].copy_(value)
        return
    column = layer.tp_dim == 0
    out_unit, in_unit = units(layer, qt)
    # refined MoE blocks: each checkpoint scale covers several
    if (out_unit, in_unit) != (qt.out_unit, qt.in_unit):
        factor = qt.out_unit // out_unit
        loaded = loaded.repeat_interleave(factor, dim=0 if column else 1)
        if loaded.size(1 if column else 0) * factor == param.size(1 if column else 0):
            loaded = loaded.repeat_interleave(factor, dim=1 if column else 0)
    dim, unit = (qt.out_dim, out_unit) if column else (qt.in_dim if qt.in_split else None, in_unit)
    if dim is None or layer.tp_dim is None:  # held whole: per-channel scales on row layers, weight_shape
        _copy(param.data, loaded, qt.name)
        return
    if not column or shard_id is None and (parts is None or len(parts) == 1):
        size = param.size(dim)
        _copy(param.data, loaded.narrow(dim, layer.tp_rank * size, size), qt.name)
        return
    # fused on disk: split by the global part sizes (in this tensor's units), then per part
    if shard_id is None:
        sizes = [math.ceil(p * layer.tp_size / unit) for p in parts]
        for sid, piece in zip(layer.shard_ids(), loaded.split(sizes, dim)):
            load(layer, param, piece, sid)
        return
    index = layer.shard_index(shard_id)
    offset = math.ceil(sum(parts[:index]) / unit)  # vLLM: ceil of the per-rank offset and size, in units
    size = math.ceil(parts[index] / unit)
    target = param.data.narrow(dim, offset, size) if offset + size <= param.size(dim) else None
    start = layer.checkpoint_index(shard_id) * size
    if target is None or start + size > loaded.size(dim):
        raise TPSizeError(f"{qt.name}: start ({offset}) + length ({size}) exceeds the parameter's "
                          f"{param.size(dim)} rows")
    _copy(target, loaded.narrow(dim, start, size), qt.name)

"""Build each rank's layers and run their real weight_loaders on index-tagged tensors.

Every entry of a tagged tensor holds its own global row (or column) index; parameters start as NaN.
After loading, each non-NaN entry says which source index landed there, so the layout is read off
the loaders themselves, never computed by a separate formula.
"""
from dataclasses import replace

import numpy as np
import torch

from tpviz.config.spec import ModelSpec
from tpviz.config.towers import VISION_NOTE
from tpviz.plan import DT, PROBE, ParamPlan, build_plan
from tpviz.rules import Layout, RuleSet, check_tp, ruleset
from tpviz.trace.caches import rank_caches, state_bytes
from tpviz.trace.probe import build_rank, probing
from tpviz.trace.shardmap import LayerGroup, ParamMap, Piece, RankInfo, ShardMap, TensorMap, numel
from tpviz.trace.validity import split_error


def tagged(shape: tuple, dim: int) -> torch.Tensor:
    """A probe-size tensor whose entries equal their index along dim; other dims have PROBE entries."""
    view = [1] * len(shape)
    view[dim] = shape[dim]
    probe = [PROBE] * len(shape)
    probe[dim] = shape[dim]
    return torch.arange(shape[dim], dtype=DT).reshape(view).expand(probe).contiguous()


def read_pieces(param: torch.Tensor, dim: int, rank: int) -> tuple[list[Piece], np.ndarray]:
    """Runs of consecutive source indices found along dim of a loaded parameter, and the loaded mask."""
    # numpy: a map reads a thousand small vectors, where torch's per-op overhead was half the time
    a = param.detach().numpy()
    vec = a[(0,) * dim + (slice(None),) + (0,) * (a.ndim - dim - 1)]  # along dim, at index 0 of the others
    mask = vec == vec  # loaded: not NaN
    if mask.all():  # the common case, every slot loaded: runs break only where the index skips
        breaks = ((vec[1:] - vec[:-1]) != 1).nonzero()[0] + 1
        if not len(breaks):
            return [Piece(rank, int(vec[0]), int(vec[-1]) + 1, 0)], mask
        pos, vals = np.arange(len(vec)), vec
    else:
        pos = mask.nonzero()[0]
        if not len(pos):
            return [], mask
        vals = vec[pos]
        breaks = (((pos[1:] - pos[:-1]) != 1) | ((vals[1:] - vals[:-1]) != 1)).nonzero()[0] + 1
    vals = vals.astype(np.int64)
    starts, ends = np.concatenate(([0], breaks)), np.concatenate((breaks, [len(pos)]))
    runs = zip(vals[starts].tolist(), vals[ends - 1].tolist(), pos[starts].tolist())
    return [Piece(rank, start, last + 1, at) for start, last, at in runs], mask


def load(param: torch.nn.Parameter, tensor: torch.Tensor, shard_id) -> None:
    """Call the parameter's own weight_loader, with the shard id when there is one."""
    if shard_id is None:
        param.weight_loader(param, tensor)
    else:
        param.weight_loader(param, tensor, shard_id)


def trace_plan(plan: ParamPlan, tp_size: int) -> tuple[list[TensorMap], ParamMap]:
    """Trace one parameter on every rank: its tensor maps and its param map."""
    pieces = {src.name: [] for src in plan.sources}
    local_shapes, padding = [], []
    dims = {src.name: plan.tp_dim if src.dim is None else src.dim for src in plan.sources}
    tags = {}
    # tagged along the split dim on disk, then as the model's load_weights prepares it
    for src in plan.sources:
        tag = tagged(src.shape, dims[src.name])
        tags[src.name] = src.prepare(tag) if src.prepare else tag
    for rank in range(tp_size):
        _, param = build_rank(plan, tp_size, rank)  # _: the layer (a refined MoE scale grid reads its factor)
        plan.read_class(_)
        covered = np.zeros(param.size(plan.tp_dim), dtype=bool)
        for src in plan.sources:
            param.data.fill_(float("nan"))
            for shard_id in src.shard_id if isinstance(src.shard_id, list) else [src.shard_id]:
                load(param, tags[src.name], shard_id)  # a list: one tensor loaded into several shards (K = V)
            found, mask = read_pieces(param.data, plan.tp_dim, rank)
            pieces[src.name] += found
            covered |= mask
        shape = list(plan.shape)
        shape[plan.tp_dim] = param.size(plan.tp_dim)
        refine = getattr(_, "refine", 1) if getattr(param, "qtensor", None) is not None else 1
        # r x r blocks: the other dim too
        if refine > 1 and param.qtensor.out_unit > 1 and param.qtensor.in_unit > 1:
            shape = [n if i == plan.tp_dim else n * refine for i, n in enumerate(shape)]
        local_shapes.append(shape)
        padding.append(len(covered) - int(covered.sum()))
    experts = list(range(plan.experts)) if plan.experts else None
    tensors = [TensorMap(src.name, list(src.shape), dims[src.name] if plan.split else None, plan.name,
                         plan.layer_class, src.shard_id, plan.family, pieces[src.name],
                         plan.layers, experts, plan.note, [list(s) for s in src.sections], plan.tower,
                         plan.blocks, [list(x) for x in plan.stored_at])
               for src in plan.sources]
    param_map = ParamMap(plan.name, plan.layer_class, plan.family, plan.tp_dim if plan.split else None,
                         list(plan.shape), local_shapes, padding, [s.name for s in plan.sources],
                         plan.count, plan.layers, plan.element_bytes, plan.tower, plan.runs)
    return tensors, param_map


def layer_groups(spec: ModelSpec) -> list[LayerGroup]:
    return [LayerGroup(layers, layer.mixer.to_dict(), layer.ffn.to_dict(), layer.label)
            for layer, layers in spec.groups()]


def spread(tensors: list[TensorMap], param: ParamMap, width: int, tp_size: int) -> None:
    """A plan traced over groups of `width` consecutive GPUs, as every one of the tp GPUs holds it: GPU r
    holds what rank r % width of its group holds (width 1: whole on each)."""
    for t in tensors:
        by_rank = {}
        for piece in t.pieces:
            by_rank.setdefault(piece.rank, []).append(piece)
        t.pieces = [replace(piece, rank=r) for r in range(tp_size) for piece in by_rank.get(r % width, [])]
        if width == 1:  # whole on every GPU: drawn and checked as a replicated tensor
            t.split_dim = None
    if width == 1:
        param.split_dim = None
    param.local_shapes = [param.local_shapes[r % width] for r in range(tp_size)]
    param.padding = [param.padding[r % width] for r in range(tp_size)]


@probing()
def trace(spec: ModelSpec, tp_size: int, rules: RuleSet | str = "vllm",
          layout: Layout | None = None) -> ShardMap:
    """The shard map of a model at tp_size, read off the real weight_loaders of every rank; each weight is cut
    over its group in the layout (an engine that carves attention DP or EP out of tp: SGLang), else tp
    ways."""
    rules = ruleset(rules)
    check_tp(tp_size)
    layout = layout or Layout(tp_size)
    plans = build_plan(spec, rules)
    error, warnings = split_error(spec, tp_size, rules, plans, layout=layout)
    if error:
        raise error
    # the map is the layer classes', not the engine's
    left_out = rules.tower_notes(spec)
    warnings = rules.model_notes(spec.model_type) + warnings + left_out
    # the note on how vLLM splits a tower would contradict them
    notes = [n for n in rules.own_notes(spec) if not (left_out and n.startswith(VISION_NOTE))]
    if notes != spec.notes:
        spec = replace(spec, notes=notes)
    widths = rules.widths(layout, spec.arch)
    tensors, params = [], []
    for plan in plans:
        # a whole tensor loads the same on every rank unless its plan says otherwise (tests/trace/
        # test_whole_once.py traces every preset's and scheme's on each rank): traced once, spread to all
        width = 1 if not plan.split and not plan.by_rank else widths.of(plan.role)
        t, p = trace_plan(plan, width)
        if width != tp_size:
            spread(t, p, width, tp_size)
        tensors += t
        params.append(p)
    ranks, state = [], state_bytes(spec, widths.attention)  # a GPU keeps its own sequences' state
    regrouped, capped = rules.regroups_qkv(spec.arch), rules.caps_window(spec)
    for rank in range(tp_size):
        by_family = {}
        for p in params:
            size = p.element_bytes or spec.dtype_bytes
            # SGLang's --ep inside tp: each GPU holds its EP group's equal share of the routed experts
            share = widths.ep if p.family == "experts" else 1
            by_family[p.family] = (by_family.get(p.family, 0)
                                   + numel(p.local_shapes[rank]) * p.count * size // share)
        per_token, windowed, kv_heads = rank_caches(spec, tensors, rank, regrouped)
        if not capped:  # the engine caches every token of a sliding layer too
            per_token, windowed = per_token + sum(w["bytes_per_token"] for w in windowed), []
        ranks.append(RankInfo(rank, sum(by_family.values()), by_family, per_token, kv_heads, windowed,
                              state))
    return ShardMap(tp_size, rules, spec, tensors, params, ranks, layer_groups(spec), warnings=warnings)

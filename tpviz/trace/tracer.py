"""Build each rank's layers and run their real weight_loaders on index-tagged tensors.

Every entry of a tagged tensor holds its own global row (or column) index; parameters start as NaN.
After loading, each non-NaN entry says which source index landed there, so the layout is read off
the loaders themselves, never computed by a separate formula.
"""
import threading
from contextlib import contextmanager

import torch

from tpviz.errors import QuantError, TPSizeError
from tpviz.config.kinds import ATTENTION_KINDS
from tpviz.plan import DT, PROBE, ParamPlan, build_plan, mixer_groups, state_plans
from tpviz.plan.quantized import DESC_ACT
from tpviz.rules import check_rules, check_tp, engine_notes, engine_tp_warnings
from tpviz.trace.shardmap import FAMILIES, LayerGroup, ParamMap, Piece, RankInfo, ShardMap, TensorMap, _numel
from tpviz.config.spec import DTYPE_BYTES, ModelSpec



_threads_lock = threading.Lock()
_threads_depth, _threads_saved = 0, 1


@contextmanager
def single_thread():
    """Probe tensors are tiny: torch's intra-op threads only add contention (10-100x on a busy machine).
    The setting is process-wide, so overlapping traces (app sessions are threads) share one save/restore."""
    global _threads_depth, _threads_saved
    with _threads_lock:
        if _threads_depth == 0:
            _threads_saved = torch.get_num_threads()
            torch.set_num_threads(1)
        _threads_depth += 1
    try:
        yield
    finally:
        with _threads_lock:
            _threads_depth -= 1
            if _threads_depth == 0:
                torch.set_num_threads(_threads_saved)


def build_rank(plan: ParamPlan, tp_size: int, tp_rank: int) -> tuple:
    """Build one rank's module for a plan; generic divisibility errors are renamed to the config key, and a
    quantization check names the layer it failed in (vLLM's own message follows)."""
    try:
        return plan.build(tp_size, tp_rank)
    except QuantError as e:
        hint = (" Expert parallelism (--enable-expert-parallel) keeps every expert whole on one GPU and avoids "
                "this split." if plan.family == "experts" else "")
        reason = f"{where(plan)} at tp_size={tp_size}: {e}"
        raise QuantError(reason + hint, reason=reason) from None
    except TPSizeError as e:
        if plan.quantity and e.generic:
            key, value = plan.quantity
            raise TPSizeError(f"{key}={value} is not divisible by tp_size={tp_size}", key, value, tp_size) from None
        raise


def where(plan: ParamPlan) -> str:
    """The first concrete module of a plan: 'model.layers.3.mlp.experts.0.gate_proj'."""
    module = plan.sources[0].name.rsplit(".", 1)[0]
    if plan.layers:
        module = module.replace("*", str(plan.layers[0]), 1)
    return module.replace("*", "0")


def _check_order(plan: ParamPlan) -> int:
    return FAMILIES.index(plan.family) if plan.family in FAMILIES else len(FAMILIES)


@single_thread()
def layout_error(spec: ModelSpec, tp_size: int, rules: str = "vllm", plans: list[ParamPlan] | None = None,
                 moe_tp: int | None = None) -> tuple[TPSizeError | None, list[str]]:
    """(the first failing rule as the error the layers raised, or None; warnings): what fails while building
    the layers comes first, then what would fail while loading them; warnings name layouts an engine accepts
    only through a fallback. moe_tp: how many ways the routed experts are cut when it differs from tp (tp x dp,
    or 1 with expert parallelism)."""
    check_rules(rules)
    later, warnings = [], engine_tp_warnings(tp_size, rules)
    q = spec.quant
    if q is not None and q.desc_act and q.group > 0 and rules == "vllm":  # refused at any tp since vLLM 0.30
        return QuantError(DESC_ACT), []
    try:
        check_tp(tp_size)
        for plan in sorted(build_plan(spec, rules) if plans is None else plans, key=_check_order):
            cut = moe_tp if moe_tp and plan.family == "experts" else tp_size
            how = f"without expert parallelism the experts are cut tp × dp = {cut} ways: " if cut not in (1, tp_size) else ""
            try:
                module, _ = build_rank(plan, cut, 0)
            except TPSizeError as e:
                e.args = (how + str(e),)  # the type and fields stay; the user typed tp and dp, not `cut`
                raise
            if getattr(module, "problem", None):
                later.append(TPSizeError(f"{how}{where(plan)}: {module.problem}", tp=tp_size))
            if getattr(module, "warning", None):
                warnings.append(f"{where(plan)}: {module.warning}")
    except TPSizeError as e:
        return e, list(dict.fromkeys(warnings))
    return (later[0] if later else None), list(dict.fromkeys(warnings))


def check_layout(spec: ModelSpec, tp_size: int, rules: str = "vllm", plans: list[ParamPlan] | None = None,
                 moe_tp: int | None = None) -> tuple[str | None, list[str]]:
    """layout_error's first failing rule as one line (None when the layout works), and its warnings."""
    error, warnings = layout_error(spec, tp_size, rules, plans, moe_tp)
    return (str(error) if error else None), warnings


def first_problem(spec: ModelSpec, tp_size: int, rules: str = "vllm", plans: list[ParamPlan] | None = None) -> str | None:
    """None if every layer of the model can be built (and loaded) at this tp size, else the first failing rule."""
    return check_layout(spec, tp_size, rules, plans)[0]


def tagged(shape: tuple, dim: int) -> torch.Tensor:
    """A probe-size tensor whose entries equal their index along dim; other dims have PROBE entries."""
    view = [1] * len(shape)
    view[dim] = shape[dim]
    probe = [PROBE] * len(shape)
    probe[dim] = shape[dim]
    return torch.arange(shape[dim], dtype=DT).reshape(view).expand(probe).contiguous()


def read_pieces(param: torch.Tensor, dim: int, rank: int) -> tuple[list[Piece], torch.Tensor]:
    """Runs of consecutive source indices found along dim of a loaded parameter, and the loaded mask."""
    vec = param.detach().movedim(dim, 0).reshape(param.size(dim), -1)[:, 0]
    mask = ~torch.isnan(vec)
    pos = torch.nonzero(mask).flatten()
    vals = vec[pos].long()
    if not len(pos):
        return [], mask
    breaks = torch.nonzero((pos.diff() != 1) | (vals.diff() != 1)).flatten() + 1
    starts = [0] + breaks.tolist()
    ends = breaks.tolist() + [len(pos)]
    pieces = [Piece(rank, int(vals[a]), int(vals[b - 1]) + 1, int(pos[a])) for a, b in zip(starts, ends)]
    return pieces, mask


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
    for src in plan.sources:  # tagged along the split dim on disk, then as the model's load_weights prepares it
        tag = tagged(src.shape, dims[src.name])
        tags[src.name] = src.prepare(tag) if src.prepare else tag
    for rank in range(tp_size):
        _, param = build_rank(plan, tp_size, rank)  # _: the layer (a refined MoE scale grid reads its factor)
        covered = torch.zeros(param.size(plan.tp_dim), dtype=torch.bool)
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
        if refine > 1 and param.qtensor.out_unit > 1 and param.qtensor.in_unit > 1:  # r x r blocks: the other dim too
            shape = [n if i == plan.tp_dim else n * refine for i, n in enumerate(shape)]
        local_shapes.append(shape)
        padding.append(int((~covered).sum()))
    experts = list(range(plan.experts)) if plan.experts else None
    tensors = [TensorMap(src.name, list(src.shape), dims[src.name] if plan.split else None, plan.name,
                         plan.layer_class, src.shard_id, plan.family, pieces[src.name], plan.layers, experts, plan.note,
                         [list(s) for s in src.sections])
               for src in plan.sources]
    param_map = ParamMap(plan.name, plan.layer_class, plan.family, plan.tp_dim if plan.split else None,
                         list(plan.shape), local_shapes, padding, [s.name for s in plan.sources], plan.count, plan.layers,
                         plan.element_bytes)
    return tensors, param_map


def _kv_heads(tensors: list[TensorMap], layers: list[int], d: int, rank: int) -> list[int]:
    """Which global KV heads a rank holds in one attention group, read off the loaded k rows."""
    ks = [t for t in tensors if t.family == "qkv" and t.split_dim is not None and set(t.layers or ()) & set(layers)
          and not t.name.endswith("bias") and (t.shard_id == "k" or (isinstance(t.shard_id, list) and "k" in t.shard_id)
                                               or (t.shard_id is None and any(s[0].split(" ")[0] == "k" for s in t.sections)))]
    # the k tensor in whole output rows: quantized layers also store scales, and AWQ packs the rows 8 to an int32
    k = max(ks, key=lambda t: t.shape[t.split_dim])
    if k.shard_id is not None:  # a separate k tensor ("k", or ["k", "v"] when it also fills V)
        return _kv_in(k, rank, 0, k.shape[k.split_dim], d)
    # fused on disk: the k sections the plan declares (one [k] block, or one per head / KV group)
    ks = [s for s in k.sections if s[0].split(" ")[0] == "k"]
    if len(ks) == 1:
        return _kv_in(k, rank, ks[0][1], ks[0][2], d)
    pieces = k.rank_pieces(rank)
    return [i for i, s in enumerate(ks) if any(p.start < s[2] and s[1] < p.stop for p in pieces)]


def _kv_in(k: TensorMap, rank: int, first: int, last: int, d: int) -> list[int]:
    rows = [(max(p.start, first), min(p.stop, last)) for p in k.rank_pieces(rank)]
    return sorted({(row - first) // d for a, b in rows if a < b for row in range(a, b, d)})


def layer_caches(spec: ModelSpec, tensors: list[TensorMap], rank: int) -> tuple[dict[int, tuple[int, int]], list]:
    """Per attention layer on this rank: (KV bytes per token, window or 0), and the first group's KV heads."""
    b, out, heads_seen = spec.kv_bytes, {}, None
    for mixer, layers in mixer_groups(spec).items():
        if mixer.kind == "mla":  # the compressed latent and rope key are cached whole on every rank
            out.update({i: ((spec.kv_lora_rank + spec.qk_rope_head_dim) * b, 0) for i in layers})
        elif mixer.kind in ATTENTION_KINDS:
            heads = _kv_heads(tensors, layers, mixer.head_dim, rank)
            heads_seen = heads if heads_seen is None else heads_seen
            out.update({i: (2 * len(heads) * mixer.head_dim * b, spec.layers[i].mixer.window) for i in layers})
    return out, heads_seen or []


def _caches(spec: ModelSpec, tensors: list[TensorMap], rank: int) -> tuple[int, list[dict], list[int]]:
    """Per rank: KV bytes per token of unbounded layers, the windowed layers' entries, and the KV heads held."""
    per_layer, heads = layer_caches(spec, tensors, rank)
    per_token, windowed = 0, {}
    for i, (size, window) in per_layer.items():
        if not window:
            per_token += size
        else:
            key = (spec.layers[i].mixer.kind, window)
            windowed[key] = windowed.get(key, 0) + size
    entries = [{"kind": kind, "window": w, "layers": sum(1 for x in spec.layers if (x.mixer.kind, x.mixer.window) ==
                                                          (kind, w)), "bytes_per_token": v}
               for (kind, w), v in windowed.items()]
    return per_token, entries, heads


def _state_bytes(spec: ModelSpec, tp_size: int, rank: int) -> int:
    """Recurrent state per sequence on this rank, from the stateful layers' own state shapes."""
    ssm_bytes = DTYPE_BYTES.get(spec.state_dtype, spec.dtype_bytes)  # Nemotron-H keeps its SSM state in float32
    total = 0
    for layers, build in state_plans(spec):
        conv, *ssm = build(tp_size, rank).state_shapes()
        total += (_numel(conv) * spec.dtype_bytes + sum(_numel(s) for s in ssm) * ssm_bytes) * len(layers)
    return total


def layer_groups(spec: ModelSpec) -> list[LayerGroup]:
    return [LayerGroup(layers, layer.mixer.to_dict(), layer.ffn.to_dict(), layer.label) for layer, layers in spec.groups()]


@single_thread()
def trace(spec: ModelSpec, tp_size: int, rules: str = "vllm") -> ShardMap:
    """The shard map of a model at tp_size, read off the real weight_loaders of every rank."""
    check_rules(rules)
    check_tp(tp_size)
    plans = build_plan(spec, rules)
    error, warnings = layout_error(spec, tp_size, rules, plans)
    if error:
        raise error
    warnings = engine_notes(spec.model_type, rules) + warnings  # the map is the layer classes', not the engine's
    tensors, params = [], []
    for plan in plans:
        t, p = trace_plan(plan, tp_size)
        tensors += t
        params.append(p)
    ranks = []
    for rank in range(tp_size):
        by_family = {}
        for p in params:
            size = p.element_bytes or spec.dtype_bytes
            by_family[p.family] = by_family.get(p.family, 0) + _numel(p.local_shapes[rank]) * p.count * size
        per_token, windowed, kv_heads = _caches(spec, tensors, rank)
        ranks.append(RankInfo(rank, sum(by_family.values()), by_family, per_token, kv_heads, windowed,
                              _state_bytes(spec, tp_size, rank)))
    return ShardMap(tp_size, rules, spec, tensors, params, ranks, layer_groups(spec), warnings=warnings)

"""`python -m tpviz map MODEL --tp N`: every tensor's pieces per rank, per-rank memory, a deployment's GPUs,
and whether it fits; --json and --png write the exports."""
import os
from pathlib import Path

from tpviz.cli.outpaths import writable_file, writable_folder
from tpviz.config.sources import load_spec
from tpviz.config.spec import ModelSpec
from tpviz.deploy.deployment import deploy
from tpviz.deploy.equivalent import equivalent
from tpviz.deploy.fit import fit, sizing_notes
from tpviz.deploy.parallel import placement_flag
from tpviz.deploy.traffic import COMM_LABELS
from tpviz.errors import TPSizeError, TpvizError
from tpviz.render.export import write_pngs
from tpviz.render.summary import layer_span
from tpviz.render.text import fmt_bytes
from tpviz.rules import Layout, ruleset
from tpviz.trace.checkpoint import checkpoint_sentence
from tpviz.trace.model_map import hub_checkpoint, local_checkpoint, map_model
from tpviz.trace.shardmap import Deployment, ShardMap, TensorMap
from tpviz.trace.validity import valid_table


def _ranges(t: TensorMap, tp: int) -> str:
    def one(rank):
        ps = t.rank_pieces(rank)
        return f"r{rank}:" + ",".join(f"{p.start}-{p.stop - 1}" for p in ps)
    if t.split_dim is None:
        return "every rank: all"
    ranks = list(range(tp)) if tp <= 4 else [0, 1, None, tp - 1]
    return "  ".join("..." if r is None else one(r) for r in ranks)


def summary(m: ShardMap) -> str:
    """A compact per-tensor table and per-rank memory, as the `map` command prints it."""
    spec = m.model
    lines = [f"{spec.name}  tp={m.tp_size}  rules={m.rules.name}  ({spec.num_hidden_layers} "
             f"layers, {spec.dtype})"]
    if len(m.groups) > 1:
        lines += [f"group {i + 1}: layers {layer_span(g.layers)} ({len(g.layers)}): {g.label}"
                  for i, g in enumerate(m.groups)]
    width = max(len(t.name) for t in m.tensors)
    for t in m.tensors:
        split = "-" if t.split_dim is None else f"dim{t.split_dim}"
        shard = "" if t.shard_id is None else f"[{t.shard_id}]"
        shape = "x".join(map(str, t.shape))
        where = (f"  [layers {layer_span(t.layers, 4)}]" if t.layers and len(m.groups) > 1 else
                 f"  [× {t.blocks}, one per *]" if t.blocks else "")
        lines.append(f"{t.name:<{width}}  {shape:>13}  {split:<4}  {t.layer_class + shard:<30}  "
                     f"{_ranges(t, m.tp_size)}{where}")
    naive = m.total_weight_bytes / m.tp_size
    if m.deployment:  # the layout's own per-GPU lines follow; these are the plain tp split they start from
        lines.append(("every layer on each GPU of a stage, cut over the layout's groups"
                      if m.deployment.layout.carved else "tp only, every layer on each rank")
                     + f" (the layout {m.deployment.label} below places them):")
    for r in m.ranks:
        windowed = "".join(f" + {fmt_bytes(w['bytes_per_token'])}/token up to {w['window']} "
                           f"tokens ({w['layers']} {w['kind'].split('_')[0]} layers)"
                           for w in r.kv_cache_windowed)
        state = (f", state {fmt_bytes(r.state_bytes_per_sequence)}/sequence"
                 if r.state_bytes_per_sequence else "")
        lines.append(f"rank {r.rank}: weights {fmt_bytes(r.weight_bytes)} (naive total/tp "
                     f"{fmt_bytes(naive)}), KV cache "
                     f"{fmt_bytes(r.kv_cache_bytes_per_token)}/token{windowed}{state}")
    for note in spec.notes:
        lines.append(f"note: {note}")
    return "\n".join(lines)


def fit_line(m: ShardMap, args) -> str:
    """One line: does it fit on these GPUs, and how many sequences of the context."""
    f = fit(m, args.gpu_mem, args.util, args.context, args.concurrency,
            layout=m.deployment.layout if m.deployment else None)
    if f.room <= 0:
        return (f"fit: does not fit: {fmt_bytes(f.weights)} of weights on the fullest GPU, vLLM may use "
                f"{fmt_bytes(f.usable)} of {args.gpu_mem:g} GiB at gpu_memory_utilization {args.util:g}")
    tokens = f" = {f.kv_tokens:,} KV-cache tokens" if f.kv_tokens is not None else ""
    return "\n".join([
        f"fit: {fmt_bytes(f.room)} left for KV cache per GPU{tokens}; {f.sequences} "
        f"({'enough for' if f.fits else 'fewer than'} the {args.concurrency:,} asked for)",
        *(f"note: {note}" for note in ([f.note] if f.note else []) + sizing_notes(m.model, m.rules))])


def expert_span(experts: list[int]) -> str:
    """'0–63' for a contiguous block, '1, 5, 9, … (32)' for round-robin, 'none' for none."""
    if not experts:
        return "none"
    if experts == list(range(experts[0], experts[-1] + 1)):
        return f"{experts[0]}–{experts[-1]}"
    return ", ".join(map(str, experts[:3])) + f", … ({len(experts)})"


def layout_lines(d: Deployment) -> str:
    """The device grid as text: one line per GPU (stage, replica, tp rank, layers, experts, bytes)."""
    lines = [f"layout {d.label}: stages hold layers " + ", ".join(f"{a}–{b - 1}" for a, b in d.stages)]
    for g in d.gpus[:64]:
        experts = "" if g.experts is None else f", experts {expert_span(g.experts)}"
        lines.append(f"GPU {g.rank:>3} (stage {g.pp}, replica {g.dp}, tp rank {g.tp}): layers "
                     f"{g.layers[0]}–{g.layers[1] - 1}{experts}, weights {fmt_bytes(g.weight_bytes)}, "
                     f"KV cache {fmt_bytes(g.kv_cache_bytes_per_token)}/token" + (
                         f" + {fmt_bytes(g.kv_windowed_bytes_per_token)}/token up to a window"
                         if g.kv_windowed_bytes_per_token else ""))
    if len(d.gpus) > 64:
        lines.append(f"... {len(d.gpus) - 64} more GPUs in the JSON")
    parts = [f"{COMM_LABELS[k]} {fmt_bytes(v)}" for k, v in d.comm_bytes_per_token.items() if v]
    lines.append(f"sent per decoded token by the busiest GPU: {', '.join(parts) or 'nothing'}"
                 if d.comm_bytes_per_token or not d.layout.carved else
                 "sent per decoded token: not modelled for SGLang's attention DP and EP (its DP gathers and "
                 "expert sums)")
    return "\n".join(lines)


def cmd_map(args) -> int:
    fit_flags = {"util": 0.9, "context": 8192, "concurrency": 1}  # their defaults: they size the KV cache
    if args.gpu_mem is None and (given := [f"--{k}" for k in fit_flags if getattr(args, k) is not None]):
        raise TpvizError(f"{', '.join(given)} only apply with --gpu-mem GIB (they size "
                         "the KV cache on a GPU)")
    for k, default in fit_flags.items():
        setattr(args, k, default if getattr(args, k) is None else getattr(args, k))
    layout = layout_from_args(args)
    args.placement = placement_flag(args.placement, layout.ep or layout.ep_size > 1)
    if args.json is not None:  # before any work, so a typo does not cost a finished map
        writable_file(args.json, "--json", "map.json")
    if args.png is not None:
        writable_folder(args.png, "--png")
    spec = load_spec(args.model)  # read once, for the deployment, the map and the valid sizes
    spec = spec.served(mm_encoder=args.mm_encoder_tp_mode)
    checkpoint = local_checkpoint(args.model) or hub_checkpoint(args.model)
    try:  # one line if it cannot exist; with EP the experts stay whole
        lay = deploy(spec, layout, args.rules, args.placement) if layout != Layout(args.tp) else None
    except TPSizeError as e:
        raise with_valid_sizes(e, spec, args.rules) from None
    try:
        m = map_model(spec, args.tp, args.rules, checkpoint, args.dtype, args.kv_cache_dtype,
                      layout if layout.carved else None)
    except TPSizeError as e:
        if lay is not None and layout.ep:  # only the experts' TP split is refused, and EP keeps them whole
            return ep_only(args, lay, e)
        raise with_valid_sizes(e, spec, args.rules) from None
    m.deployment = lay
    fit = fit_line(m, args) if args.gpu_mem is not None else None  # checked before anything is printed
    print(summary(m))
    for w in lay.warnings if lay else m.warnings:  # a deployment's own: with EP the experts are not cut
        print(f"warning: {w}")
    if m.checkpoint:
        print(checkpoint_sentence(m.checkpoint))
        if not m.checkpoint["bytes"]["checked"]:
            print("note: the stored dtypes were not read (no weight files here, or the hub is offline): "
                  "memory is sized from the config")
    if m.deployment:
        print(layout_lines(m.deployment))
    if not ruleset(args.rules).tp_only:  # the same GPUs in the other engine, deployed and compared
        try:
            print(equivalent(spec, layout, args.rules, args.placement).line)
        except TpvizError as e:  # the layout maps but does not deploy (its refusal was said above)
            print(f"no equivalent in the other engine: {e}")
    if fit:  # after the layout's GPUs, whose fullest one it sizes
        print(fit)
    if args.json:
        Path(args.json).write_text(m.to_json(indent=1))
        print(f"wrote {args.json}")
    if args.png:
        for path in write_pngs(m, args.png):
            print(f"wrote {path}")
    return 0


def layout_from_args(args) -> Layout:
    """The layout the flags spell, in the chosen engine's vocabulary (SGLang: --ep N inside --tp)."""
    sglang = ruleset(args.rules).carves
    if not sglang and (args.attn_dp_size != 1 or args.moe_dense_tp_size is not None
                       or args.enable_dp_lm_head):
        raise TpvizError(f"--attn-dp-size, --moe-dense-tp-size and --enable-dp-lm-head are SGLang's: add "
                         f"--rules sglang ({ruleset(args.rules).label} attention DP is --dp)")
    if args.moe_dense_tp_size not in (None, 1, args.tp):  # SGLang's own check_server_args words
        raise TpvizError("moe_dense_tp_size only supports None, 1, or tp_size currently")
    ep = args.ep
    if not sglang:
        if ep not in (None, 0, args.tp * args.dp):
            raise TpvizError(f"--ep {ep}: {ruleset(args.rules).label} expert parallelism spans tp × dp = "
                             f"{args.tp * args.dp} GPUs (give --ep alone); an EP smaller than tp is SGLang's "
                             "(--rules sglang)")
        return Layout(args.tp, args.pp, args.dp, ep is not None)
    return Layout(args.tp, args.pp, args.dp, attn_dp=args.attn_dp_size,
                  ep_size=args.tp if ep == 0 else ep or 1,
                  dense_tp1=args.moe_dense_tp_size == 1 and args.tp > 1, dp_lm_head=args.enable_dp_lm_head,
                  shared_tp1=os.environ.get("SGLANG_SHARED_EXPERT_TP1", "").lower() in ("1", "true"))


def with_valid_sizes(e: TPSizeError, spec: ModelSpec, rules: str) -> TpvizError:
    """The refusal with what would work: the tp sizes this model splits by under the chosen rules."""
    _, rows = valid_table(spec, 64)
    sizes = ", ".join(str(r.tp) for r in rows if r.valid(rules)) or "none"
    return TpvizError(f"{str(e).rstrip('.')}. Valid tp sizes under {ruleset(rules).label} rules: {sizes}.")


def ep_only(args, lay: Deployment, refused: TPSizeError) -> int:
    """A layout that exists only with EP: its GPUs, without the per-tensor map (which cuts every expert by
    tp)."""
    if args.json or args.png or args.gpu_mem is not None:
        raise TpvizError(f"at tp={args.tp} the experts cannot be cut by tp, so only the EP "
                         "layout exists; --json, --png and --gpu-mem need the per-tensor map, "
                         "which cuts them: drop those, or pick a tp the experts split by")
    print(f"{lay.label}: without EP, {refused.reason.rstrip('.')}; with EP every "
          "routed expert stays whole on one GPU, so the per-tensor map (which cuts them by "
          "tp) is not drawn: the GPUs below are the layout vLLM runs")
    for w in lay.warnings:
        print(f"warning: {w}")
    print(layout_lines(lay))
    return 0

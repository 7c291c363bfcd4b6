"""Command line: `python -m tpviz map|valid|verify ...`. User errors exit 2 with one line on stderr."""
import argparse
import json
import sys
from pathlib import Path

from tpviz.errors import TPSizeError, TpvizError
from tpviz.render.text import fmt_bytes
from tpviz.trace.validity import valid_table  # noqa: F401 - re-exported: the CLI's helpers
from tpviz.rules import ENGINE, RULES
from tpviz.deploy.parallel import PLACEMENTS, Layout, placement_flag
from tpviz.config.spec import KV_DTYPES, SERVE_DTYPES
from tpviz.trace.shardmap import ShardMap, TensorMap


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse's own usage errors: one line, exit 2
        raise TpvizError(f"{self.prog}: {message}")


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
    lines = [f"{spec.name}  tp={m.tp_size}  rules={m.rules}  ({spec.num_hidden_layers} layers, {spec.dtype})"]
    from tpviz.render.summary import layer_span
    if len(m.groups) > 1:
        lines += [f"group {i + 1}: layers {layer_span(g.layers)} ({len(g.layers)}): {g.label}" for i, g in enumerate(m.groups)]
    width = max(len(t.name) for t in m.tensors)
    for t in m.tensors:
        split = "-" if t.split_dim is None else f"dim{t.split_dim}"
        shard = "" if t.shard_id is None else f"[{t.shard_id}]"
        shape = "x".join(map(str, t.shape))
        where = f"  [layers {layer_span(t.layers, 4)}]" if t.layers and len(m.groups) > 1 else ""
        lines.append(f"{t.name:<{width}}  {shape:>13}  {split:<4}  {t.layer_class + shard:<30}  {_ranges(t, m.tp_size)}{where}")
    naive = m.total_weight_bytes / m.tp_size
    if m.layout:  # the layout's own per-GPU lines follow; these are the plain tp split they start from
        lines.append(f"tp only, every layer on each rank (the layout {m.layout['label']} below places them):")
    for r in m.ranks:
        windowed = "".join(f" + {fmt_bytes(w['bytes_per_token'])}/token up to {w['window']} tokens ({w['layers']} "
                           f"{w['kind'].split('_')[0]} layers)" for w in r.kv_cache_windowed)
        state = f", state {fmt_bytes(r.state_bytes_per_sequence)}/sequence" if r.state_bytes_per_sequence else ""
        lines.append(f"rank {r.rank}: weights {fmt_bytes(r.weight_bytes)} (naive total/tp {fmt_bytes(naive)}), "
                     f"KV cache {fmt_bytes(r.kv_cache_bytes_per_token)}/token{windowed}{state}")
    for note in spec.notes:
        lines.append(f"note: {note}")
    return "\n".join(lines)


def fit_line(m: ShardMap, args) -> str:
    """One line: does it fit on these GPUs, and how many sequences of the context."""
    from tpviz.deploy.fit import fit, sizing_notes
    f = fit(m, args.gpu_mem, args.util, args.context, args.concurrency, layout=Layout.of(m.layout))
    if f.room <= 0:
        return (f"fit: does not fit: {fmt_bytes(f.weights)} of weights on the fullest GPU, vLLM may use "
                f"{fmt_bytes(f.usable)} of {args.gpu_mem:g} GiB at gpu_memory_utilization {args.util:g}")
    tokens = f" = {f.kv_tokens:,} KV-cache tokens" if f.kv_tokens is not None else ""
    return "\n".join([
        f"fit: {fmt_bytes(f.room)} left for KV cache per GPU{tokens}; {f.max_sequences:,} concurrent sequences of "
        f"{f.context:,} tokens ({'enough for' if f.fits else 'fewer than'} the {args.concurrency:,} asked for)",
        *(f"note: {note}" for note in ([f.note] if f.note else []) + sizing_notes(m.model, m.rules))])


def expert_span(experts: list[int]) -> str:
    """'0–63' for a contiguous block, '1, 5, 9, … (32)' for round-robin, 'none' for none."""
    if not experts:
        return "none"
    if experts == list(range(experts[0], experts[-1] + 1)):
        return f"{experts[0]}–{experts[-1]}"
    return ", ".join(map(str, experts[:3])) + f", … ({len(experts)})"


def layout_lines(lay: dict) -> str:
    """The device grid as text: one line per GPU (stage, replica, tp rank, layers, experts, bytes)."""
    from tpviz.deploy.planner import COMM_LABELS
    lines = [f"layout {lay['label']}: stages hold layers " + ", ".join(f"{a}–{b - 1}" for a, b in lay["stages"])]
    for g in lay["gpus"][:64]:
        experts = "" if g["experts"] is None else f", experts {expert_span(g['experts'])}"
        lines.append(f"GPU {g['rank']:>3} (stage {g['pp']}, replica {g['dp']}, tp rank {g['tp']}): layers "
                     f"{g['layers'][0]}–{g['layers'][1] - 1}{experts}, weights {fmt_bytes(g['weight_bytes'])}, "
                     f"KV cache {fmt_bytes(g['kv_cache_bytes_per_token'])}/token" + (
                         f" + {fmt_bytes(g['kv_windowed_bytes_per_token'])}/token up to a window"
                         if g["kv_windowed_bytes_per_token"] else ""))
    if len(lay["gpus"]) > 64:
        lines.append(f"... {len(lay['gpus']) - 64} more GPUs in the JSON")
    parts = [f"{COMM_LABELS[k]} {fmt_bytes(v)}" for k, v in lay["comm_bytes_per_token"].items() if v]
    lines.append(f"sent per decoded token by the busiest GPU: {', '.join(parts) or 'nothing'}")
    return "\n".join(lines)


def cmd_map(args) -> int:
    from tpviz import shard_map
    from tpviz.trace.checkpoint import checkpoint_sentence, hub_sizes, tensor_names_for
    from tpviz.cli.outpaths import writable_file, writable_folder
    fit_flags = {"util": 0.9, "context": 8192, "concurrency": 1}  # their defaults: they size the KV cache
    if args.gpu_mem is None and (given := [f"--{k}" for k in fit_flags if getattr(args, k) is not None]):
        raise TpvizError(f"{', '.join(given)} only apply with --gpu-mem GIB (they size the KV cache on a GPU)")
    for k, default in fit_flags.items():
        setattr(args, k, default if getattr(args, k) is None else getattr(args, k))
    args.placement = placement_flag(args.placement, args.ep)
    if args.json is not None:  # before any work, so a typo does not cost a finished map
        writable_file(args.json, "--json", "map.json")
    if args.png is not None:
        writable_folder(args.png, "--png")
    names, where = tensor_names_for(args.model)
    try:
        lay = deployment(args) if args.pp != 1 or args.dp != 1 or args.ep else None  # one line if it cannot exist
    except TPSizeError as e:
        raise with_valid_sizes(e, args) from None
    try:
        m = shard_map(args.model, args.tp, args.rules, tensor_names=names, checkpoint_source=where, dtype=args.dtype,
                      kv_cache_dtype=args.kv_cache_dtype, tensor_bytes=hub_sizes(args.model) if names else None)
    except TPSizeError as e:
        if lay is not None and args.ep:  # only the experts' TP split is refused, and EP keeps them whole
            return ep_only(args, lay, e)
        raise with_valid_sizes(e, args) from None
    m.layout = lay
    fit = fit_line(m, args) if args.gpu_mem is not None else None  # checked before anything is printed
    print(summary(m))
    for w in (lay or {}).get("warnings", m.warnings):  # a deployment's own: with EP the experts are not cut
        print(f"warning: {w}")
    if m.checkpoint:
        print(checkpoint_sentence(m.checkpoint))
        if not m.checkpoint["bytes"]["checked"]:
            print("note: the stored dtypes were not read (no weight files here, or the hub is offline): "
                  "memory is sized from the config")
    if m.layout:
        print(layout_lines(m.layout))
    if fit:  # after the layout's GPUs, whose fullest one it sizes
        print(fit)
    if args.json:
        Path(args.json).write_text(m.to_json(indent=1))
        print(f"wrote {args.json}")
    if args.png:
        from tpviz.render.export import write_pngs
        for path in write_pngs(m, args.png):
            print(f"wrote {path}")
    return 0


def with_valid_sizes(e: TPSizeError, args) -> TpvizError:
    """The refusal with what would work: the tp sizes this model splits by under the chosen rules."""
    _, rows = valid_table(args.model, 64)
    sizes = ", ".join(str(r.tp) for r in rows if r.valid(args.rules)) or "none"
    return TpvizError(f"{str(e).rstrip('.')}. Valid tp sizes under {ENGINE[args.rules]} rules: {sizes}.")


def deployment(args) -> dict:
    """The tp x pp x dp (+ EP) layout asked for (tpviz.deploy.deployment), checked as vLLM would: with EP, experts unsplit."""
    from tpviz.deploy.deployment import layout_map
    from tpviz.config.sources import load_spec
    return layout_map(load_spec(args.model), Layout(args.tp, args.pp, args.dp, args.ep), args.rules, args.placement)


def ep_only(args, lay: dict, refused: TPSizeError) -> int:
    """A layout that exists only with EP: its GPUs, without the per-tensor map (which cuts every expert by tp)."""
    if args.json or args.png or args.gpu_mem is not None:
        raise TpvizError(f"at tp={args.tp} the experts cannot be cut by tp, so only the EP layout exists; --json, "
                         "--png and --gpu-mem need the per-tensor map, which cuts them: drop those, or pick a tp the "
                         "experts split by")
    print(f"{lay['label']}: without EP, {refused.reason.rstrip('.')}; with EP every "
          "routed expert stays whole on one GPU, so the per-tensor map (which cuts them by tp) is not drawn: the "
          "GPUs below are the layout vLLM runs")
    for w in lay["warnings"]:
        print(f"warning: {w}")
    print(layout_lines(lay))
    return 0


def print_warnings(warnings: set[str], where: str, most: int = 5) -> None:
    """The distinct warnings of a table's rows, the first `most` of them, and where the rest are."""
    ranked = sorted(warnings)
    for w in ranked[:most]:
        print(f"warning: {w}")
    if len(ranked) > most:
        print(f"... {len(ranked) - most} more warnings: {where}")


def cmd_valid(args) -> int:
    if not 1 <= args.max_tp <= 1024:
        raise TpvizError(f"--max-tp={args.max_tp} must be between 1 and 1024")
    from tpviz.rules import engine_notes
    from tpviz.config.sources import load_spec
    spec = load_spec(args.model)  # read once: valid_table takes the spec
    name, rows = valid_table(spec, args.max_tp)
    notes = {r: engine_notes(spec.model_type, r) for r in RULES}  # what an engine never runs
    if args.json:
        print(json.dumps({"schema": "tpviz.valid/1", "model": name, "rules": {r: ENGINE[r] for r in RULES},
                          "notes": {r: n for r, n in notes.items() if n},
                          "rows": [{"tp": row.tp, **{r: {"valid": row.valid(r), "problem": row.problems[r],
                                                            "warnings": row.warnings.get(r, [])}
                                                           for r in RULES}} for row in rows]}, indent=1))
        return 0
    print(f"{name}: valid tp sizes")
    cells = [["valid" + (" (warning below)" if row.warnings.get(r) else "") if row.valid(r) else row.problems[r]
              for r in RULES] for row in rows]
    widths = [max(len(ENGINE[r]), *(len(c[i]) for c in cells)) for i, r in enumerate(RULES)]
    print(f"{'tp':>4}  " + "  ".join(f"{ENGINE[r]:<{w}}" for r, w in zip(RULES, widths)).rstrip())
    for row, cell in zip(rows, cells):
        print(f"{row.tp:>4}  " + "  ".join(f"{c:<{w}}" for c, w in zip(cell, widths)).rstrip())
    print_warnings({w for row in rows for ws in row.warnings.values() for w in ws}, "valid --json gives each tp's")
    for r, lines in notes.items():
        for line in lines:
            print(f"note ({ENGINE[r]} column): {line}")
    return 0


def cmd_plan(args) -> int:
    """Every layout of --gpus GPUs: accepted ones ranked (fits, then KV room), rejected ones with their rule."""
    from tpviz.deploy.planner import plan, plan_notes, plan_rows
    from tpviz.config.sources import load_spec
    spec = load_spec(args.model)
    rows = plan(spec, args.gpus, args.gpu_mem, args.rules, args.util, args.context)
    notes = plan_notes(spec, args.rules, any(r.fits for r in rows), args.context)
    if args.json:
        print(json.dumps({"schema": "tpviz.plan/1", "model": spec.name, "rules": args.rules, "engine": ENGINE[args.rules],
                          "gpus": args.gpus, "gpu_mem_gib": args.gpu_mem, "utilization": args.util,
                          "context": args.context, "notes": notes, "layouts": plan_rows(rows)}, indent=1))
        return 0
    from tpviz.deploy.fit import capped_context
    context = capped_context(spec, args.context)[0]
    print(f"{spec.name} on {args.gpus} × {args.gpu_mem:g} GiB ({ENGINE[args.rules]} rules, context {context:,})")
    print(f"{'layout':<28} {'weights/GPU':>12} {'KV tokens':>11} {'sequences':>10} {'comm/token':>11}  verdict")
    for r in rows:
        verdict = ("fits" if r.fits else "does not fit") + (" (warning below)" if r.warnings else "") \
            if r.problem is None else f"rejected: {r.problem}"
        numbers = (f"{fmt_bytes(r.weights):>12} {r.kv_tokens:>11,} {r.max_sequences:>10,} {fmt_bytes(r.comm_per_token):>11}"
                   if r.problem is None else f"{'':>12} {'':>11} {'':>10} {'':>11}")
        print(f"{r.layout.label:<28} {numbers}  {verdict}")
    print_warnings({w for r in rows if r.problem is None for w in r.warnings}, "plan --json gives each layout's")
    for note in notes:
        print(f"note: {note}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m tpviz", description="See and check tensor-parallel weight sharding.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    p = sub.add_parser("map", help="print where every tensor goes, optionally write JSON / PNG")
    p.add_argument("model", help="preset or hub id (owner/name), or a local config.json / checkpoint folder")
    p.add_argument("--tp", type=int, required=True, help="tensor-parallel size")
    p.add_argument("--rules", choices=RULES, default="vllm")
    p.add_argument("--json", metavar="PATH", help="write the shard map (schema tpviz.shardmap/4)")
    p.add_argument("--png", metavar="DIR", help="write one PNG per figure into DIR")
    p.add_argument("--dtype", choices=SERVE_DTYPES, default="auto", help="weight dtype served (auto: float32 -> bf16)")
    p.add_argument("--kv-cache-dtype", choices=list(KV_DTYPES), default="auto")
    p.add_argument("--gpu-mem", type=float, metavar="GIB", help="GPU memory: print whether it fits and how many sequences")
    p.add_argument("--util", type=float, help="gpu_memory_utilization with --gpu-mem (default 0.9)")
    p.add_argument("--context", type=int, help="tokens per sequence with --gpu-mem (default 8192)")
    p.add_argument("--concurrency", type=int, help="sequences that should fit at once, with --gpu-mem (default 1)")
    p.add_argument("--pp", type=int, default=1, help="pipeline stages (vLLM's partition of the layers)")
    p.add_argument("--dp", type=int, default=1, help="data-parallel replicas")
    p.add_argument("--ep", action="store_true", help="expert parallelism: whole experts on the tp x dp GPUs")
    p.add_argument("--placement", choices=PLACEMENTS, help="expert placement with --ep (default linear)")
    p.set_defaults(func=cmd_map)
    p = sub.add_parser("valid", help="which tp sizes work, under every rule set (vLLM 0.33, vLLM 0.28, nano-vllm)")
    p.add_argument("model")
    p.add_argument("--max-tp", type=int, default=64, help="the largest tp size tried (default 64)")
    p.add_argument("--json", action="store_true", help="print the table as JSON (schema tpviz.valid/1)")
    p.set_defaults(func=cmd_valid)
    p = sub.add_parser("plan", help="every tp x pp x dp (+ expert parallel) layout of N GPUs, ranked")
    p.add_argument("model")
    p.add_argument("--gpus", type=int, required=True, help="GPUs in total")
    p.add_argument("--gpu-mem", type=float, required=True, metavar="GIB", help="memory of each GPU")
    p.add_argument("--rules", choices=RULES, default="vllm")
    p.add_argument("--util", type=float, default=0.9, help="gpu_memory_utilization (default 0.9)")
    p.add_argument("--context", type=int, default=8192, help="tokens per sequence")
    p.add_argument("--json", action="store_true", help="print the plan as JSON (schema tpviz.plan/1)")
    p.set_defaults(func=cmd_plan)
    sub.add_parser("verify", help="run a real TP forward pass and check it against one device (see verify -h)",
                   add_help=False)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["verify"]:
        from tpviz.cli.verify import main as verify_main
        return verify_main(argv[1:])
    try:
        args = build_parser().parse_args(argv)
        return args.func(args)
    except TpvizError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # output piped into head
        return 0
    except OSError as e:  # e.g. an unwritable --json path
        print(f"error: {e.strerror or e}: {e.filename or ''}".rstrip(": "), file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130

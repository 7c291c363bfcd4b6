"""`python -m tpviz valid MODEL` (which tp sizes work under every rule set) and `compare MODEL --gpus N`
(vLLM's layouts beside SGLang's)."""
import json

from tpviz.archs import arch_of
from tpviz.config.sources import load_spec
from tpviz.deploy.equivalent import PAIRED_WITHOUT_TOWER, compare
from tpviz.deploy.ranking import plan_rows
from tpviz.errors import TpvizError
from tpviz.render.text import fmt_bytes
from tpviz.rules import RULE_SETS, RULES
from tpviz.trace.validity import valid_table


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
    spec = load_spec(args.model)  # read once: valid_table takes the spec
    name, rows = valid_table(spec, args.max_tp)
    notes = {r.name: r.model_notes(spec.model_type) for r in RULE_SETS.values()}  # what an engine never runs
    # what vLLM's model files do that the verdicts alone do not show (the wrapper's and the decoder's records:
    # Step-3.7's config that vLLM 0.33.0 as released cannot read)
    types = ((spec.config or {}).get("model_type"), spec.model_type)
    notes["vllm"] += [n for n in dict.fromkeys(arch_of(str(t)).note for t in types) if n]
    if args.json:
        print(json.dumps({"schema": "tpviz.valid/1", "model": name,
                          "rules": {r: RULE_SETS[r].label for r in RULES},
                          "notes": {r: n for r, n in notes.items() if n},
                          "rows": [{"tp": row.tp, **{r: {"valid": row.valid(r), "problem": row.problems[r],
                                                            "warnings": row.warnings.get(r, [])}
                                                           for r in RULES}} for row in rows]}, indent=1))
        return 0
    print(f"{name}: valid tp sizes")
    cells = [["valid" + (" (warning below)" if row.warnings.get(r) else "") if row.valid(r)
              else row.problems[r] for r in RULES] for row in rows]
    widths = [max(len(RULE_SETS[r].label), *(len(c[i]) for c in cells)) for i, r in enumerate(RULES)]
    print(f"{'tp':>4}  " + "  ".join(f"{RULE_SETS[r].label:<{w}}" for r, w in zip(RULES, widths)).rstrip())
    for row, cell in zip(rows, cells):
        print(f"{row.tp:>4}  " + "  ".join(f"{c:<{w}}" for c, w in zip(cell, widths)).rstrip())
    print_warnings({w for row in rows for ws in row.warnings.values() for w in ws},
                   "valid --json gives each tp's")
    for r, lines in notes.items():
        for line in lines:
            print(f"note ({RULE_SETS[r].label} column): {line}")
    return 0


def side_cells(side) -> list[str]:
    """One engine's cells of a compared layout: its layout, weights per GPU, KV tokens and verdict."""
    if side is None:
        return ["—", "", "", "no such layout"]
    r = side.row
    verdict = ("fits" if r.fits else "does not fit") if r.problem is None else f"rejected: {r.problem}"
    return [r.layout.label, fmt_bytes(r.weights) if r.problem is None else "",
            f"{r.kv_tokens:,}" if r.problem is None else "", verdict]


def cmd_compare(args) -> int:
    """Every layout of --gpus GPUs in vLLM 0.33 beside the same deployment in SGLang 0.5.23."""
    spec = load_spec(args.model)
    pairs = compare(spec, args.gpus, args.gpu_mem, args.util, args.context)
    if args.json:
        side = lambda s: None if s is None else {"engine": s.rules.label, "launch": s.launch,  # noqa: E731
                                                 **plan_rows([s.row])[0]}
        print(json.dumps({"schema": "tpviz.compare/1", "model": spec.name, "gpus": args.gpus,
                          "gpu_mem_gib": args.gpu_mem, "utilization": args.util, "context": args.context,
                          "pairs": [{"vllm": side(a), "sglang": side(b)} for a, b in pairs]}, indent=1))
        return 0
    print(f"{spec.name} on {args.gpus} × {args.gpu_mem:g} GiB: vLLM 0.33 beside the same deployment in "
          "SGLang 0.5.23 (— : that engine has no such layout)")
    cells = [side_cells(a) + side_cells(b) for a, b in pairs]
    head = ["vLLM 0.33", "weights/GPU", "KV tokens", "verdict", "SGLang 0.5.23", "weights/GPU", "KV tokens",
            "verdict"]
    widths = [min(60, max(len(h), *(len(c[i]) for c in cells))) for i, h in enumerate(head)]
    for line in [head, *cells]:
        print("  ".join(f"{c[:w]:<{w}}" for c, w in zip(line, widths)).rstrip())
    if spec.tower:
        print(PAIRED_WITHOUT_TOWER)
    return 0

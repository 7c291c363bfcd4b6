"""Which layouts a model splits by: the first rule each tp size breaks, per rule set, read off the layers.

What fails while building a rank's layers comes first, then what would fail while loading them (a quantized
layer's scales); warnings name layouts an engine accepts only through a fallback.
"""
from dataclasses import dataclass, field

from tpviz.config.spec import ModelSpec
from tpviz.config.sources import load_spec  # the hub code behind it loads only when a source needs it
from tpviz.errors import QuantError, TPSizeError
from tpviz.plan import ParamPlan, build_plan
from tpviz.plan.quantized import DESC_ACT
from tpviz.rules import RULE_SETS, Layout, RuleSet, Widths, check_tp, ruleset
from tpviz.trace.probe import build_rank, probing, where
from tpviz.trace.shardmap import FAMILIES


def _check_order(plan: ParamPlan) -> int:
    return FAMILIES.index(plan.family) if plan.family in FAMILIES else len(FAMILIES)


@probing()
def split_error(spec: ModelSpec, tp_size: int, rules: RuleSet | str = "vllm",
                plans: list[ParamPlan] | None = None, moe_tp: int | None = None,
                widths: Widths | None = None,
                layout: Layout | None = None) -> tuple[TPSizeError | None, list[str]]:
    """(the first failing rule as the error the layers raised, or None; warnings). moe_tp: how many ways the
    routed experts are cut when it differs from tp (tp x dp, or 1 with expert parallelism); widths: how many
    ways each role is cut in a layout (RuleSet.widths), for every role."""
    rules = ruleset(rules)
    later, warnings, fallbacks = [], rules.tp_warnings(tp_size), {}  # fallback text -> the layers it names
    q = spec.quant
    if q is not None and q.desc_act and q.group > 0 and rules.refuses_desc_act:
        return QuantError(DESC_ACT), []
    try:
        check_tp(tp_size)
        if layout is not None or widths is None:  # a map: what the engine refuses about its layout, then
            layout = layout or Layout(tp_size)
            if problem := rules.layout_problem(layout, spec):
                raise TPSizeError(problem, tp=tp_size)
            warnings += rules.layout_notes(layout, spec)
            if layout.carved or widths is None and moe_tp is None:
                widths = rules.widths(layout, spec.arch)
        for plan in sorted(build_plan(spec, rules) if plans is None else plans, key=_check_order):
            cut = (widths.of(plan.role) if widths else
                   moe_tp if moe_tp and plan.family == "experts" else tp_size)
            how = rules.cut_note(plan.role, cut, tp_size)
            try:
                module, _ = build_rank(plan, cut, 0)
            except TPSizeError as e:
                hint = (rules.notes.get("ep_hint", "") if plan.family == "experts"
                        and isinstance(e, QuantError) else "")
                # the type and fields stay; the user typed tp and dp, not `cut`
                e.args = (how + str(e) + hint,)
                raise
            if getattr(module, "problem", None):
                later.append(TPSizeError(f"{how}{where(plan)}: {module.problem}", tp=tp_size))
            if getattr(module, "warning", None):
                fallbacks.setdefault(module.warning, []).append(where(plan))
        if layout is not None and (problem := rules.load_problem(layout, spec)):
            # after every layer's own load-time checks
            later.append(QuantError(f"after loading: {problem}", tp=tp_size))
    except TPSizeError as e:
        return e, list(dict.fromkeys(warnings + merged(fallbacks)))
    return (later[0] if later else None), list(dict.fromkeys(warnings + merged(fallbacks)))


def merged(fallbacks: dict[str, list[str]]) -> list[str]:
    """One warning per fallback, naming every layer that takes it ('...experts.0.gate_proj and down_proj')."""
    out = []
    for text, places in fallbacks.items():
        places = list(dict.fromkeys(places))
        head = places[0].rsplit(".", 1)[0] + "."
        names = [places[0]] + [p.removeprefix(head) for p in places[1:]]
        out.append(f"{' and '.join(names)}: {text}")
    return out


def split_problem(spec: ModelSpec, tp_size: int, rules: RuleSet | str = "vllm",
                    plans: list[ParamPlan] | None = None, moe_tp: int | None = None,
                  widths: Widths | None = None, layout: Layout | None = None) -> tuple[str | None, list[str]]:
    """split_error's first failing rule as one line (None when the model splits), and its warnings."""
    error, warnings = split_error(spec, tp_size, rules, plans, moe_tp, widths, layout)
    return (str(error) if error else None), warnings


@dataclass(frozen=True)
class ValidRow:
    """One tp size: per rule set, the first rule it breaks (None: valid) and the fallbacks a valid one
    needs."""
    tp: int
    problems: dict[str, str | None]
    warnings: dict[str, list[str]] = field(default_factory=dict)

    def valid(self, rules: RuleSet | str) -> bool:
        return self.problem(rules) is None

    def problem(self, rules: RuleSet | str) -> str | None:
        return self.problems[ruleset(rules).name]


def valid_table(source, max_tp: int = 64) -> tuple[str, list[ValidRow]]:
    """(model name, a row per tp in 1..max_tp); a warning marks a layout an engine accepts only through a
    fallback."""
    spec = load_spec(source)
    plans = {name: build_plan(spec, rules) for name, rules in RULE_SETS.items()}
    rows = []
    for tp in range(1, max_tp + 1):
        checks = {name: split_problem(spec, tp, rules, plans[name]) for name, rules in RULE_SETS.items()}
        rows.append(ValidRow(tp, {r: c[0] for r, c in checks.items()},
                             {r: c[1] for r, c in checks.items() if c[1] and c[0] is None}))
    return spec.name, rows

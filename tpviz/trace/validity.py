"""The valid-tp table every view shows: per tp size and rule set, the first rule that fails."""
from dataclasses import dataclass, field

from tpviz.rules import RULES


@dataclass(frozen=True)
class ValidRow:
    """One tp size: per rule set, the first rule it breaks (None: valid) and the fallbacks a valid one needs."""
    tp: int
    problems: dict[str, str | None]
    warnings: dict[str, list[str]] = field(default_factory=dict)

    def valid(self, rules: str) -> bool:
        return self.problems[rules] is None


def valid_table(source, max_tp: int = 64) -> tuple[str, list[ValidRow]]:
    """(model name, a row per tp in 1..max_tp); a warning marks a layout an engine accepts only through a
    fallback."""
    from tpviz.plan import build_plan
    from tpviz.config.sources import load_spec
    from tpviz.trace.tracer import check_layout
    spec = load_spec(source)
    plans = {rules: build_plan(spec, rules) for rules in RULES}
    rows = []
    for tp in range(1, max_tp + 1):
        checks = {rules: check_layout(spec, tp, rules, plans[rules]) for rules in RULES}
        rows.append(ValidRow(tp, {r: c[0] for r, c in checks.items()},
                             {r: c[1] for r, c in checks.items() if c[1] and c[0] is None}))
    return spec.name, rows

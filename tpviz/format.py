"""Small shared helpers of the views: human-readable bytes, and the valid-tp table every view shows."""
from dataclasses import dataclass, field

from tpviz.rules import RULES


def fmt_bytes(n: float) -> str:
    """Human-readable bytes (GiB, MiB, KiB)."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{int(n)} B"


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
    from tpviz.sources import load_spec
    from tpviz.tracer import check_layout
    spec = load_spec(source)
    plans = {rules: build_plan(spec, rules) for rules in RULES}
    rows = []
    for tp in range(1, max_tp + 1):
        checks = {rules: check_layout(spec, tp, rules, plans[rules]) for rules in RULES}
        rows.append(ValidRow(tp, {r: c[0] for r, c in checks.items()},
                             {r: c[1] for r, c in checks.items() if c[1] and c[0] is None}))
    return spec.name, rows

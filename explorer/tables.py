"""The explorer's tables: the library's numbers and verdicts as display rows (readable units, ✓ / ✗)."""
from tpviz.render.text import fmt_bytes
from tpviz.trace.validity import ValidRow
from tpviz.rules import RULE_SETS
from tpviz.trace.shardmap import ShardMap
from tpviz.trace.collectives import collectives


def collective_rows(m: ShardMap) -> list[dict]:
    """collectives() as display rows (sizes per token, human-readable)."""
    return [{"collective": c.op, "where": c.where, "per forward": c.count,
             "size / token": fmt_bytes(c.bytes_per_token), "sent per GPU / token": fmt_bytes(c.sent_per_rank),
             "per forward / token": fmt_bytes(c.total_per_token)}
            for c in collectives(m)]


def valid_tp_rows(rows: list[ValidRow]) -> list[dict]:
    """valid_table rows as display rows: '✓' for a valid size, else the first failing rule."""
    return [{"tp": row.tp, **{r.label: ("✓ " + "; ".join(row.warnings.get(name, []))).strip()
                              if row.valid(r) else "✗ " + row.problem(r) for name, r in RULE_SETS.items()}}
            for row in rows]

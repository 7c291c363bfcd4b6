"""Pipeline stages and expert placement flags over a Layout (tpviz.rules.layout); what each engine does with
the shape (the layer partition, the expert placement, how many ways each weight is cut) is its rule set's.
"""
from tpviz.errors import LayoutError
from tpviz.rules import RuleSet

EP_DENSE = "expert parallelism needs a MoE model; this one has no routed experts"


def stage_layers(num_layers: int, pp: int, rules: RuleSet, override: str | None = None) -> list[list[int]]:
    """The decoder layers of each pipeline stage, as the rule set partitions them."""
    parts, start, out = rules.pp_partition(num_layers, pp, override), 0, []
    for n in parts:
        out.append(list(range(start, start + n)))
        start += n
    return out


def placement_flag(placement: str | None, ep: bool) -> str:
    """A command line's --placement: it places whole experts, so only with --ep; linear when not given."""
    if placement is not None and not ep:
        raise LayoutError("--placement places whole experts under --ep: add --ep, or drop --placement")
    return placement or "linear"

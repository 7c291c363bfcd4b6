"""The rule sets: one RuleSet per engine version (engines.py), looked up by the name users pass."""
from tpviz.errors import TpvizError
from tpviz.rules.engines import NANO_VLLM, VLLM_0_28, VLLM_0_33
from tpviz.rules.layout import Layout
from tpviz.rules.ruleset import MAX_TP, Flags, RuleSet, Widths, check_tp, divide
from tpviz.rules.sglang import SGLANG_0_5_23
from tpviz.rules.sglang_files import Groups

RULE_SETS = {r.name: r for r in (VLLM_0_33, VLLM_0_28, SGLANG_0_5_23, NANO_VLLM)}
RULES = tuple(RULE_SETS)  # the names, in the order the views list them
DEFAULT = VLLM_0_33
BOTH = "vllm+sglang"  # one ranking of both engines' layouts (plan, the Plan page), each row naming its engine


def engines_of(rules: str) -> tuple[str, ...]:
    """The rule-set names a ranking choice stands for: BOTH, or one rule set."""
    return (VLLM_0_33.name, SGLANG_0_5_23.name) if rules == BOTH else (rules,)


def ruleset(rules: "str | RuleSet" = "vllm") -> RuleSet:
    """The rule set a name (or a RuleSet) stands for, or one line naming the ones there are."""
    if isinstance(rules, RuleSet):
        return rules
    if isinstance(rules, str) and rules in RULE_SETS:
        return RULE_SETS[rules]
    raise TpvizError(f"unknown rules {rules!r}; use one of: {', '.join(RULES)}")


__all__ = ["RuleSet", "Groups", "Layout", "Widths", "Flags", "RULE_SETS", "RULES", "DEFAULT", "BOTH",
           "MAX_TP", "ruleset", "engines_of", "check_tp", "divide"]

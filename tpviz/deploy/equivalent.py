"""The same deployment in the other engine: vLLM's layout spelled in SGLang's flags and back, accepted only
when both engines put the same bytes and KV cache on every GPU (deployed, not assumed); else the reason in one
line.

vLLM runs attention DP as --data-parallel-size with the experts over tp x dp; SGLang carves attention DP and
EP out of --tp. So vLLM's `--tp T --dp D` of a MoE model is SGLang's `--tp T*D --attn-dp-size D` (its experts
cut, or with EP whole, over all T*D GPUs), when the model file cuts attention over the attention group and the
dense MLPs, shared experts and lm_head can follow (--moe-dense-tp-size 1, SGLANG_SHARED_EXPERT_TP1,
--enable-dp-lm-head).
"""
from dataclasses import dataclass

from tpviz.config.spec import ModelSpec
from tpviz.deploy.deployment import deploy
from tpviz.deploy.fit import capped_context
from tpviz.deploy.ranking import rank_layouts, ranked
from tpviz.deploy.sizing import LayoutRow, Sizer
from tpviz.errors import TpvizError
from tpviz.rules import Layout, RuleSet, ruleset
from tpviz.trace.shardmap import Deployment

OTHER = {"vllm": "sglang", "vllm-0.28": "sglang", "sglang": "vllm"}
# SGLang's map leaves a vision tower out (plan/tower.py): the engines are compared on the rest
VISION_CAVEAT = "checked GPU by GPU without the vision tower, which tpviz does not model under SGLang rules"
PAIRED_WITHOUT_TOWER = f"pairs are {VISION_CAVEAT}; vLLM's weights per GPU count their slice of it"


def comparing(spec: ModelSpec, sizers: dict | None) -> dict:
    """The sizers two engines are compared with, by rule-set name: without the vision tower where there is
    one (a caller's sizers of the whole model are then set aside)."""
    return {name: s for name, s in (sizers or {}).items() if s.vision == (spec.tower is None)}


def sizer_of(spec: ModelSpec, rules: RuleSet, sizers: dict) -> Sizer:
    return sizers.get(rules.name) or Sizer(spec, rules, vision=spec.tower is None)


@dataclass
class Equivalent:
    """A layout in another engine: its launch line, or why there is none."""
    rules: RuleSet
    layout: Layout | None
    launch: str = ""
    why: str = ""  # no equivalent: the reason
    caveat: str = ""  # what the check left out

    @property
    def line(self) -> str:
        head = f"the same deployment in {self.rules.label}"
        if not self.layout:
            return f"no {self.rules.label} equivalent: {self.why}"
        return f"{head}: {self.launch}" + (f" ({self.caveat})" if self.caveat else "")


def spelled(spec: ModelSpec, layout: Layout, rules: RuleSet) -> tuple[Layout | None, str]:
    """The layout the other engine's flags would give, or why its flags cannot say it."""
    if not rules.carves:  # vLLM -> SGLang
        if not spec.is_moe or layout.dp == 1:
            return Layout(layout.tp, layout.pp, layout.dp, ep_size=layout.tp if layout.ep else 1), ""
        tp, dp = layout.tp * layout.dp, layout.dp
        whole = layout.tp == 1  # each replica is one GPU: its dense MLPs and shared experts are whole
        return Layout(tp, layout.pp, 1, attn_dp=dp, ep_size=tp if layout.ep else 1, dense_tp1=whole,
                      dp_lm_head=True, shared_tp1=whole), ""
    if 1 < layout.ep_size < layout.tp:
        return (None,
                (f"--ep {layout.ep_size} below --tp {layout.tp} cuts each expert "
                 f"{layout.tp // layout.ep_size} "
                "ways inside its group: vLLM's experts are either cut over all tp × dp GPUs or whole"))
    if spec.is_moe and layout.dp > 1:
        return (None,
                ("SGLang's --dp-size replicas hold every expert each; vLLM spreads a MoE model's experts "
                "over all tp × dp GPUs"))
    a = layout.attn_dp
    if layout.tp % a:
        return None, f"--attn-dp-size {a} does not divide --tp {layout.tp}"
    return Layout(layout.tp // a, layout.pp, layout.dp * a,
                  ep=layout.ep_size > 1 and layout.ep_size == layout.tp), ""


def same_gpus(a: Deployment, b: Deployment, other: RuleSet) -> str:
    """'' when every GPU holds the same bytes, experts and KV cache per token in both; else what differs."""
    if a.stages != b.stages:
        mine = ",".join(str(s[1] - s[0]) for s in a.stages)
        return (f"the pipeline stages differ ({mine} layers against "
                f"{','.join(str(s[1] - s[0]) for s in b.stages)}): {other.pp_env}={mine} "
                "gives the same stages")
    if [g.kv_cache_bytes_per_token for g in a.gpus] != [g.kv_cache_bytes_per_token for g in b.gpus]:
        return "the KV cache per GPU differs (the attention heads are cut another way)"
    if [g.weight_bytes for g in a.gpus] != [g.weight_bytes for g in b.gpus]:
        stages = sorted({g.pp for g, h in zip(a.gpus, b.gpus) if g.weight_bytes != h.weight_bytes})
        if len(stages) < len(a.stages):  # a table one engine builds on more stages (GLM's lm_head)
            which = ", ".join(map(str, stages))
            return f"the weights per GPU differ on pipeline stage {which} alone (a table on more stages)"
        return "the weights per GPU differ (a weight is cut over another group)"
    if [g.experts for g in a.gpus] != [g.experts for g in b.gpus]:
        return "the experts sit on other GPUs (SGLang places them in contiguous blocks)"
    return ""


def equivalent(spec: ModelSpec, layout: Layout, rules: RuleSet | str, placement: str = "linear",
               sizers: dict | None = None) -> Equivalent:
    """The same deployment in the other engine, checked GPU by GPU (sizers: each engine's Sizer of this spec,
    by rule-set name, when a caller has them)."""
    rules = ruleset(rules)
    other = ruleset(OTHER.get(rules.name, "vllm"))
    sizers = comparing(spec, sizers)
    if rules.tp_only or other.name == rules.name:
        return Equivalent(other, None, why=f"{rules.label} is compared with vLLM and SGLang only")
    # the layout itself must exist; its refusal is the caller's
    mine = deploy(spec, layout, rules, placement, sizer_of(spec, rules, sizers))
    theirs, why = spelled(spec, layout, rules)
    if theirs is None:
        return Equivalent(other, None, why=why)
    try:
        d = deploy(spec, theirs, other, sizer=sizer_of(spec, other, sizers))
    except TpvizError as e:
        return Equivalent(other, None, why=f"{other.launch(spec.name, theirs)} is refused: {e}")
    if why := same_gpus(mine, d, other):
        hint = f" ({other.launch(spec.name, theirs)} comes closest)" if theirs != layout else ""
        return Equivalent(other, None, why=why + hint)
    return Equivalent(other, theirs, other.launch(spec.name, theirs),
                      caveat=VISION_CAVEAT if spec.tower else "")


@dataclass
class Side:
    """One engine's row of a compared layout."""
    rules: RuleSet
    row: LayoutRow
    launch: str


def compare(spec: ModelSpec, gpus: int, gpu_gib: float, utilization: float = 0.9,
            context: int = 8192) -> list[tuple[Side | None, Side | None]]:
    """Every layout of `gpus` GPUs in vLLM 0.33 beside the same deployment in SGLang 0.5.23 (None where that
    engine has no such layout), then SGLang's own layouts vLLM cannot spell; the ranking is plan's, per
    pair by the better side."""
    vllm, sglang = ruleset("vllm"), ruleset("sglang")
    sizers = {r.name: Sizer(spec, r) for r in (vllm, sglang)}  # each engine's plan, built once
    rows = {r.name: {row.layout: row for row in rank_layouts(spec, gpus, gpu_gib, r, utilization, context,
                                                             sizer=sizers[r.name])} for r in (vllm, sglang)}
    sizer, seen, pairs = sizers["sglang"], set(), []
    usable = capped_context(spec, context)[0]
    # a vision tower (which SGLang's map leaves out) is set aside on vLLM's side too when pairing
    bare = {r.name: Sizer(spec, r, vision=False) for r in (vllm, sglang)} if spec.tower else sizers
    for layout, row in rows["vllm"].items():
        theirs = spelled(spec, layout, vllm)[0] if row.problem is None else None
        other = None
        if theirs is not None:
            found = rows["sglang"].get(theirs) or sizer.row(theirs, gpu_gib * 2**30, utilization, usable)
            mine = bare["vllm"].row(layout, gpu_gib * 2**30, utilization, usable) if spec.tower else row
            # the fullest GPUs first (cheap), then every GPU deployed in both engines
            same = found.problem is None and (found.stage_weights, found.kv_per_token) == (
                mine.stage_weights, mine.kv_per_token)
            if same and equivalent(spec, layout, vllm, sizers=bare).layout == theirs:
                other = Side(sglang, found, sglang.launch(spec.name, theirs))
                seen.add(theirs)
        pairs.append((Side(vllm, row, vllm.launch(spec.name, layout)), other))
    pairs += [(None, Side(sglang, row, sglang.launch(spec.name, layout)))
              for layout, row in rows["sglang"].items() if layout not in seen]
    return sorted(pairs, key=lambda pair: min(ranked(side.row) for side in pair if side is not None))

"""The tracer traces a tensor every rank loads whole once and spreads it (trace/tracer.py): held here by
tracing each such plan on every rank, for every preset, rule set and quantization scheme, and finding every
rank loaded what rank 0 did: the same source runs at the same places, the same local shape and no padding of
its own."""
import pytest

from tpviz.config.sources import load_spec, presets
from tpviz.errors import TpvizError
from tpviz.plan import build_plan
from tpviz.rules import RULES, ruleset
from tpviz.trace.tracer import trace, trace_plan
from tpviz.trace.validity import split_error
from tests.helpers.quant import AWQ, BLOCK, CT, GPTQ, NVFP4, llama

SCHEMES = {"fp8-static": {"quant_method": "fp8", "activation_scheme": "static"}, "fp8-block": BLOCK,
           "gptq-act-order": {**GPTQ, "desc_act": True}, "awq": AWQ, "compressed-tensors": CT,
           "nvfp4": NVFP4, "modelopt-fp8": {"quant_method": "modelopt", "quant_algo": "FP8"}}
WHOLE_SCALES = {"fp8-static", "compressed-tensors", "nvfp4", "modelopt-fp8"}  # per-tensor scales, shapes


def whole_plans(source, rules) -> tuple[int, list]:
    """The largest tp of 4 and 2 the rule set maps the model at, and its plans the tracer loads whole; (0, [])
    where the rule set refuses the model."""
    try:
        spec, r = load_spec(source), ruleset(rules)
        plans = build_plan(spec, r)
    except TpvizError:
        return 0, []
    tp = next((tp for tp in (4, 2) if not split_error(spec, tp, r, plans)[0]), 0)
    return tp, [p for p in plans if not p.split] if tp else []


def rank_runs(plan, tp: int) -> list:
    """Per rank: each source's loaded runs (start, stop, where), its local shape and padding."""
    tensors, param = trace_plan(plan, tp)
    return [([sorted((p.start, p.stop, p.param_start) for p in t.pieces if p.rank == r) for t in tensors],
             param.local_shapes[r], param.padding[r]) for r in range(tp)]


def check(plan, tp: int) -> None:
    """A whole tensor loads alike on every rank, or its plan says it does not (by_rank): then it must not."""
    runs = rank_runs(plan, tp)
    assert all(runs[0][0]), f"{plan.name}: rank 0 loaded nothing"
    assert (runs != [runs[0]] * tp) == plan.by_rank, f"{plan.name}: by_rank={plan.by_rank}, ranks {runs}"


@pytest.mark.parametrize("rules", RULES)
def test_every_preset_loads_its_whole_tensors_alike_on_every_rank(rules):
    checked, by_rank = 0, 0
    for name in presets():
        tp, plans = whole_plans(name, rules)
        for plan in plans:
            check(plan, tp)
            checked, by_rank = checked + 1, by_rank + plan.by_rank
    # gpt-oss-20b's and 120b's MXFP4 down bias (SGLang's gpt_oss is not modelled: refused)
    assert checked > 200 and by_rank == (0 if rules == "sglang" else 2)


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("rules", RULES)
def test_every_quantization_loads_its_whole_tensors_alike_on_every_rank(scheme, rules):
    tp, plans = whole_plans(llama(SCHEMES[scheme]), rules)
    if not tp:  # a scheme this rule set refuses (nano-vllm, or SGLang's act-order GPTQ): nothing drawn
        pytest.skip(f"{rules} refuses {scheme}")
    assert scheme not in WHOLE_SCALES or any(p.element_bytes for p in plans)
    for plan in plans:
        check(plan, tp)


def test_a_spread_map_equals_the_map_traced_on_every_rank(monkeypatch):
    """Kimi-K2.5 (INT4 experts with int64 weight_shape, a float32 router bias) and gpt-oss (a down bias GPU 0
    alone loads): the map with whole tensors traced once equals the map with every one traced on each rank."""
    import tpviz.trace.tracer as tracer
    for name in ("moonshotai/Kimi-K2.5", "openai/gpt-oss-20b"):
        spec = load_spec(name)
        fast = trace(spec, 8)
        real = tracer.trace_plan
        monkeypatch.setattr(tracer, "trace_plan",
                            lambda plan, width: real(plan, 8 if not plan.split else width))
        assert trace(spec, 8).to_dict() == fast.to_dict(), name
        monkeypatch.setattr(tracer, "trace_plan", real)

"""One deployment's map: which layers, which experts and how many bytes each GPU of a tp x pp x dp (+ EP)
layout holds, with vLLM's rank order (distributed/parallel_state.py: rank = (dp * pp + stage) * tp + tp_rank;
an EP group is the dp x tp GPUs of one stage). The rows and columns each GPU holds of every tensor are the
tensor-parallel map at the layout's widths (tp, and tp x dp for experts without EP)."""
from tpviz.config.spec import ModelSpec
from tpviz.deploy.parallel import EP_DENSE, stage_layers
from tpviz.deploy.sizing import Sizer
from tpviz.deploy.traffic import comm_per_token
from tpviz.errors import DenseEPError, LayoutError, TPSizeError
from tpviz.rules import Layout, RuleSet, ruleset
from tpviz.trace.probe import probing
from tpviz.trace.shardmap import Deployment, Gpu
from tpviz.trace.validity import split_problem

MAX_GPUS = 1024


def check_layout(layout: Layout, spec: ModelSpec, rules: RuleSet) -> None:
    """One line when the layout cannot exist for this model and engine."""
    if layout.ep and not spec.is_moe:
        raise DenseEPError(EP_DENSE)
    for name, value in (("tp", layout.tp), ("pp", layout.pp), ("dp", layout.dp)):
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_GPUS:
            raise LayoutError(f"{name}={value!r} must be an integer from 1 to {MAX_GPUS}")
    if layout.gpus > MAX_GPUS:
        raise LayoutError(f"tp × pp × dp = {layout.gpus} GPUs; tpviz maps deployments of up to {MAX_GPUS}")
    if problem := rules.layout_problem(layout, spec):
        raise LayoutError(problem)


@probing()
def deploy(spec: ModelSpec, layout: Layout, rules: RuleSet | str = "vllm",
           placement: str = "linear", sizer: Sizer | None = None) -> Deployment:
    """Every GPU of the layout: coordinates, layers, experts, weight bytes, KV bytes per token; and the
    communication per token. Raises one line when the layout cannot exist or a rule refuses it."""
    rules = ruleset(rules)
    check_layout(layout, spec, rules)
    stages = stage_layers(spec.num_hidden_layers, layout.pp, rules)
    sizer = sizer or Sizer(spec, rules)  # a caller deploying many layouts of one model builds its plan once
    w = sizer.widths(layout)
    problem, warnings = split_problem(spec, layout.tp, rules, sizer.plans, widths=w, layout=layout)
    if problem:
        raise TPSizeError(problem)
    kv = sizer.kv_per_layer(w.attention)
    experts = rules.expert_placement(spec.num_experts, w.ep, placement) if layout.ep or w.ep > 1 else None
    gpus = []
    for dp_i in range(layout.dp):
        for stage, layers in enumerate(stages):
            for tp_i in range(layout.tp):
                flat = dp_i * layout.tp + tp_i
                mine = experts[w.ep_rank(flat)] if experts else None
                gpus.append(Gpu(
                    (dp_i * layout.pp + stage) * layout.tp + tp_i, stage, dp_i, tp_i,
                    [layers[0], layers[-1] + 1] if layers else [0, 0], mine,
                    sizer.gpu_bytes(layout, set(layers), stage == 0, stage == len(stages) - 1, flat, mine),
                    sum(kv.get(i, (0, 0))[0] for i in layers if not kv.get(i, (0, 0))[1]),
                    sum(kv[i][0] for i in layers if i in kv and kv[i][1])))
    return Deployment(layout, placement if experts else None,
                      [[s[0], s[-1] + 1] if s else [0, 0] for s in stages],
                      experts, sorted(gpus, key=lambda g: g.rank), warnings,
                      comm_per_token(spec, layout, rules) or {})

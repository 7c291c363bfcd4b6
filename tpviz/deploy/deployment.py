"""One layout's map: which layers, which experts and how many bytes each GPU of a tp x pp x dp (+ EP)
deployment holds, with vLLM's rank order (distributed/parallel_state.py: rank = (dp * pp + stage) * tp + tp_rank;
an EP group is the dp x tp GPUs of one stage). The rows and columns each GPU holds of every tensor are the
tensor-parallel map at tp (and at tp x dp for experts without EP)."""
from tpviz.errors import TPSizeError
from tpviz.deploy.parallel import EP_DENSE, DenseEPError, Layout, LayoutError, engine_problem, expert_placement, stage_layers
from tpviz.deploy.planner import FIRST_STAGE, Planner, comm_per_token
from tpviz.config.spec import ModelSpec
from tpviz.trace.tracer import check_layout, single_thread


def _gpu_bytes(p: Planner, layout: Layout, layers: set[int], first: bool, last: bool, tp_i: int, moe_i: int,
               experts: list[int] | None) -> int:
    """Bytes one GPU holds: its stage's layers at its tp rank, its experts (whole, or its moe rank's slice)."""
    total = 0
    for plan in p.plans:
        if plan.layers is None:
            held = (plan.family in FIRST_STAGE and first) or (plan.family not in FIRST_STAGE and last) or (
                plan.family == "embed" and last and p.spec.tie_word_embeddings)
            total += p._bytes(plan, layout.tp)[tp_i] if held else 0
            continue
        count = len(layers & set(plan.layers))
        if not count:
            continue
        if plan.family == "experts" and experts is not None:
            total += p._bytes(plan, 1)[0] // max(plan.experts, 1) * len(experts) * count
        elif plan.family == "experts":
            total += p._bytes(plan, layout.moe_tp)[moe_i] * count
        else:
            total += p._bytes(plan, layout.tp)[tp_i] * count
    return total


@single_thread()
def layout_map(spec: ModelSpec, layout: Layout, rules: str = "vllm", placement: str = "linear") -> dict:
    """Every GPU of the layout: coordinates, layers, experts, weight bytes, KV bytes per token; and the
    communication per token. Raises one line when the layout cannot exist or a rule refuses it."""
    if layout.ep and not spec.is_moe:
        raise DenseEPError(EP_DENSE)
    for name, value in (("tp", layout.tp), ("pp", layout.pp), ("dp", layout.dp)):
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 1024:
            raise LayoutError(f"{name}={value!r} must be an integer from 1 to 1024")
    if layout.gpus > 1024:
        raise LayoutError(f"tp × pp × dp = {layout.gpus} GPUs; tpviz maps deployments of up to 1024")
    if problem := engine_problem(layout, rules):
        raise LayoutError(problem)
    stages = stage_layers(spec.num_hidden_layers, layout.pp)
    p = Planner(spec, rules)
    problem, warnings = check_layout(spec, layout.tp, rules, p.plans, moe_tp=layout.moe_tp)
    if problem:
        raise TPSizeError(problem)
    kv = p._kv_per_layer(layout.tp, 0)
    experts = expert_placement(spec.num_experts, layout.ep_size, placement) if layout.ep else None
    gpus = []
    for dp_i in range(layout.dp):
        for stage, layers in enumerate(stages):
            for tp_i in range(layout.tp):
                ep_rank = dp_i * layout.tp + tp_i  # also the flattened MoE tp rank without EP
                mine = experts[ep_rank] if experts else None
                gpus.append({
                    "rank": (dp_i * layout.pp + stage) * layout.tp + tp_i, "pp": stage, "dp": dp_i, "tp": tp_i,
                    "layers": [layers[0], layers[-1] + 1] if layers else [0, 0], "experts": mine,
                    "weight_bytes": _gpu_bytes(p, layout, set(layers), stage == 0, stage == len(stages) - 1, tp_i,
                                               ep_rank, mine),
                    "kv_cache_bytes_per_token": sum(kv.get(i, (0, 0))[0] for i in layers if not kv.get(i, (0, 0))[1]),
                    # windowed layers cache each token only up to their window
                    "kv_windowed_bytes_per_token": sum(kv[i][0] for i in layers if i in kv and kv[i][1])})
    comm = comm_per_token(spec, layout, rules)
    return {"tp": layout.tp, "pp": layout.pp, "dp": layout.dp, "ep": layout.ep, "label": layout.label,
            "placement": placement if layout.ep else None, "stages": [[s[0], s[-1] + 1] if s else [0, 0] for s in stages],
            "expert_placement": experts, "gpus": sorted(gpus, key=lambda g: g["rank"]), "warnings": warnings,
            "comm_bytes_per_token": comm}

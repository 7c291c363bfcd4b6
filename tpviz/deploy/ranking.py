"""Every tp x pp x dp (+ expert parallelism) layout of N GPUs that the engine would accept for a checkpoint,
ranked by what fits and how much KV cache each leaves (the `plan` command and the Plan page)."""
from tpviz.config.spec import ModelSpec
from tpviz.deploy.fit import capped_context, check_fit_inputs, sizing_notes
from tpviz.deploy.hardware import Topology
from tpviz.deploy.perf import Speed, Workload, WorkloadError
from tpviz.deploy.sizing import LayoutRow, Sizer
from tpviz.errors import LayoutError
from tpviz.rules import Layout, RuleSet, ruleset


def rank_layouts(spec: ModelSpec, gpus: int, gpu_gib: float, rules: RuleSet | str = "vllm",
                 utilization: float = 0.9, context: int = 8192, ep: bool = True,
                 sizer: Sizer | None = None, topology: Topology | None = None,
                 workload: Workload | None = None) -> list[LayoutRow]:
    """Every layout of `gpus` GPUs, accepted ones first (fitting, then by KV room), rejected ones with their
    rule (an engine that runs tensor parallelism alone: TP `gpus` only, which plan_notes says). With a
    topology and a workload each fitting row gets its speed bound (row.perf) and they rank by the
    workload's goal; the workload's context (prompt + output) sizes the KV room."""
    rules = ruleset(rules)
    if gpus < 1 or gpus > 1024:
        raise LayoutError(f"gpus={gpus} must be between 1 and 1024")
    if workload is not None:
        context = workload.context
        if spec.max_model_len and context > spec.max_model_len:  # the engine refuses such a request
            raise WorkloadError(f"{workload.input_len:,} input + {workload.output_len:,} output tokens is "
                                f"past this model's max_model_len {spec.max_model_len:,}: ask for fewer")
    check_fit_inputs(gpu_gib, utilization, context)
    context = capped_context(spec, context)[0]  # plan_notes says so
    sizer = sizer or Sizer(spec, rules)
    candidates = [Layout(gpus)] if rules.tp_only else rules.candidates(gpus, ep and spec.is_moe)
    rows = [sizer.row(layout, gpu_gib * 2**30, utilization, context) for layout in candidates]
    if topology is None or workload is None:
        return sorted(rows, key=ranked)
    speed = Speed(sizer, topology, workload)
    for r in rows:
        r.perf = speed.perf(r)
    return sorted(rows, key=lambda r: by_speed(r, workload.goal))


def rank_engines(spec: ModelSpec, gpus: int, gpu_gib: float, engines: tuple = ("vllm", "sglang"),
                 utilization: float = 0.9, context: int = 8192, topology: Topology | None = None,
                 workload: Workload | None = None,
                 sizers: dict | None = None) -> list[tuple[RuleSet, LayoutRow]]:
    """rank_layouts of several engines in one ranking, each row with the rule set it runs under (sizers: a
    Sizer per engine name, reused across questions)."""
    rows = [(ruleset(r), row) for r in engines
            for row in rank_layouts(spec, gpus, gpu_gib, r, utilization, context, topology=topology,
                                    workload=workload, sizer=(sizers or {}).get(r))]
    if topology is None or workload is None:
        return sorted(rows, key=lambda pair: ranked(pair[1]))
    return sorted(rows, key=lambda pair: by_speed(pair[1], workload.goal))


def ranked(r: LayoutRow) -> tuple:
    """plan's order: accepted first; among them what fits, then the most sequences the whole deployment holds,
    then the most KV tokens, then less traffic (unmodelled traffic last)."""
    return (r.problem is not None, not r.fits, -r.max_sequences, -r.kv_tokens,
            float("inf") if r.comm_per_token is None else r.comm_per_token)


def by_speed(r: LayoutRow, goal: str) -> tuple:
    """The speed order: accepted and fitting first, then those with a bound within the workload's limits,
    then the most output tokens/s per GPU (throughput) or the lowest TPOT (latency); then plan's order."""
    p = r.perf
    if p is None:
        return (r.problem is not None, not r.fits, True, True, 0.0, *ranked(r))
    speed = -p.out_tok_s_per_gpu if goal == "throughput" else p.tpot_ms
    return (False, False, False, not p.meets, speed, *ranked(r))


def plan_notes(spec: ModelSpec, rules: RuleSet | str, any_fits: bool, context: int = 0) -> list[str]:
    """What the plan leaves out: layouts its engine never runs, what the engine never runs of this model, a
    context capped at its max_model_len, and (when a layout fits) how its sequence counts run high."""
    rules = ruleset(rules)
    capped = capped_context(spec, context)[1]
    return (([rules.notes["plan"]] if rules.tp_only else []) + rules.model_notes(spec.model_type)
            + ([capped] if capped else []) + (sizing_notes(spec, rules) if any_fits else []))


def plan_rows(rows: list[LayoutRow], speed: bool = False) -> list[dict]:
    """Display rows: the layout, its verdict, and per-GPU numbers (bytes; views format them); with speed,
    each row's bound (perf, None where a layout does not fit or its traffic is not modelled)."""
    return [{"layout": r.layout.label, "tp": r.layout.tp, "pp": r.layout.pp,
             "dp": r.layout.dp, "ep": r.layout.ep, **r.layout.carved,
             "valid": r.problem is None, "fits": r.fits, "problem": r.problem, "warnings": r.warnings,
             "weights_per_gpu": r.weights, "stage_weights": r.stage_weights, "kv_per_token": r.kv_per_token,
             "kv_tokens": r.kv_tokens, "max_sequences": r.max_sequences, "comm_per_token": r.comm_per_token,
             **({"perf": r.perf.to_dict() if r.perf else None} if speed else {})}
            for r in rows]

"""The planner: every tp x pp x dp (+ expert parallelism) layout of N GPUs that vLLM would accept for a
checkpoint, with what each GPU holds and how much KV cache it leaves.

Per-GPU bytes are read off traced maps, not estimated: the non-expert layers traced at tp, the routed
experts at tp x dp (or whole, one expert at a time, under expert parallelism), summed over each pipeline
stage's layers; the embedding sits on the first stage, the final norm and lm_head on the last.
"""
from dataclasses import dataclass, field

from tpviz.deploy.fit import capped_context, check_fit_inputs, sizing_notes
from tpviz.deploy.parallel import (EP_DENSE, NANO_PLAN, Layout, LayoutError, engine_problem, expert_placement,
                            stage_layers, tp_only)
from tpviz.plan import build_plan
from tpviz.trace.shardmap import _numel
from tpviz.rules import engine_notes, padded_vocab
from tpviz.config.spec import ModelSpec
from tpviz.render.summary import logits_collective, norm_collectives
from tpviz.trace.tracer import check_layout, single_thread, trace_plan

FIRST_STAGE = ("embed",)  # families held by the first pipeline stage; lm_head and the final norm by the last


@dataclass
class PlanRow:
    """One layout: valid or its first failing rule, and per-GPU figures for the fullest stage."""
    layout: Layout
    problem: str | None = None
    warnings: list[str] = field(default_factory=list)
    weights: int = 0  # bytes on the fullest GPU
    stage_weights: list[int] = field(default_factory=list)
    kv_per_token: int = 0  # on the fullest GPU (its stage's layers)
    room: float = 0.0  # bytes left for KV cache on the tightest GPU
    kv_tokens: int = 0  # tokens of KV cache the tightest stage holds
    max_sequences: int = 0  # sequences of the context that fit (the whole deployment: x dp replicas)
    per_sequence: int = 0  # KV cache one sequence of the context holds on the fullest stage's GPU
    comm_per_token: float = 0.0  # bytes each token moves: all-reduces, MoE dispatch/combine over dp, PP hand-offs

    @property
    def fits(self) -> bool:
        return self.problem is None and self.room > 0


def layouts(gpus: int, ep: bool) -> list[Layout]:
    """Every tp x pp x dp = gpus, with and without expert parallelism."""
    out = []
    for tp in range(1, gpus + 1):
        for pp in range(1, gpus // tp + 1):
            if gpus % (tp * pp) == 0:
                dp = gpus // (tp * pp)
                out.append(Layout(tp, pp, dp))
                if ep and tp * dp > 1:
                    out.append(Layout(tp, pp, dp, True))
    return out


class Planner:
    """Traces each plan once per cut (tp for the layers, moe_tp for the experts) and sums per stage."""

    def __init__(self, spec: ModelSpec, rules: str = "vllm"):
        self.spec, self.rules = spec, rules
        self.plans = build_plan(spec, rules)
        self._traced: dict = {}

    def _bytes(self, plan, tp: int) -> list[int]:
        """Per layer (or once, for model-wide tensors), the bytes each rank holds of this plan at tp."""
        key = (id(plan), tp)
        if key not in self._traced:
            _, pm = trace_plan(plan, tp)
            size = pm.element_bytes or self.spec.dtype_bytes
            self._traced[key] = [_numel(shape) * size * max(plan.experts, 1) for shape in pm.local_shapes]
        return self._traced[key]

    def _stage_bytes(self, layout: Layout, layers: set[int], first: bool, last: bool) -> int:
        """The fullest GPU of one stage: its layers' share of every plan, plus the model-wide tensors it holds."""
        total = 0
        for plan in self.plans:
            if plan.layers is None:
                held = (plan.family in FIRST_STAGE and first) or (plan.family not in FIRST_STAGE and last) or (
                    plan.family == "embed" and last and self.spec.tie_word_embeddings)  # tied: lm_head's own copy
                total += max(self._bytes(plan, layout.tp)) if held else 0
                continue
            count = len(layers & set(plan.layers))
            if not count:
                continue
            if plan.family == "experts" and layout.ep:  # whole experts: this GPU's share of them
                per_expert = max(self._bytes(plan, 1)) // max(plan.experts, 1)
                most = max(len(e) for e in expert_placement(plan.experts, layout.ep_size))
                total += per_expert * most * count
            else:
                tp = layout.moe_tp if plan.family == "experts" else layout.tp
                total += max(self._bytes(plan, tp)) * count
        return total

    @single_thread()
    def row(self, layout: Layout, gpu_bytes: float, utilization: float, context: int) -> PlanRow:
        """Validate one layout and size it."""
        r = PlanRow(layout)
        spec = self.spec
        if layout.ep and not spec.is_moe:
            r.problem = EP_DENSE
            return r
        r.problem = engine_problem(layout, self.rules)
        if r.problem:
            return r
        try:
            stages = stage_layers(spec.num_hidden_layers, layout.pp)
        except LayoutError as e:
            r.problem = str(e)
            return r
        r.problem, r.warnings = check_layout(spec, layout.tp, self.rules, self.plans, moe_tp=layout.moe_tp)
        if r.problem:
            return r
        kv_layer = self._kv_per_layer(layout.tp, context)
        usable = gpu_bytes * utilization
        replicas = []  # sequences of `context` tokens each stage can hold
        for i, layers in enumerate(stages):
            weights = self._stage_bytes(layout, set(layers), i == 0, i == len(stages) - 1)
            r.stage_weights.append(weights)
            per_token = sum(kv_layer.get(j, (0, 0))[0] for j in layers)
            per_seq = sum(size * min(context, window or context) for size, window in
                          (kv_layer.get(j, (0, 0)) for j in layers))
            r.kv_per_token, r.per_sequence = max(r.kv_per_token, per_token), max(r.per_sequence, per_seq)
            room = usable - weights
            tokens = int(room // per_token) if per_token and room > 0 else 0
            r.kv_tokens = tokens if i == 0 else min(r.kv_tokens, tokens)
            replicas.append(int(room // per_seq) if per_seq and room > 0 else (1 << 30 if room > 0 else 0))
        r.weights = max(r.stage_weights)
        r.room = usable - r.weights
        r.max_sequences = min(replicas) * layout.dp if r.room > 0 else 0
        r.comm_per_token = self._comm(layout)
        return r

    def _kv_per_layer(self, tp: int, context: int) -> dict[int, tuple[int, int]]:
        """KV bytes per token (and window) per attention layer on the fullest GPU at tp, read off the k rows of
        a trace of the attention layers alone."""
        from tpviz.trace.tracer import layer_caches, trace
        key = ("kv", tp)
        if key not in self._traced:
            m = trace(_without_experts(self.spec), tp, self.rules)
            per_rank = [layer_caches(self.spec, m.tensors, rank)[0] for rank in range(tp)]
            self._traced[key] = {i: max(pr[i] for pr in per_rank) for i in per_rank[0]}
        return self._traced[key]

    def _comm(self, layout: Layout) -> float:
        """Bytes per token: every GPU's share of the collectives (see comm_per_token)."""
        return sum(comm_per_token(self.spec, layout, self.rules).values())


def _without_experts(spec: ModelSpec) -> ModelSpec:
    """The same model with dense stand-ins for its experts, to read the attention KV heads at any tp."""
    from dataclasses import replace
    from tpviz.config.kinds import Ffn, LayerSpec
    layers = [LayerSpec(layer.mixer, Ffn("none")) for layer in spec.layers]
    return replace(spec, layers=layers, quant=None)


def plan(spec: ModelSpec, gpus: int, gpu_gib: float, rules: str = "vllm", utilization: float = 0.9,
         context: int = 8192, ep: bool = True) -> list[PlanRow]:
    """Every layout of `gpus` GPUs, accepted ones first (fitting, then by KV room), rejected ones with their rule
    (an engine that runs tensor parallelism alone: TP `gpus` only, which plan_notes says)."""
    if gpus < 1 or gpus > 1024:
        raise LayoutError(f"gpus={gpus} must be between 1 and 1024")
    check_fit_inputs(gpu_gib, utilization, context)
    context = capped_context(spec, context)[0]  # plan_notes says so
    planner = Planner(spec, rules)
    candidates = [Layout(gpus)] if tp_only(rules) else layouts(gpus, ep and spec.is_moe)
    rows = [planner.row(layout, gpu_gib * 2**30, utilization, context) for layout in candidates]
    # accepted first; among them what fits, then the most sequences the whole deployment holds, then less traffic
    return sorted(rows, key=lambda r: (r.problem is not None, not r.fits, -r.max_sequences, -r.kv_tokens,
                                       r.comm_per_token))


def plan_notes(spec: ModelSpec, rules: str, any_fits: bool, context: int = 0) -> list[str]:
    """What the plan leaves out: layouts its engine never runs, what the engine never runs of this model, a context
    capped at its max_model_len, and (when a layout fits) how its sequence counts run high."""
    capped = capped_context(spec, context)[1]
    return (([NANO_PLAN] if tp_only(rules) else []) + engine_notes(spec.model_type, rules) + ([capped] if capped else [])
            + (sizing_notes(spec, rules) if any_fits else []))


def plan_rows(rows: list[PlanRow]) -> list[dict]:
    """Display rows: the layout, its verdict, and per-GPU numbers (bytes; views format them)."""
    return [{"layout": r.layout.label, "tp": r.layout.tp, "pp": r.layout.pp, "dp": r.layout.dp, "ep": r.layout.ep,
             "valid": r.problem is None, "fits": r.fits, "problem": r.problem, "warnings": r.warnings,
             "weights_per_gpu": r.weights, "stage_weights": r.stage_weights, "kv_per_token": r.kv_per_token,
             "kv_tokens": r.kv_tokens, "max_sequences": r.max_sequences, "comm_per_token": r.comm_per_token}
            for r in rows]


# comm_per_token's parts, as the CLI names them
COMM_LABELS = {"tp_all_reduce": "TP all-reduces", "moe_all_reduce": "MoE all-reduces",
               "moe_dispatch_combine": "MoE dispatch/combine over dp", "pp_send_recv": "PP hand-off",
               "norm_collectives": "norm all-gathers / all-reduces", "embed_all_reduce": "embedding all-reduce",
               "logits_gather": "logits gather (per sampled token)"}


def comm_per_token(spec: ModelSpec, layout: Layout, rules: str = "vllm") -> dict[str, float]:
    """Bytes the busiest GPU sends per decoded token (sampled, so the logits count; a prefill token skips them), as
    vLLM 0.33 runs a forward pass over its stage's layers: ring
    all-reduces over the tp GPUs after the mixers, dense FFNs and MoE blocks (with or without EP: the block's final
    reduce); with dp > 1 a MoE block also gathers every replica's tokens and reduce-scatters them back (the default
    allgather_reducescatter all2all backend, one hidden state per other replica each way). Between stages vLLM 0.33
    sends the hidden state and the residual (IntermediateTensors), each tp GPU its 1/tp slice, which the next
    stage's tp GPUs all-gather (v1/worker/gpu_worker.py: isend_tensor_dict with all_gather_group). The first stage
    all-reduces the embedding; the last gathers the logits (vLLM all-gathers them, nano-vllm gathers to GPU 0);
    OLMo-2/3 all-gather q and k in every attention layer (summary.norm_collectives)."""
    hidden = spec.hidden_size * spec.dtype_bytes
    ring = lambda n: 2 * (n - 1) / n if n > 1 else 0.0  # noqa: E731 - the ring all-reduce's share per GPU
    moe_layers, tp, pp = set(spec.moe_layers), layout.tp, layout.pp
    logits = padded_vocab(spec.vocab_size, rules) * spec.dtype_bytes
    logits_sent = logits_collective(logits, tp, rules).sent_per_rank if tp > 1 else 0.0
    busiest = {}
    for stage, layers in enumerate(stage_layers(spec.num_hidden_layers, pp)):
        mine = [spec.layers[i] for i in layers]
        moe = sum(1 for i in layers if i in moe_layers)
        reduced = sum(1 for layer in mine if layer.ffn.kind == "dense") + sum(1 for x in mine if x.mixer.kind != "none")
        sent = 2 * hidden / tp if stage < pp - 1 else 0.0  # its slice of hidden state and residual, to the next stage
        gathered = 2 * hidden * (tp - 1) / tp if stage > 0 else 0.0  # its received slice, to each tp peer
        comm = {"tp_all_reduce": ring(tp) * hidden * reduced, "moe_all_reduce": ring(tp) * hidden * moe,
                "moe_dispatch_combine": 2 * (layout.dp - 1) * hidden * moe, "pp_send_recv": sent + gathered,
                "norm_collectives": sum(c.count * c.sent_per_rank for c in norm_collectives(spec, tp, layers)),
                "embed_all_reduce": ring(tp) * hidden if stage == 0 else 0.0,
                "logits_gather": logits_sent if stage == pp - 1 else 0.0}
        busiest = max(busiest, comm, key=lambda c: sum(c.values()))
    return busiest

"""A speed bound per layout: the least time a decode step, a prefill and a whole run of requests can take on
given GPUs, from the bytes each GPU reads (weights, the experts a batch touches, KV cache), the FLOPs it does
and what it sends (traffic.stage_traffic), at the peaks of the GPU catalog. A bound, not a promise: engines
reach a fraction of it (EFFICIENCY, from published measurements: bench/bench_perf_model.py).

The step of one pipeline stage is max(HBM time, FLOP time) plus its collectives (bytes over the link plus a
latency each): vLLM 0.33 runs a layer's all-reduce after its matmuls, not beside them. Left out, so the bound
stays one: kernel launches, the embedding rows, norms, recurrent-state reads and sampling."""
import math
from dataclasses import dataclass, field

from tpviz.config.kinds import STATEFUL
from tpviz.deploy.hardware import Topology
from tpviz.deploy.parallel import stage_layers
from tpviz.deploy.sizing import LayoutRow, Sizer, StageCost
from tpviz.deploy.traffic import COMM_LABELS, Traffic, stage_traffic
from tpviz.errors import TpvizError
from tpviz.rules import Layout

TERM_LABELS = {"weights": "weights read", "experts": "experts read", "kv": "KV cache read",
               "compute": "FLOPs", **COMM_LABELS}
MEMORY_TERMS = ("weights", "experts", "kv")
COMPUTE_FORMAT = {"fp8_block": "fp8", "fp8_channel": "fp8", "fp8_tensor": "fp8", "mxfp4": "fp4",
                  "nvfp4": "fp4"}
ROUTING = ("routed experts: each token picks top-k of them uniformly at random, so a batch of T tokens reads "
           "a share 1 - (1 - k/E)^T of each GPU's experts")
EP_SAME = ("with and without expert parallelism the bound is the same: vLLM 0.33 reads as many expert "
           "bytes per GPU and sends the same tokens either way (its default allgather_reducescatter "
           "all2all); EP changes kernel shapes and the routing's balance, which a bound leaves out")
GOALS = ("throughput", "latency")
# median of measured / bound over bench/data/perf_measurements.json (tests/deploy/test_perf_calibration.py)
EFFICIENCY = 0.39
BOUND_NOTE = "a bound, not a promise: published runs reach about {:.0%} of it"


def left_out(spec) -> str:
    """What the bound leaves out for this model, as a phrase (each only lowers the bound)."""
    parts = ["kernel launches", "norms", "sampling"]
    if {mx.kind for layer in spec.layers for mx in layer.mixer.parts} & set(STATEFUL):
        parts.append("recurrent-state reads")
    if getattr(spec, "tower", None):
        parts.append("the vision tower's time per image")
    if getattr(spec, "audio", None):
        parts.append("the audio tower's time per clip")
    return ", ".join(parts[:-1]) + " and " + parts[-1] + " left out"


def bound_sentence(spec) -> str:
    """What the bound is and counts, for the views: one sentence, the routing assumption for MoE models."""
    routing = f" {ROUTING[0].upper()}{ROUTING[1:]}." if spec.is_moe else ""
    return (f"{BOUND_NOTE.format(EFFICIENCY)}. Each decode step reads the weights, the experts its batch "
            "touches and the KV cache at the GPU's HBM bandwidth, or does its FLOPs at peak, whichever is "
            "longer, then its collectives at the link's bandwidth and latency; throughput counts the "
            f"prefills too; {left_out(spec)}.{routing}")


class WorkloadError(TpvizError):
    """Lengths, a concurrency or a limit that cannot be a workload."""


@dataclass(frozen=True)
class Workload:
    """Requests of input_len prompt tokens and output_len generated ones, concurrency at a time (None: as
    many as the KV room holds); goal and limits choose among layouts."""
    input_len: int = 1024
    output_len: int = 1024
    concurrency: int | None = None
    goal: str = "throughput"
    tpot_ms: float | None = None
    ttft_ms: float | None = None

    def __post_init__(self):
        for name in ("input_len", "output_len"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 1 << 24:
                raise WorkloadError(f"{name.replace('_', ' ')} = {value!r} must be a whole number of tokens "
                                    f"from 1 to {1 << 24:,}")
        if self.concurrency is not None and (isinstance(self.concurrency, bool) or
                                             not isinstance(self.concurrency, int) or self.concurrency < 1):
            raise WorkloadError(f"concurrency = {self.concurrency!r} must be a positive number of requests, "
                                "or max")
        if self.goal not in GOALS:
            raise WorkloadError(f"goal {self.goal!r}: use throughput or latency")
        for name in ("tpot_ms", "ttft_ms"):
            if (value := getattr(self, name)) is not None and not value > 0:
                raise WorkloadError(f"{name.replace('_ms', '').upper()} limit {value!r} ms must be positive")

    @property
    def context(self) -> int:
        return self.input_len + self.output_len

    @property
    def mean_context(self) -> float:
        """The tokens a decode step attends to, averaged over the output."""
        return self.input_len + (self.output_len + 1) / 2


@dataclass
class Perf:
    """One layout's bound at one workload: times in ms, rates in output tokens/s."""
    tpot_ms: float
    ttft_ms: float
    batch: int  # sequences decoded at once, the whole deployment
    out_tok_s: float  # the whole deployment, prefills included
    out_tok_s_per_gpu: float
    out_tok_s_per_node: float
    decode_tok_s_per_gpu: float  # decode alone (batch / TPOT): what a disaggregated decode GPU can reach
    terms: dict[str, float]  # ms per output token, per term, summed over the stages a token walks
    stage_terms: list[dict[str, float]]  # per stage, its fullest GPU's terms (ms per step)
    meets: bool = True  # within the workload's TPOT and TTFT limits
    crosses: list[str] = field(default_factory=list)  # groups that span scale-up domains
    capped: bool = False  # the KV room holds fewer sequences than the concurrency asked for

    @property
    def bottleneck(self) -> tuple[str, float]:
        """The largest term and its share of TPOT."""
        kind = max(self.terms, key=self.terms.get)
        return kind, self.terms[kind] / self.tpot_ms if self.tpot_ms else 0.0

    @property
    def bottleneck_label(self) -> str:
        kind, share = self.bottleneck
        return f"{TERM_LABELS[kind]}, {share:.0%}"

    def to_dict(self) -> dict:
        return {"tpot_ms": self.tpot_ms, "out_tok_s_per_gpu": self.out_tok_s_per_gpu, "ttft_ms": self.ttft_ms,
                "batch": self.batch, "bottleneck": self.bottleneck_label, "terms": self.terms,
                "out_tok_s": self.out_tok_s, "out_tok_s_per_node": self.out_tok_s_per_node,
                "meets_limits": self.meets, "crosses": self.crosses, "kv_caps_batch": self.capped,
                "decode_tok_s_per_gpu": self.decode_tok_s_per_gpu, "stage_terms": self.stage_terms}


class Speed:
    """The bound for layouts of one model on one topology: per-stage costs are read once per layout."""

    def __init__(self, sizer: Sizer, topology: Topology, workload: Workload,
                 all2all: str = "allgather_reducescatter"):
        self.sizer, self.spec, self.topo, self.work = sizer, sizer.spec, topology, workload
        self.all2all = all2all
        gpu = topology.gpu
        fmt = COMPUTE_FORMAT.get(self.spec.quant.scheme, "bf16") if self.spec.quant else "bf16"
        self.peak = gpu.peak(fmt)
        self.attention_peak = gpu.peak("fp8" if self.spec.kv_bytes == 1 else "bf16")

    def perf(self, row: LayoutRow) -> Perf | None:
        """The bound for a layout that holds at least one sequence of the workload; None where it does not,
        or where its traffic is not modelled."""
        layout = row.layout
        if not row.fits or row.max_sequences < 1:  # the weights leave no room for one whole sequence
            return None
        stages = stage_layers(self.spec.num_hidden_layers, layout.pp, self.sizer.rules)
        traffic = stage_traffic(self.spec, layout, self.sizer.rules, self.all2all, least=True)
        if traffic is None:
            return None
        costs = [self.sizer.stage_cost(layout, set(s), i == 0, i == len(stages) - 1)
                 for i, s in enumerate(stages)]
        links = [{g: self.group_link(layout, i, g) for g in ("tp", "attn", "ep", "pp")}
                 for i in range(len(stages))]
        # the engine's cap on running sequences, per worker (SGLang: one per attention-DP rank)
        cap = (self.sizer.rules.running_cap(self.topo.gpu) or 1 << 16) * layout.attn_dp
        per_replica = max(1, min(row.max_sequences // layout.dp, cap))
        wanted = -(-self.work.concurrency // layout.dp) if self.work.concurrency else per_replica
        batch = min(wanted, per_replica)
        if self.work.goal == "throughput" and self.work.tpot_ms and self.work.concurrency is None:
            batch = self.largest_within(costs, traffic, links, layout, batch)
        tpot, stage_terms = self.pipeline(costs, traffic, links, layout, batch)
        ttft = sum(self.step_time(self.prefill_terms(c, t, link, self.work.input_len))
                   for c, t, link in zip(costs, traffic, links))
        run = self.run_time(costs, traffic, links, layout, batch, stage_terms, tpot)
        out = layout.dp * batch * self.work.output_len / run
        per_gpu = out / layout.gpus
        terms = {k: sum(t.get(k, 0.0) for t in stage_terms) for k in TERM_LABELS}
        terms = {k: v * 1e3 for k, v in terms.items() if v}
        crosses = sorted({x.group for link, ts in zip(links, traffic) for x in ts if link[x.group][2]})
        meets = (self.work.tpot_ms is None or tpot * 1e3 <= self.work.tpot_ms) and \
                (self.work.ttft_ms is None or ttft * 1e3 <= self.work.ttft_ms)
        return Perf(tpot * 1e3, ttft * 1e3, batch * layout.dp, out, per_gpu,
                    per_gpu * min(self.topo.gpus_per_node, layout.gpus),
                    batch * layout.dp / tpot / layout.gpus,
                    terms,
                    [{k: v * 1e3 for k, v in t.items()} for t in stage_terms], meets,
                    crosses, wanted > per_replica)

    def group_link(self, layout: Layout, stage: int, group: str) -> tuple[float, float, bool]:
        """(bytes/s, latency, crosses domains) of the slowest group of a kind at one stage: its tp GPUs in
        each replica, its EP group (every replica's tp GPUs), an SGLang attention-TP group, or its GPUs
        and the next stage's."""
        tp, pp = layout.tp, layout.pp
        at = lambda d, s: [(d * pp + s) * tp + t for t in range(tp)]  # noqa: E731 - vLLM's rank order
        if group == "ep":
            groups = [[r for d in range(layout.dp) for r in at(d, stage)]]
        elif group == "attn":  # SGLang's attention-TP groups: tp / attn_dp consecutive ranks
            width = tp // layout.attn_dp
            groups = [at(d, stage)[i:i + width] for d in range(layout.dp) for i in range(0, tp, width)]
        elif group == "pp":
            groups = [at(d, stage) + at(d, stage + 1) for d in range(layout.dp)] if stage < pp - 1 else []
        else:
            groups = [at(d, stage) for d in range(layout.dp)]
        worst = [g for g in groups if self.topo.crosses(g)]
        bw, lat = self.topo.link(worst[0] if worst else groups[0] if groups else [0])
        return bw, lat, bool(worst)

    def touched(self, tokens: float) -> float:
        """The expected share of a GPU's experts a batch of tokens reads (ROUTING)."""
        k, e = self.spec.num_experts_per_tok, self.spec.num_experts
        return 1 - (1 - k / e) ** tokens if e else 0.0

    def step_terms(self, c: StageCost, traffic: list[Traffic], links: dict, layout: Layout,
                   b: int, context: float) -> dict[str, float]:
        """Seconds per decode step of b sequences on the fullest GPU of a stage, per term."""
        moe_tokens = b * layout.dp  # vLLM's MoE layers take every replica's tokens
        own = b / layout.attn_dp  # SGLang's attention DP: each group attends to its own sequences
        read = c.attention + c.shared_attention  # a KV-shared layer reads its source layer's cache
        kv = sum(size * min(context, w or context) for size, w, _ in read) * own
        attn_macs = sum(m * min(context, w or context) for _, w, m in read) * own
        k, e = self.spec.num_experts_per_tok, max(self.spec.num_experts, 1)
        macs = c.macs * own + c.expert_macs * moe_tokens * k * c.experts_held / e
        terms = {"weights": c.weights / self.topo.gpu.hbm,
                 "experts": c.experts_held * c.expert_bytes * self.touched(moe_tokens) / self.topo.gpu.hbm,
                 "kv": kv / self.topo.gpu.hbm,
                 "compute": 2 * macs / self.peak + 2 * attn_macs / self.attention_peak}
        for t in traffic:
            bw, lat, _ = links[t.group]
            terms[t.kind] = terms.get(t.kind, 0.0) + t.sent * b / bw + t.count * lat
        return terms

    @staticmethod
    def step_time(terms: dict[str, float]) -> float:
        memory = sum(terms[k] for k in MEMORY_TERMS)
        return max(memory, terms["compute"]) + sum(v for k, v in terms.items() if k in COMM_LABELS)

    def pipeline(self, costs, traffic, links, layout: Layout, batch: int) -> tuple[float, list[dict]]:
        """TPOT of a replica decoding `batch` sequences: min(pp, batch) micro-batches in flight, each token
        walks every stage in turn (vLLM V1 keeps pp batches in flight)."""
        micro = -(-batch // min(layout.pp, batch))
        terms = [self.step_terms(c, t, link, layout, micro, self.work.mean_context)
                 for c, t, link in zip(costs, traffic, links)]
        return sum(self.step_time(t) for t in terms), terms

    def largest_within(self, costs, traffic, links, layout: Layout, cap: int) -> int:
        """The largest batch up to cap whose TPOT is within the limit (TPOT grows with the batch)."""
        ok = lambda b: self.pipeline(costs, traffic, links, layout, b)[0] * 1e3 <= self.work.tpot_ms  # noqa
        if not ok(1):
            return 1
        lo, hi = 1, cap
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if ok(mid) else (lo, mid - 1)
        return lo

    def prefill_terms(self, c: StageCost, traffic: list[Traffic], links: dict, tokens: int,
                      requests: int = 1, groups: int = 1) -> dict[str, float]:
        """Seconds to prefill `requests` prompts of `tokens` each on one stage: every weight and touched
        expert read once, causal attention over each prompt, the KV cache written."""
        total = tokens * requests
        causal = sum(m * (min(tokens, w or tokens) * tokens - min(tokens, w or tokens) ** 2 / 2)
                     for _, w, m in c.attention + c.shared_attention) * requests / groups
        k, e = self.spec.num_experts_per_tok, max(self.spec.num_experts, 1)
        # groups: SGLang's attention-DP groups, each with its share of the prompts
        macs = c.macs * total / groups + c.expert_macs * total * k * c.experts_held / e
        hbm = self.topo.gpu.hbm
        terms = {"weights": c.weights / hbm,
                 "experts": c.experts_held * c.expert_bytes * self.touched(total) / hbm,
                 "kv": sum(size for size, _, _ in c.attention) * total / groups / hbm,
                 "compute": 2 * macs / self.peak + 2 * causal / self.attention_peak}
        for t in traffic:
            if t.kind != "logits_gather":  # a prompt samples one token
                bw, lat = links[t.group][:2]
                terms[t.kind] = terms.get(t.kind, 0.0) + t.sent * total / bw + t.count * lat
        return terms

    def run_time(self, costs, traffic, links, layout: Layout, batch: int, steps: list[dict],
                 tpot: float) -> float:
        """Seconds a replica takes for `batch` requests from prompt to last token, at best: each stage reads
        its weights every decode step and does every FLOP of the prefills and steps (chunked prefill overlaps
        a prefill's FLOPs with a step's reads); a token walks the stages in turn, so no less than
        output_len x TPOT either. steps: each stage's terms of one decode step (pipeline's)."""
        micro = -(-batch // min(layout.pp, batch))
        rounds = self.work.output_len * math.ceil(batch / micro)  # steps each stage runs
        busiest = 0.0
        for c, t, link, step in zip(costs, traffic, links, steps):
            pre = self.prefill_terms(c, t, link, self.work.input_len, batch, layout.attn_dp)
            memory = rounds * sum(step[k] for k in MEMORY_TERMS)
            comm = rounds * sum(v for k, v in step.items() if k in COMM_LABELS) + \
                sum(v for k, v in pre.items() if k in COMM_LABELS)
            busiest = max(busiest, max(memory, rounds * step["compute"] + pre["compute"]) + comm)
        return max(busiest, self.work.output_len * tpot)

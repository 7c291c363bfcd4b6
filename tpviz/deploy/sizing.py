"""What each GPU of a layout holds, read off traced maps, not estimated: the non-expert layers traced at their
width, the routed experts at theirs (or whole, one expert at a time, under expert parallelism), summed over
each pipeline stage's layers; the embedding sits on the first stage (on every stage where the engine's model
file builds it so), the final norm and lm_head on the last.
Also the bytes each decoded token sends, and one layout's verdict and room (a LayoutRow)."""
import re
from dataclasses import dataclass, field, replace

from tpviz.config.indexer import indexer_cache_bytes
from tpviz.config.kinds import Ffn, LayerSpec
from tpviz.config.spec import ModelSpec
from tpviz.deploy.parallel import EP_DENSE, stage_layers
from tpviz.deploy.traffic import comm_per_token
from tpviz.errors import LayoutError
from tpviz.plan import ParamPlan, arch_names, build_plan
from tpviz.rules import Layout, RuleSet, ruleset
from tpviz.trace.caches import kv_sources, layer_caches
from tpviz.trace.probe import probing
from tpviz.trace.shardmap import numel
from tpviz.trace.tracer import trace, trace_plan
from tpviz.trace.validity import split_problem

FIRST_STAGE = ("embed",)  # families held by the first pipeline stage; lm_head and the final norm by the last


@dataclass
class LayoutRow:
    """One layout: valid or its first failing rule, and per-GPU figures for the fullest stage."""
    layout: Layout
    problem: str | None = None
    warnings: list[str] = field(default_factory=list)
    weights: int = 0  # bytes on the fullest GPU
    stage_weights: list[int] = field(default_factory=list)
    kv_per_token: int = 0  # on the fullest GPU (its stage's layers)
    room: float = 0.0  # bytes left for KV cache on the tightest GPU
    kv_tokens: int = 0  # tokens of KV cache the tightest stage holds
    # sequences of the context that fit (the whole deployment: x dp replicas, x attention-DP groups)
    max_sequences: int = 0
    per_sequence: int = 0  # KV cache one sequence of the context holds on the fullest stage's GPU
    # bytes each token moves: all-reduces, MoE dispatch/combine over dp, PP hand-offs
    comm_per_token: float | None = 0.0  # None: not modelled (SGLang's attention DP and EP traffic)
    perf: object = None  # its speed bound (deploy.perf.Perf), when the ranking asked for one

    @property
    def fits(self) -> bool:
        return self.problem is None and self.room > 0


NOT_MATMUL = re.compile(r"scale|zero|g_idx|bias|norm|sinks|A_log|^D$|dt_|perm|e_score", re.I)


@dataclass
class StageCost:
    """What the fullest GPU of one stage reads and multiplies per decode step (Sizer.stage_cost)."""
    weights: int = 0  # bytes every step reads
    macs: int = 0  # multiply-adds per token in those weights
    expert_bytes: int = 0  # one routed expert's bytes on this GPU, summed over the stage's MoE layers
    expert_macs: int = 0  # multiply-adds per token routed to one expert, summed likewise
    experts_held: int = 0  # routed experts it holds (each whole under EP, else a slice of every one)
    # per attention layer: KV bytes per token, window (0: none), multiply-adds per cached token
    attention: list[tuple[int, int, int]] = field(default_factory=list)
    # ... of the layers that read another layer's cache and write none (Gemma-4's KV-shared layers)
    shared_attention: list[tuple[int, int, int]] = field(default_factory=list)


class Sizer:
    """Traces each plan once per cut (the layers' width, the experts' width) and sums per stage and GPU."""

    def __init__(self, spec: ModelSpec, rules: RuleSet | str = "vllm", vision: bool = True):
        """vision=False: without the vision tower's plans (what both engines' maps hold, SGLang's leaving the
        tower out: deploy/equivalent.py compares the rest)."""
        self.spec, self.rules, self.vision = spec, ruleset(rules), vision
        self.plans = [p for p in build_plan(spec, self.rules) if vision or p.tower != "vision"]
        self._traced: dict = {}

    def rank_bytes(self, plan: ParamPlan, tp: int) -> list[int]:
        """Per layer (or once, for model-wide tensors: all blocks of a tower's), the bytes each rank holds of
        this plan cut tp ways."""
        key = (id(plan), tp)
        if key not in self._traced:
            _, pm = trace_plan(plan, tp)
            size = pm.element_bytes or self.spec.dtype_bytes
            copies = max(plan.experts, 1) * max(plan.blocks, 1)
            self._traced[key] = [numel(shape) * size * copies for shape in pm.local_shapes]
        return self._traced[key]

    def held(self, plan: ParamPlan, first: bool, last: bool) -> bool:
        """Whether a stage holds a model-wide plan: the embedding on the first (on every stage where the rule
        set says so), the rest on the last (a tied lm_head on the last stage is its own copy of the
        embedding)."""
        if plan.tower:  # only the first stage builds a tower (vLLM 0.33 _mark_tower_model, Model Runner V2)
            return first
        return ((plan.family in FIRST_STAGE and first) or (plan.family not in FIRST_STAGE and last)
                or (plan.family == "embed" and (last and self.head_table(plan)
                                                or self.rules.embed_on_every_stage(self.spec.arch)))
                or (plan.family == "lm_head" and self.rules.head_on_every_stage(self.spec.arch)))

    def head_table(self, plan: ParamPlan) -> bool:
        """Whether a vocab-parallel table is the one a tied lm_head multiplies (not Gemma-4's per-layer
        inputs)."""
        return self.spec.tie_word_embeddings and plan.name == arch_names(self.spec).embed

    def gpu_bytes(self, layout: Layout, layers: set[int], first: bool, last: bool, flat: int,
                  experts: list[int] | None) -> int:
        """Bytes one GPU (flat = dp index x tp + tp index) holds: its stage's layers at its rank in each
        role's group, and its experts (whole, or its slice of each)."""
        w, total = self.widths(layout), 0
        for plan in self.plans:
            width, rank = w.of(plan.role), w.rank(plan.role, flat)
            if plan.layers is None:
                total += self.rank_bytes(plan, width)[rank] if self.held(plan, first, last) else 0
            elif count := len(layers & set(plan.layers)):
                mine = self.rank_bytes(plan, width)[rank] * count
                total += mine // max(plan.experts, 1) * len(experts) if plan.role == "experts" and experts \
                    else mine
        return total

    def stage_bytes(self, layout: Layout, layers: set[int], first: bool, last: bool) -> int:
        """The fullest GPU of one stage: its layers' share of every plan, plus the model-wide tensors it
        holds."""
        w, total = self.widths(layout), 0
        for plan in self.plans:
            full = max(self.rank_bytes(plan, w.of(plan.role)))
            if plan.layers is None:
                total += full if self.held(plan, first, last) else 0
            elif count := len(layers & set(plan.layers)):
                if plan.role == "experts" and w.ep > 1:  # this GPU's share of the experts, each its slice
                    most = max(len(e) for e in self.rules.expert_placement(plan.experts, w.ep))
                    full = full // max(plan.experts, 1) * most
                total += full * count
        return total

    def stage_cost(self, layout: Layout, layers: set[int], first: bool, last: bool) -> "StageCost":
        """What the fullest GPU of one stage reads and multiplies per decode step, before batch and context:
        the weights it reads whole (all it holds but the embedding, of which a step reads a row per token,
        and the routed experts), and one routed expert's slice, read only when a token picks it. A vision
        tower runs per image, not per decode step: it is held, not read."""
        w, c = self.widths(layout), StageCost()
        for plan in self.plans:
            full = max(self.rank_bytes(plan, w.of(plan.role)))
            count = (1 if self.held(plan, first, last) else 0) if plan.layers is None \
                else len(layers & set(plan.run_layers))  # a shared block: read by every layer that runs it
            read = not plan.tower and (plan.family != "embed" or last and self.head_table(plan))
            if not count or not read:
                continue
            if plan.role == "experts":
                c.expert_bytes += full // plan.experts * count
                c.expert_macs += int(full // plan.experts * count * self.macs_per_byte(plan))
            else:
                c.weights += full * count
                c.macs += int(full * count * self.macs_per_byte(plan))
        if self.spec.is_moe and layers & set(self.spec.moe_layers):
            c.experts_held = max(map(len, self.rules.expert_placement(self.spec.num_experts, w.ep))) \
                if w.ep > 1 else self.spec.num_experts
        def heads(i: int) -> int:  # query heads of layer i on one GPU
            return max(1, (self.spec.layers[i].mixer.heads or self.spec.num_attention_heads) // w.attention)
        kv = self.kv_per_layer(w.attention)
        for i, (size, window) in kv.items():
            if i in layers:
                c.attention += self.reads(i, size, window, heads(i))
        for i, source in kv_sources(self.spec).items():
            if i in layers:
                c.shared_attention.append((*kv[source], heads(i) * self.attention_dims(i)))
        return c

    def reads(self, i: int, size: int, window: int, heads: int) -> list[tuple[int, int, int]]:
        """What layer i's decode reads per cached token: (bytes, window, multiply-adds). DeepSeek Sparse
        Attention: its indexer scores every token's index key (every head, whole on each GPU), then MLA
        attends the index_topk tokens it picks, so MLA reads at most that many."""
        m = self.spec.layers[i].mixer
        if not m.index_topk:
            return [(size, window, heads * self.attention_dims(i))]
        index = indexer_cache_bytes(m.index_dim)
        return [(size - index, m.index_topk, heads * self.attention_dims(i))] + (
            [(index, 0, m.index_heads * m.index_dim)] if index else [])

    def attention_dims(self, i: int) -> int:
        """Multiply-adds per query head per cached token of layer i: q.k and p.v over the head (MLA as vLLM
        decodes it, absorbed: over the latent and its rope key, then the latent)."""
        if self.spec.layers[i].mixer.kind == "mla" and self.spec.latent_cache:
            return 2 * self.spec.kv_lora_rank + self.spec.qk_rope_head_dim
        return 2 * (self.spec.layers[i].mixer.head_dim or self.spec.head_dim)

    def macs_per_byte(self, plan: ParamPlan) -> float:
        """Multiply-adds per token per stored byte of a matmul weight (0 for norms, biases, scales and the
        embedding): one per logical element, which packed 4-bit storage holds two to a byte."""
        if plan.family == "embed" and not self.head_table(plan) or len(plan.shape) < 2 \
                or NOT_MATMUL.search(plan.name.rsplit(".", 1)[-1]):
            return 0.0
        stored = plan.element_bytes or self.spec.dtype_bytes
        bits = self.spec.quant.bits if plan.element_bytes and self.spec.quant else 8 * stored
        return 8 / bits

    def widths(self, layout: Layout):
        return self.rules.widths(layout, self.spec.arch)

    def kv_per_layer(self, tp: int) -> dict[int, tuple[int, int]]:
        """KV bytes per token (and window) per attention layer on the fullest GPU at tp, read off the k rows
        of a trace of the attention layers alone."""
        key = ("kv", tp)
        if key not in self._traced:
            m = trace(without_experts(self.spec), tp, self.rules)
            regrouped = self.rules.regroups_qkv(self.spec.arch)
            per_rank = [layer_caches(self.spec, m.tensors, rank, regrouped)[0] for rank in range(tp)]
            self._traced[key] = {i: max(pr[i] for pr in per_rank) for i in per_rank[0]}
        return self._traced[key]

    @probing()
    def row(self, layout: Layout, gpu_bytes: float, utilization: float, context: int) -> LayoutRow:
        """Validate one layout and size it."""
        r, spec = LayoutRow(layout), self.spec
        if layout.ep and not spec.is_moe:
            r.problem = EP_DENSE
            return r
        r.problem = self.rules.layout_problem(layout, spec)
        if r.problem:
            return r
        try:
            stages = stage_layers(spec.num_hidden_layers, layout.pp, self.rules)
        except LayoutError as e:
            r.problem = str(e)
            return r
        w = self.widths(layout)
        r.problem, r.warnings = split_problem(spec, layout.tp, self.rules, self.plans,
                                              widths=w, layout=layout)
        if r.problem:
            return r
        kv_layer = self.kv_per_layer(w.attention)
        usable = gpu_bytes * utilization
        replicas = []  # sequences of `context` tokens each stage can hold
        capped = self.rules.caps_window(spec)  # else a sliding layer caches every token
        for i, layers in enumerate(stages):
            weights = self.stage_bytes(layout, set(layers), i == 0, i == len(stages) - 1)
            r.stage_weights.append(weights)
            per_token = sum(kv_layer.get(j, (0, 0))[0] for j in layers)
            per_seq = sum(size * min(context, window if capped and window else context) for size, window in
                          (kv_layer.get(j, (0, 0)) for j in layers))
            r.kv_per_token, r.per_sequence = max(r.kv_per_token, per_token), max(r.per_sequence, per_seq)
            room = usable - weights
            tokens = int(room // per_token) if per_token and room > 0 else 0
            r.kv_tokens = tokens if i == 0 else min(r.kv_tokens, tokens)
            replicas.append(int(room // per_seq) if per_seq and room > 0 else (1 << 30 if room > 0 else 0))
        r.weights = max(r.stage_weights)
        r.room = usable - r.weights
        r.max_sequences = min(replicas) * layout.dp * layout.attn_dp if r.room > 0 else 0
        comm = comm_per_token(spec, layout, self.rules)
        r.comm_per_token = None if comm is None else sum(comm.values())
        return r


def without_experts(spec: ModelSpec) -> ModelSpec:
    """The same model without its FFNs (and unquantized), to read the attention KV heads at any tp."""
    return replace(spec, layers=[LayerSpec(layer.mixer, Ffn("none")) for layer in spec.layers], quant=None,
                   tower=None, audio=None)

"""User-facing results of a live run: plain dataclasses whose to_dict() feeds the CLI, the page and JSON."""
import json
from dataclasses import asdict, dataclass, field

from tpviz.render.summary import layer_span


CARVED_NAMES = {"attn_dp": "attn-dp={}", "ep_size": "ep={}", "dense_tp1": "dense tp=1",
                "dp_lm_head": "dp lm_head", "shared_tp1": "shared tp=1"}


def layout_name(tp: int, pp: int = 1, ep: bool = False, carved: dict | None = None) -> str:
    """"tp=2", or with pipeline / expert parallelism "tp=2 × pp=2 + EP", or an SGLang layout's carved fields
    "tp=4 × attn-dp=2 × ep=2": how every live message names a layout."""
    return (f"tp={tp}" + (f" × pp={pp}" if pp > 1 else "") + (" + EP" if ep else "")
            + "".join(f" × {CARVED_NAMES[k].format(v)}" for k, v in (carved or {}).items()))

# 2: pp_size, ep; per rank stage, tp_rank, layers, experts. 3: generation, stored bytes. 4: rules, carved,
# per rank groups
SCHEMA = "tpviz.verify/4"


@dataclass
class RankReport:
    """What one rank held, read, spent and sent."""
    rank: int
    device: str
    param_shapes: dict[str, list[int]]
    param_bytes: int
    bytes_read: int  # checkpoint slice bytes this rank read
    bytes_spanned: int  # file range those slices cover (column slices of row-parallel weights span it all)
    checkpoint_bytes: int  # the whole checkpoint, for comparison
    load_s: float
    forward_s: float
    collectives: dict[str, dict[str, int]]  # op -> {"count", "bytes"} issued during the forward pass
    stage: int = 0  # pipeline stage
    tp_rank: int = 0
    layers: list[int] = field(default_factory=list)  # decoder layers this rank built
    experts: list[int] | None = None  # expert parallelism: the global experts held whole here (SGLang: cut)
    groups: dict[str, list[int]] | None = None  # SGLang layout: per role, [ways cut, rank in its group]
    dtype: str = ""  # the run's dtype, in which param_bytes are held
    stored_dtype: str = ""  # the checkpoint's (most of its bytes); stored_bytes: the same parameters in it
    stored_bytes: int = 0
    generate_s: float = 0.0  # greedy steps after the first forward pass
    # parameters whose local shape equals the explorer's map for this rank
    params_checked_against_map: int = 0

    def to_dict(self) -> dict:
        return asdict(self)

    def held(self) -> dict:
        """Held MiB in the checkpoint's dtype (comparable with the checkpoint) and, when it differs, in the
        run's."""
        mib = lambda b: round(b / 2**20, 3)  # noqa: E731
        if not self.stored_dtype:
            return {"held MiB": mib(self.param_bytes)}
        out = {f"held MiB ({self.stored_dtype})": mib(self.stored_bytes),
               "held % of checkpoint": round(100 * self.stored_bytes / max(1, self.checkpoint_bytes), 1)}
        if self.dtype and self.dtype != self.stored_dtype:
            out[f"held MiB ({self.dtype}, as run)"] = mib(self.param_bytes)
        return out

    def row(self, pp: bool = False, ep: bool = False) -> dict:
        """One flat table row (the page's per-rank table, the CLI summary); stage/experts columns for
        PP/EP."""
        where = {"stage": self.stage, "layers": layer_span(self.layers) or "none"} if pp else {}
        if ep or self.experts is not None:
            where["experts"] = layer_span(self.experts or []) or "none"
        if self.groups:  # SGLang: which attention-DP group, and how many ways its experts are cut
            attn, expert = self.groups["attention"], self.groups["experts"]
            where["attn-DP group"] = f"{self.tp_rank // attn[0]} (attn rank {attn[1]} of {attn[0]})"
            where["expert cut"] = f"rank {expert[1]} of {expert[0]}" if expert[0] > 1 else "whole"
        return {"rank": self.rank, **where, "device": self.device, **self.held(),
                "read MiB": round(self.bytes_read / 2**20, 3),
                "read % of checkpoint": round(100 * self.bytes_read / max(1, self.checkpoint_bytes), 1),
                "load s": round(self.load_s, 3), "forward s": round(self.forward_s, 3),
                "collectives": sum(c["count"] for c in self.collectives.values()),
                "collective MiB": round(sum(c["bytes"] for c in self.collectives.values()) / 2**20, 3)}


@dataclass
class LayerDiff:
    """TP vs tp=1 at one stage's output (embed, each layer, final norm, logits)."""
    name: str
    max_abs: float
    max_rel: float  # max_abs / max |tp=1 value|
    limit: float = 0.0  # this stage's tolerance (fp32: 1e-4 scaled; low precision: a multiple of `floor`)
    floor: float | None = None  # low precision: the same stage's tp=1 low-precision vs fp32 gap
    exceeds: bool = False  # beyond `limit`

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class RoutingFlip:
    """The first MoE layer where TP sent a token to other experts than tp=1 did, and why (routing.explain)."""
    layer: int
    batch: int  # the reported token: its batch row and position
    position: int
    decided_by: str  # "experts", or "groups" when TP took other DeepSeek expert groups
    ref_experts: list[int]
    tp_experts: list[int]
    margin: float  # tp=1's lead of its k-th score over the next (experts or groups) at that token
    noise: float  # how far float noise moves one score there
    tokens: int  # tokens routed differently in this layer
    later_layers: list[int]  # later MoE layers with flips (after this one the runs already differ)
    router_gap: float  # max|Δ router score| in this layer, against the stage rule's router_limit
    router_limit: float
    alike_gap: float  # max|Δ| at this layer's output over the tokens routed alike, against alike_limit
    alike_limit: float
    noise_explained: bool  # a near tie with everything before it in tolerance: float noise, not a TP bug
    explanation: str
    prefix: list[int] | None = None  # noise: per batch row, the leading positions every layer routes alike...
    # ...and max|Δlogit| over them, which the verdict then holds to the tolerance
    prefix_gap: float | None = None

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class Environment:
    """Where the ranks ran and why that backend."""
    launcher: str  # "spawn" or "torchrun"
    device: str  # "cpu" or "cuda"
    backend: str  # "gloo", "nccl" or "none" (tp=1)
    reason: str
    gpus: list[str] = field(default_factory=list)
    torch: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class Generation:
    """Greedy generation from one prompt on TP and on tp=1, each following its own picks (no teacher forcing),
    each stopping at the checkpoint's EOS token(s)."""
    new_tokens: int  # asked for: the most either run generates
    prompt_ids: list[int]
    tp_tokens: list[int]
    ref_tokens: list[int]
    diverged_at: int | None  # 0-based index of the first new token that differs; None: identical
    explanation: str  # whether float noise explains the first difference (see generate.explain)
    # last-position logits per step while both inputs agree
    steps: list[LayerDiff] = field(default_factory=list)
    # per stage at the diverging step, on the common prefix
    layers: list[LayerDiff] = field(default_factory=list)
    first_stage: str | None = None  # the first of those stages beyond tolerance
    margin: float | None = None  # tp=1's lead of its own pick over TP's at the diverging position
    floor: float | None = None  # the noise floor there (low precision)
    noise_explained: bool | None = None
    prompt_text: str | None = None  # decoded with the model's tokenizer, when it has one
    tp_text: str | None = None
    ref_text: str | None = None
    pieces: list[str] | None = None  # the decoded TP and tp=1 tokens at the diverging position
    # from generation_config.json or config.json; []: none
    eos_token_ids: list[int] = field(default_factory=list)
    tp_stopped_at_eos: bool = False  # that run's last pick is an EOS token, so it stopped there
    ref_stopped_at_eos: bool = False

    def outputs(self, tp_label: str) -> list[tuple[str, str]]:
        """(label, the continuation quoted on one line: text with escapes, or the token ids)."""
        def show(text, ids, stopped):
            shown = json.dumps(text, ensure_ascii=False) if text is not None else str(ids)
            return shown + (f" (stopped at EOS after {len(ids)} tokens)" if stopped else "")
        return [(tp_label, show(self.tp_text, self.tp_tokens, self.tp_stopped_at_eos)),
                ("tp=1", show(self.ref_text, self.ref_tokens, self.ref_stopped_at_eos))]

    def divergence(self, tp_label: str) -> str:
        """'identical for all 8 new tokens' or where the two continuations first differ."""
        if self.diverged_at is None:
            return f"identical for all {len(self.tp_tokens)} new tokens" + (
                " (both stopped at EOS)" if self.tp_stopped_at_eos else "")
        d, (tp, ref) = self.diverged_at, self.pieces or ("", "")
        def show(piece, token):
            return (json.dumps(piece, ensure_ascii=False) + " " if self.pieces else "") + f"#{token}"
        stopped = [who for who, ids in ((tp_label, self.tp_tokens), ("tp=1", self.ref_tokens))
                   if ids[d] in self.eos_token_ids]  # its last pick: it stopped there
        stop = f", where {' and '.join(stopped)} stopped at EOS" if stopped else ""
        return (f"first differ at new token #{d + 1} of {self.new_tokens} (position "
                f"{len(self.prompt_ids) + d}): {tp_label} {show(tp, self.tp_tokens[d])} vs tp=1 "
                f"{show(ref, self.ref_tokens[d])}{stop}")


@dataclass
class VerifyResult:
    """The verdict of one TP-vs-tp=1 check and everything needed to explain it."""
    model: str
    tp_size: int
    dtype: str
    input_shape: list[int]
    passed: bool
    tolerance: float
    tolerance_rule: str
    max_abs_diff: float
    max_rel_diff: float
    argmax_agreement: float
    noise_floor: float | None
    diverges_at: str | None
    layers: list[LayerDiff]
    ranks: list[RankReport]
    environment: Environment
    injections: list = field(default_factory=list)  # inject.Injection
    phases: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    random_weights: bool = False
    seed: int = 0
    pp_size: int = 1  # pipeline stages (tp_size ranks each)
    ep: bool = False  # routed experts placed whole on the ranks (expert parallelism)
    rules: str = "vllm"  # the rule set the ranks split by
    carved: dict = field(default_factory=dict)  # SGLang: the layout fields carved out of tp (Layout.carved)
    checkpoint_dtype: str = ""  # the dtype most of the checkpoint's bytes are stored in
    generation: Generation | None = None  # greedy continuation on TP and on tp=1
    routing: RoutingFlip | None = None  # MoE: the first token routed to other experts than on tp=1

    @property
    def layout(self) -> str:
        return layout_name(self.tp_size, self.pp_size, self.ep, self.carved)

    @property
    def verdict(self) -> str:
        return "PASS" if self.passed else "MISMATCH"

    def to_dict(self) -> dict:
        d = asdict(self)
        return {"schema": SCHEMA, "verdict": self.verdict, **d}

    def headline(self) -> str:
        """One line: verdict, the gap against its tolerance, argmax agreement, where it diverges, and whether
        the weights were random."""
        where = f"; diverges at {self.diverges_at}" if self.diverges_at else ""
        if self.routing:
            why = "float noise at a near tie" if self.routing.noise_explained else "a real mismatch"
            where += f"; routing flip in layer {self.routing.layer} ({why})"
        where += f"; random weights (seed {self.seed})" if self.random_weights else ""
        floor = f" (noise floor {self.noise_floor:.3g})" if self.noise_floor is not None else ""
        gap = f"max|Δlogit| {self.max_abs_diff:.3g}"
        if self.routing and self.routing.prefix_gap is not None:  # decided before the routing flips
            gap = (f"max|Δlogit| {self.routing.prefix_gap:.3g} over the positions before "
                   f"the first routing flip (all positions {self.max_abs_diff:.3g})")
            ok = self.routing.prefix_gap <= self.tolerance
        else:
            ok = self.passed
        return (f"{self.verdict}: {self.layout} vs tp=1 {self.dtype} {gap} "
                f"{'<=' if ok else '>'} tolerance {self.tolerance:.3g}{floor}, "
                f"argmax agreement {100 * self.argmax_agreement:.1f}%{where}")

    def summary(self) -> str:
        """Multi-line text report for the CLI."""
        env = self.environment
        weights = f"random weights, seed {self.seed}" if self.random_weights else "real weights"
        lines = [self.headline(), f"  tolerance: {self.tolerance_rule}",
                 f"  model {self.model} ({weights}), input {self.input_shape}, {env.launcher} on "
                 f"{env.device}/{env.backend}"
                 f" ({env.reason})",
                 f"  max rel diff {self.max_rel_diff:.3g}"]
        lines += [f"  inject {i.name}: {'active' if i.has_effect else 'NO EFFECT'} ({i.reason})"
                  for i in self.injections]
        lines += [f"  routing: {self.routing.explanation}"] if self.routing else []
        lines.append("  per stage max|Δ| (tp vs tp=1):")
        lines += [f"    {d.name:<14} {d.max_abs:10.3g}  tol {d.limit:<9.3g}"
                  + (f" floor {d.floor:<9.3g}" if d.floor is not None else "")
                  + (" <-- exceeds" if d.exceeds else "")
                  + (" <-- routing flip" if self.routing and d.name == f"layer {self.routing.layer}" else "")
                  for d in self.layers]
        lines = [line.rstrip() for line in lines]
        lines.append("  per rank:")
        lines += ["    " + ", ".join(f"{k} {v}" for k, v in r.row(self.pp_size > 1, self.ep).items())
                  for r in self.ranks]
        lines += self.generation_lines()
        lines.append("  phases: " + ", ".join(f"{k} {v:.2f}s" for k, v in self.phases.items()))
        lines += [f"  note: {n}" for n in self.notes if not n.startswith("--inject")]  # listed above
        return "\n".join(lines)

    def generation_lines(self) -> list[str]:
        """The two continuations (one quoted line each), where they part, why, and that step's stages."""
        g = self.generation
        if g is None:
            return []
        label = self.layout
        ids = ([f"#{i}" for i in g.eos_token_ids[:4]] + [f"{len(g.eos_token_ids) - 4} more"]
               * (len(g.eos_token_ids) > 4))
        eos = f" (stopping at EOS {', '.join(ids)})" if ids else ""
        lines = [f"  generated {'up to ' if eos else ''}{g.new_tokens} new tokens "
                 f"greedily{eos}, each run following its own picks:"]
        if g.prompt_text is not None:
            lines.append(f"    prompt {json.dumps(g.prompt_text, ensure_ascii=False)}")
        lines += [f"    {who:<6} {text}" for who, text in g.outputs(label)]
        lines += ([] if g.diverged_at is None else [f"    {g.divergence(label)}"]) + [f"    {g.explanation}"]
        if g.layers and g.diverged_at:
            lines.append(f"    per stage max|Δ| at new token #{g.diverged_at + 1} (same "
                         f"{len(g.prompt_ids) + g.diverged_at} input tokens on both):")
            lines += [f"      {d.name:<14} {d.max_abs:10.3g}  tol {d.limit:.3g}"
                      + (" <-- exceeds" if d.exceeds else "") for d in g.layers]
        return lines

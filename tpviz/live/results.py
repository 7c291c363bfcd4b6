"""User-facing results of a live run: plain dataclasses whose to_dict() feeds the CLI, the page and JSON."""
from dataclasses import asdict, dataclass, field

from tpviz.summary import layer_span

SCHEMA = "tpviz.verify/2"  # 2: pp_size, ep; per rank stage, tp_rank, layers, experts


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
    experts: list[int] | None = None  # expert parallelism: the global experts held whole here

    def to_dict(self) -> dict:
        return asdict(self)

    def row(self, pp: bool = False, ep: bool = False) -> dict:
        """One flat table row (the page's per-rank table, the CLI summary); stage/experts columns for PP/EP."""
        where = {"stage": self.stage, "layers": layer_span(self.layers) or "none"} if pp else {}
        if ep:
            where["experts"] = layer_span(self.experts or []) or "none"
        return {"rank": self.rank, **where, "device": self.device, "params MiB": round(self.param_bytes / 2**20, 3),
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

    @property
    def layout(self) -> str:
        """"tp=2", or with pipeline / expert parallelism "tp=2 × pp=2 + EP"."""
        return f"tp={self.tp_size}" + (f" × pp={self.pp_size}" if self.pp_size > 1 else "") + (" + EP" if self.ep else "")

    @property
    def verdict(self) -> str:
        return "PASS" if self.passed else "MISMATCH"

    def to_dict(self) -> dict:
        d = asdict(self)
        return {"schema": SCHEMA, "verdict": self.verdict, **d}

    def headline(self) -> str:
        """One line: verdict, the gap against its tolerance, argmax agreement, where it diverges, and whether the
        weights were random."""
        where = f"; diverges at {self.diverges_at}" if self.diverges_at else ""
        where += f"; random weights (seed {self.seed})" if self.random_weights else ""
        floor = f" (noise floor {self.noise_floor:.3g})" if self.noise_floor is not None else ""
        return (f"{self.verdict}: {self.layout} vs tp=1 {self.dtype} max|Δlogit| {self.max_abs_diff:.3g} "
                f"{'<=' if self.passed else '>'} tolerance {self.tolerance:.3g}{floor}, "
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
        lines.append("  per stage max|Δ| (tp vs tp=1):")
        lines += [f"    {d.name:<14} {d.max_abs:10.3g}  tol {d.limit:<9.3g}"
                  + (f" floor {d.floor:<9.3g}" if d.floor is not None else "")
                  + (" <-- exceeds" if d.exceeds else "") for d in self.layers]
        lines = [line.rstrip() for line in lines]
        lines.append("  per rank:")
        lines += ["    " + ", ".join(f"{k} {v}" for k, v in r.row(self.pp_size > 1, self.ep).items())
                  for r in self.ranks]
        lines.append("  phases: " + ", ".join(f"{k} {v:.2f}s" for k, v in self.phases.items()))
        lines += [f"  note: {n}" for n in self.notes if not n.startswith("--inject")]  # listed above
        return "\n".join(lines)

"""The shard-map data model: plain data that the plots, JSON, PNG, CLI and app all read."""
import json
from dataclasses import asdict, dataclass, field

from tpviz.config.spec import ModelSpec
from tpviz.errors import SourceError
from tpviz.rules import Layout, RuleSet, ruleset

SCHEMA = "tpviz.shardmap/4"
FAMILIES = ("qkv", "o_proj", "linear_attn", "mamba1", "mamba", "conv", "kda", "gate_up", "down_proj",
            "experts", "vision", "audio", "embed", "lm_head", "replicated")


@dataclass
class Piece:
    """Source rows (or columns) [start, stop) along split_dim land at param_start of rank's local
    parameter."""
    rank: int
    start: int
    stop: int
    param_start: int

    @property
    def size(self) -> int:
        return self.stop - self.start


@dataclass
class TensorMap:
    """Where one checkpoint tensor goes: name uses '*' for the layer (and expert) index."""
    name: str
    shape: list[int]
    split_dim: int | None
    param: str
    layer_class: str
    shard_id: str | int | None
    family: str
    pieces: list[Piece]
    layers: list[int] | None = None
    experts: list[int] | None = None
    note: str = ""
    # [label, start, stop, head size or 0, head word] along split_dim
    sections: list = field(default_factory=list)
    tower: str = ""  # "vision": a vision tower tensor (plan/tower.py)
    blocks: int = 0  # a tower tensor's copies: '*' in its name is the block index 0..blocks-1
    # per layer, what fills the name's two '*' where a layer's tensor is stored under another layer (Zamba2's
    # adapters: hybrid layer j's sits in its shared block's list, [block layer, j])
    stored_at: list = field(default_factory=list)

    @property
    def copies(self) -> int:
        """Concrete checkpoint tensors of this name: one per layer (or tower block), per expert when each
        expert has its own."""
        per = len(self.experts) if self.experts and self.name.count("*") > 1 else 1
        return (len(self.layers) if self.layers is not None else max(self.blocks, 1)) * per

    def rank_pieces(self, rank: int) -> list[Piece]:
        return [p for p in self.pieces if p.rank == rank]

    def to_dict(self) -> dict:
        d = asdict(self)
        for key in ("layers", "experts"):
            if d[key] is None:
                del d[key]
        for key in ("note", "sections", "tower", "blocks", "stored_at"):
            if not d[key]:
                del d[key]
        return d


@dataclass
class ParamMap:
    """One local parameter (qkv_proj, gate_up_proj, ...) and its per-rank shapes."""
    name: str
    layer_class: str
    family: str
    split_dim: int | None
    shape: list[int]  # full logical shape, as if tp_size were 1
    local_shapes: list[list[int]]  # per rank
    padding: list[int]  # per rank: rows along split_dim never loaded (vocab padding)
    sources: list[str]
    count: int  # copies in the model: layers x experts
    layers: list[int] | None = None
    element_bytes: int = 0  # bytes per stored element (quantized tensors); 0: the model dtype
    tower: str = ""  # "vision": a vision tower parameter
    runs: list[int] | None = None  # the layers that run it, where more than hold it (Zamba2's shared blocks)

    @property
    def run_layers(self) -> list[int] | None:
        """The layers whose forward pass reads this parameter (ParamPlan.run_layers)."""
        return self.layers if self.runs is None else self.runs

    def to_dict(self) -> dict:
        d = asdict(self)
        for key in ("layers", "runs"):
            if d[key] is None:
                del d[key]
        if not d["tower"]:
            del d["tower"]
        return d


@dataclass
class LayerGroup:
    """Layers of one kind: their indices, the mixer and FFN (as dicts) and a label."""
    layers: list[int]
    mixer: dict
    ffn: dict
    label: str


@dataclass
class RankInfo:
    rank: int
    weight_bytes: int
    weight_bytes_by_family: dict[str, int]
    kv_cache_bytes_per_token: int  # layers whose cache grows with the context (full attention, MLA)
    # which global KV heads this rank holds (first attention group)
    kv_heads: list[int] = field(default_factory=list)
    # {kind, window, layers, bytes_per_token}: capped
    kv_cache_windowed: list[dict] = field(default_factory=list)
    state_bytes_per_sequence: int = 0  # Gated DeltaNet, Mamba2 and conv state, fixed per sequence

    def cache_bytes(self, context: int) -> int:
        """KV cache and state one sequence of `context` tokens holds on this rank."""
        windowed = sum(w["bytes_per_token"] * min(context, w["window"]) for w in self.kv_cache_windowed)
        return self.kv_cache_bytes_per_token * context + windowed + self.state_bytes_per_sequence


@dataclass
class Gpu:
    """One GPU: its coordinates, the decoder layers [start, stop) of its stage, its whole experts (EP), and
    what it holds per token."""
    rank: int
    pp: int
    dp: int
    tp: int
    layers: list[int]
    experts: list[int] | None
    weight_bytes: int
    kv_cache_bytes_per_token: int  # layers whose cache grows with the context
    kv_windowed_bytes_per_token: int  # windowed layers, which cache each token only up to their window


@dataclass
class Deployment:
    """Every GPU of a layout, the layer partition, the expert placement and the bytes each token sends."""
    layout: Layout
    placement: str | None  # with EP: linear or round_robin
    stages: list[list[int]]  # [start, stop) per stage
    expert_placement: list[list[int]] | None
    gpus: list[Gpu]
    warnings: list[str] = field(default_factory=list)
    comm_bytes_per_token: dict[str, float] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return self.layout.label

    def to_dict(self) -> dict:
        """The shard map JSON's "layout" object (docs/schema.md)."""
        lay = self.layout
        return {"tp": lay.tp, "pp": lay.pp, "dp": lay.dp, "ep": lay.ep, **lay.carved, "label": lay.label,
                "placement": self.placement, "stages": self.stages, "expert_placement": self.expert_placement,
                "gpus": [asdict(g) for g in self.gpus], "warnings": self.warnings,
                "comm_bytes_per_token": self.comm_bytes_per_token}

    @classmethod
    def from_dict(cls, d: dict) -> "Deployment":
        return cls(Layout.from_dict(d), d["placement"], d["stages"],
                   d["expert_placement"],
                   [Gpu(**g) for g in d["gpus"]], d["warnings"], d["comm_bytes_per_token"])


@dataclass
class ShardMap:
    """Every checkpoint tensor of a model, where each rank's share of it lands, and per-rank totals."""
    tp_size: int
    rules: RuleSet
    model: ModelSpec
    tensors: list[TensorMap]
    params: list[ParamMap]
    ranks: list[RankInfo]
    groups: list[LayerGroup] = field(default_factory=list)
    checkpoint: dict | None = None  # comparison with a real checkpoint's tensor list, when one was at hand
    warnings: list[str] = field(default_factory=list)  # layouts the engine accepts only through a fallback
    # a pp / dp / ep deployment's GPUs (tpviz.deploy.deployment), when asked
    deployment: Deployment | None = None
    schema: str = SCHEMA

    def tensor(self, name: str) -> TensorMap:
        """The tensor with this checkpoint name ('*' for layer indices)."""
        for t in self.tensors:
            if t.name == name:
                return t
        raise KeyError(name)

    def family(self, family: str, group: "LayerGroup | None" = None) -> list[TensorMap]:
        return [t for t in self.tensors if t.family == family and in_group(t, group)]

    @property
    def total_weight_bytes(self) -> int:
        """Bytes of the unsplit model, each tensor once."""
        return sum(numel(p.shape) * p.count * (p.element_bytes or self.model_dtype_bytes)
                   for p in self.params)

    @property
    def kv_bytes(self) -> int:
        """Bytes per cached KV value (the KV-cache dtype when one was chosen)."""
        return self.model.kv_bytes

    @property
    def model_dtype_bytes(self) -> int:
        return self.model.dtype_bytes

    def to_dict(self) -> dict:
        return {"schema": self.schema, "tp_size": self.tp_size, "rules": self.rules.name,
                "engine": self.rules.label, "model": self.model.to_dict(),
                "tensors": [t.to_dict() for t in self.tensors], "params": [p.to_dict() for p in self.params],
                "ranks": [asdict(r) for r in self.ranks], "groups": [asdict(g) for g in self.groups],
                "warnings": self.warnings,
                **({"layout": self.deployment.to_dict()} if self.deployment else {}),
                **({"checkpoint": self.checkpoint} if self.checkpoint is not None else {})}

    def to_json(self, indent: int | None = None) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    @classmethod
    def from_dict(cls, d: dict) -> "ShardMap":
        """Rebuild from to_dict() output (e.g. a downloaded JSON)."""
        if not isinstance(d, dict) or d.get("schema") != SCHEMA:
            raise SourceError(f"not a tpviz shard map: expected schema {SCHEMA!r}")
        try:
            tensors = [TensorMap(**{**t, "pieces": [Piece(**p) for p in t["pieces"]]}) for t in d["tensors"]]
            groups = [LayerGroup(**g) for g in d["groups"]]
            # the JSON keeps layers per group
            at = {i: {"mixer": g.mixer, "ffn": g.ffn} for g in groups for i in g.layers}
            model = ModelSpec.from_dict({**d["model"], "layers": [at[i] for i in sorted(at)]})
            return cls(d["tp_size"], ruleset(d["rules"]), model, tensors,
                       [ParamMap(**p) for p in d["params"]],
                       [RankInfo(**r) for r in d["ranks"]], groups, d.get("checkpoint"),
                       d.get("warnings", []),
                       Deployment.from_dict(d["layout"]) if d.get("layout") else None)
        except (KeyError, TypeError, AttributeError) as e:
            raise SourceError(f"shard map JSON is missing or has unexpected fields: {e}") from None


def numel(shape) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def in_group(t, group: LayerGroup | None) -> bool:
    """Whether a tensor belongs in a layer group's view: it lives in one of its layers, or it is
    model-wide."""
    return group is None or t.layers is None or bool(set(t.layers) & set(group.layers))

"""What the live model runs: the spec with the raw-config facts the spec leaves out (LiveConfig), the share of
one rank beyond its TP slice (Stage: pipeline layers, whole experts), and which architectures the live model
runs (their records' `live` block, tpviz.archs)."""
from dataclasses import asdict, dataclass, field

from tpviz.archs import REGISTRY
from tpviz.config.spec import SET_ONLY, ModelSpec
from tpviz.deploy.parallel import stage_layers
from tpviz.live.errors import LiveError
from tpviz.rules import Layout, Widths, ruleset

GELU_BLOCKS = ("gemma2", "gemma3")  # Gemma's GELU-tanh MLPs (gemma.read_gemma); the others run SiLU


@dataclass
class LiveConfig:
    """What the live model needs: the normalized spec plus the few raw-config facts the spec leaves out."""
    spec: ModelSpec
    mlp_bias: bool = False  # Llama's mlp_bias: gate/up/down carry biases (down is row-parallel)
    sliding_window: int | None = None  # Mistral/Mixtral: attend to at most this many previous tokens
    norm_topk_prob: bool = False  # MoE: renormalize the top-k routing weights (Mixtral always does)
    # rope.rope_parameters(): type, theta, rotated dims, scaling; {} plain
    rope: dict = field(default_factory=dict)
    # OLMo-3, Gemma-3: the sliding layers' own (unscaled) RoPE, as rope_parameters()
    local_rope: dict | None = None
    attn_scale: float | None = None  # Gemma: query_pre_attn_scalar ** -0.5; None: head_dim ** -0.5
    attn_softcap: float | None = None  # Gemma-2: attention scores become c * tanh(scores / c)
    # Gemma: logits become c * tanh(logits / c), after the vocabulary gather
    final_softcap: float | None = None
    # Gemma: embeddings times sqrt(hidden_size), rounded to the activation dtype
    embed_scale: float | None = None
    # DeepSeek: grouped top-k (moe.routing_config); {} softmax top-k
    routing: dict = field(default_factory=dict)
    rope_interleave: bool = False  # DeepSeek MLA: RoPE turns (x0, x1) pairs (GPT-J style), not halves
    swiglu: dict = field(default_factory=dict)  # gpt-oss: the experts' clamped SwiGLU {"alpha", "limit"}
    rules: str = "vllm"
    notes: list[str] = field(default_factory=list)

    @property
    def qkv_bias(self) -> bool:
        return self.spec.attention_bias

    @property
    def o_bias(self) -> bool:
        return self.spec.o_proj_bias

    def to_dict(self) -> dict:
        d = asdict(self)
        d["spec"].pop("config")  # the raw config was read into these fields already
        for key in ("tower", "audio"):  # Run live runs text decoders (source.py drops the towers)
            if d["spec"][key] is None:
                del d["spec"][key]
        # no live block runs Gemma-4's KV-shared layers or per-layer inputs, nor DeepSeek's sparse attention:
        # their fields are left out when unset
        for layer in d["spec"]["layers"]:
            for key in ("kv_shared", "index_heads", "index_dim", "index_topk", "inner", "dt_rank", "no_norm",
                        "beside", "q_rank", "head_gate", "shared_block"):  # ... nor Mamba1, Falcon-H1's
                # Mamba2 beside attention, Step-3's low-rank q, Step-3.5's head gate or Zamba2's shared blocks
                if not layer["mixer"][key]:
                    del layer["mixer"][key]
        for key in SET_ONLY:
            if not d["spec"][key]:
                del d["spec"][key]
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "LiveConfig":
        return cls(**{**d, "spec": ModelSpec.from_dict(d["spec"])})


@dataclass(frozen=True)
class Cuts:
    """One GPU's groups in a layout SGLang carves out of a stage's tp GPUs: how many ways each role is cut
    (RuleSet.widths) and which GPU of the stage this is. Every group is a block of consecutive GPUs, so a
    role's rank is flat mod its width, and the attention-DP group (the rows of the batch it runs) is flat //
    the attention width."""
    widths: Widths
    flat: int
    tp: int  # the stage's GPUs

    def of(self, role: str) -> tuple[int, int]:
        """(ways cut, rank in its group) for a role (ParamPlan.role)."""
        return self.widths.of(role), self.widths.rank(role, self.flat)

    @property
    def attn_dp(self) -> int:
        return self.tp // self.widths.attention

    @property
    def dp_index(self) -> int:
        return self.flat // self.widths.attention

    @property
    def ep_rank(self) -> int:
        return self.widths.ep_rank(self.flat)


@dataclass(frozen=True)
class Stage:
    """One rank's share beyond its TP slice: its pipeline stage's decoder layers and, under expert
    parallelism, the global experts it holds whole (vLLM: PPMissingLayer elsewhere, an expert_map); in a
    carved SGLang layout, its Cuts."""
    layers: tuple[int, ...]
    first: bool = True
    last: bool = True
    experts: tuple[int, ...] | None = None
    cuts: Cuts | None = None
    # holds embed_tokens: the first stage, or every stage where the model file builds it so
    # (RuleSet.embed_on_every_stage); only the first runs it
    embed: bool = True

    @classmethod
    def of(cls, spec: ModelSpec, tp_size: int = 1, tp_rank: int = 0, pp_size: int = 1, pp_rank: int = 0,
           ep: bool = False, placement: str = "linear", rules: str = "vllm",
           layout: Layout | None = None) -> "Stage":
        """The rule set's layer partition for pp_rank and, with ep, the experts of EP rank tp_rank (EP size =
        tp, dp 1); with an SGLang layout, the experts of this GPU's EP rank (--ep) and its Cuts."""
        rules = ruleset(rules)
        layers = stage_layers(spec.num_hidden_layers, pp_size, rules)[pp_rank]
        edge = (tuple(layers), pp_rank == 0, pp_rank == pp_size - 1)
        embed = pp_rank == 0 or rules.embed_on_every_stage(spec.arch)
        if layout is not None:
            cuts = Cuts(rules.widths(layout, spec.arch), tp_rank, layout.tp)
            experts = (tuple(rules.expert_placement(spec.num_experts, layout.ep_size)[cuts.ep_rank])
                       if layout.ep_size > 1 else None)
            return cls(*edge, experts, cuts, embed=embed)
        experts = tuple(rules.expert_placement(spec.num_experts, tp_size, placement)[tp_rank]) if ep else None
        return cls(*edge, experts, embed=embed)

    def elsewhere(self, name: str) -> bool:
        """A checkpoint tensor another stage or EP rank holds: this rank skips it without reading it."""
        parts = name.split(".")
        if parts[:2] == ["model", "layers"] and len(parts) > 2 and parts[2].isdigit():
            if int(parts[2]) not in self.layers:
                return True
            k = parts.index("experts") if "experts" in parts else -1
            return (self.experts is not None and 0 <= k < len(parts) - 1 and parts[k + 1].isdigit()
                    and int(parts[k + 1]) not in self.experts)
        if parts[:2] == ["model", "embed_tokens"]:
            return not self.embed
        return not self.last and (parts[:2] == ["model", "norm"] or parts[0] == "lm_head")


def live_types(block: str | None = None) -> list[str]:
    """The model_types Run live runs (with this block, when given), from the registry."""
    return [t for t, a in REGISTRY.items() if a.live and (block is None or a.live == block)]


def check_supported(spec: ModelSpec) -> None:
    """Raise a one-line LiveError unless the live model can run this architecture faithfully."""
    arch, mla = spec.arch, live_types("mla")
    if spec.is_mla and arch.live != "mla":
        raise LiveError(f"{spec.name} uses MLA ({spec.model_type}), which the live check runs for "
                        f"{', '.join(mla)} only")
    if arch.live == "mla" and not spec.is_mla:
        raise LiveError(f"{spec.name} is a {spec.model_type} config without kv_lora_rank; "
                        "the live check runs DeepSeek with MLA only")
    if spec.is_moe and (not arch.live_moe or (spec.shared_expert_intermediate_size and not arch.live_shared)):
        moe = [t for t, a in REGISTRY.items() if a.live_moe and a.live != "gpt_oss"]
        shared = [t for t, a in REGISTRY.items() if a.live_shared]
        raise LiveError(f"{spec.name} uses {spec.model_type} MoE, which the live check does not support yet; "
                        f"it runs MoE for {', '.join(moe)} only (shared experts: {', '.join(shared)})")
    if arch.live == "mla" and (spec.attention_bias or spec.mlp_bias):
        raise LiveError(f"{spec.name} sets attention_bias or mlp_bias; vLLM 0.33 builds "
                        "DeepSeek's projections without biases, and so does the live check")
    if not arch.live:
        raise LiveError(f"the live check runs {', '.join(live_types())} models; "
                        f"{spec.name} is model_type {spec.model_type!r}")
    if arch.needs_experts and not spec.is_moe:
        raise LiveError(f"{spec.name} is a {arch.hf_class} config without experts (num_local_experts)")
    if spec.is_moe and not 1 <= spec.num_experts_per_tok <= spec.num_experts:
        raise LiveError(f"num_experts_per_tok={spec.num_experts_per_tok} must be between 1 and "
                        f"num_experts={spec.num_experts}")
    if spec.hidden_act != "silu" and arch.live not in GELU_BLOCKS:  # Gemma's GELU-tanh: gemma.read_gemma
        raise LiveError(f"hidden_act={spec.hidden_act!r}: the live check runs SiLU-gated MLPs only")

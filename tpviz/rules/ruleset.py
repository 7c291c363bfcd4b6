"""A rule set: one engine version's rules for cutting a model over GPUs, as one object.

Everything that differs between engines is a field or a method here, so the layers, the planner and the views
ask the rule set and never compare its name. The engines themselves are in engines.py.
"""
import os
from dataclasses import dataclass, field

from tpviz.errors import LayoutError, TPSizeError
from tpviz.rules.layout import Layout
from tpviz.rules.served import architecture, retired_in

MAX_TP = 1024  # far beyond any deployment; keeps a typo from tracing a billion ranks


def check_tp(tp_size, tp_rank: int = 0) -> None:
    """tp_size must be a positive int and tp_rank one of its ranks."""
    if isinstance(tp_size, bool) or not isinstance(tp_size, int) or tp_size < 1:
        raise TPSizeError(f"tp_size={tp_size!r} must be a positive integer")
    if tp_size > MAX_TP:
        raise TPSizeError(f"tp_size={tp_size} is larger than {MAX_TP}; use a tp size a deployment could have")
    if isinstance(tp_rank, bool) or not isinstance(tp_rank, int) or not 0 <= tp_rank < tp_size:
        raise TPSizeError(f"tp_rank={tp_rank!r} must be in 0..{tp_size - 1} for tp_size={tp_size}")


def divide(numerator: int, denominator: int, what: str = "size", generic: bool = False) -> int:
    """numerator // denominator, raising a TPSizeError naming `what` when it does not divide; generic: `what`
    is a layer's own size name, which the tracer replaces with the config key behind it."""
    if numerator % denominator:
        raise TPSizeError(f"{what}={numerator} is not divisible by tp_size={denominator}", what,
                          numerator, denominator, generic)
    return numerator // denominator


@dataclass(frozen=True)
class Widths:
    """How many ways each role of weight is cut in a layout (1: whole on every GPU that holds it). Each group
    of a role is a block of consecutive GPUs of a stage (a replica's GPUs in turn, for vLLM's experts)."""
    attention: int  # q/k/v/o, MLA's per-head projections, the mixers
    dense: int  # dense MLPs
    experts: int  # each routed expert
    ep: int  # GPUs the routed experts are spread over (1: no expert parallelism)
    embed: int  # embedding rows
    lm_head: int  # lm_head rows
    shared: int  # shared experts

    def of(self, role: str) -> int:
        """The width of a plan's role (ParamPlan.role); replicated weights are whole at any width."""
        return getattr(self, role) if role in ROLES else self.attention

    def rank(self, role: str, flat: int) -> int:
        """A GPU's rank in its group of this role; flat = dp index x tp + tp index."""
        return flat % self.of(role)

    def ep_rank(self, flat: int) -> int:
        """A GPU's expert-parallel rank: which share of the routed experts it holds."""
        return flat // self.experts % self.ep


ROLES = ("attention", "dense", "experts", "embed", "lm_head", "shared")
# SGLang's spelling of the layout fields vLLM has no counterpart for
CARVED_FLAGS = {"attn_dp": "--attn-dp-size", "ep_size": "--ep N below tp × dp",
                "dense_tp1": "--moe-dense-tp-size 1",
                "dp_lm_head": "--enable-dp-lm-head", "shared_tp1": "SGLANG_SHARED_EXPERT_TP1"}


@dataclass(frozen=True)
class Flags:
    """The engine's own spelling of a layout, for the launch line users copy."""
    command: str  # "vllm serve {model}"
    tp: str
    pp: str = ""
    dp: str = ""
    ep: str = ""
    placement: str = ""


@dataclass(frozen=True)
class RuleSet:
    """One engine version's rules; `name` is what users pass (--rules, ?rules=)."""
    name: str
    engine: str
    version: str
    note: str  # what sets it apart, one line (UI, CLI, JSON)
    flags: Flags
    replicate_kv: bool = True  # tp past the KV heads (a multiple of them) copies each KV head to tp / kv GPUs
    vocab_padding: int = 64  # the vocabulary is padded to a multiple of this before it is split (0: never)
    fp8_merged_exempt: bool = True  # merged layers skip the create-time FP8 block check (vLLM >= 0.14)
    fp8_moe_refine: bool = True  # an FP8 MoE slice off the block gets r x r scale blocks (vLLM >= 0.29)
    fp8_merged_at_tp1: bool = False  # merged layers' FP8 block check runs at tp 1 too (SGLang)
    refuses_desc_act: bool = True  # GPTQ act-order (desc_act) refused at any tp (vLLM >= 0.30)
    gptq_act_order_split: bool = False  # act-order row layers keep every group's scales whole (vLLM <= 0.29)
    model_checks: bool = True  # the engine's model files add their own checks (Qwen MoE: tp <= experts)
    tp_only: bool = False  # runs tensor parallelism alone: no pipeline stages, replicas or expert parallelism
    max_tp: int = MAX_TP  # the engine's own limit on tp
    # the model_types its engine builds (None: every architecture mapped)
    serves: tuple[str, ...] | None = None
    # how the lm_head's vocabulary blocks are joined: all-gather, or gather to GPU 0
    logits: str = "all-gather"
    hybrid_pages: bool = True  # hybrid models' cache pages are sized to the recurrent state
    pp_env: str = "VLLM_PP_LAYER_PARTITION"  # the environment variable that overrides the layer partition
    placements: tuple[str, ...] = ("linear", "round_robin")
    carves: bool = False  # attention DP and expert parallelism are carved out of tp (SGLang's Layout fields)
    # a MoE layer gathers every data-parallel replica's tokens (vLLM); SGLang's --dp-size replicas hold every
    # expert each and exchange nothing
    dp_moe_exchange: bool = True
    notes: dict[str, str] = field(default_factory=dict)  # messages keyed by situation
    registry: str = ""  # the vLLM release whose model registry refuses the architectures retired before it
    # the sequences one engine (a DP replica) decodes at once by default, on large GPUs and on the rest
    max_num_seqs: tuple[int, int] | None = None  # None: only the KV room limits them

    @property
    def label(self) -> str:
        """'vLLM 0.33', 'nano-vllm': what the views call it."""
        return f"{self.engine} {self.version}".strip()

    def kv_split(self, total_num_kv_heads: int, tp_size: int) -> tuple[int, int]:
        """(KV heads per rank, ranks sharing each KV head); replicated when tp_size is a multiple of them."""
        if total_num_kv_heads % tp_size == 0:
            return total_num_kv_heads // tp_size, 1
        head = f"num_key_value_heads={total_num_kv_heads} is not divisible by tp_size={tp_size}"
        if not self.replicate_kv:
            hint = " (rules='vllm' would replicate them)" if tp_size % total_num_kv_heads == 0 else ""
            raise TPSizeError(f"{head}; {self.label} rules never replicate KV heads{hint}")
        if tp_size % total_num_kv_heads:
            raise TPSizeError(f"{head}, and tp_size is not a multiple of it")
        return 1, tp_size // total_num_kv_heads

    def padded_vocab(self, vocab_size: int, tp: int = 1) -> int:
        """Vocabulary rows the embedding and lm_head allocate in total, cut tp ways (vLLM: the same at any
        tp)."""
        if not self.vocab_padding:
            return vocab_size
        return -(-vocab_size // self.vocab_padding) * self.vocab_padding

    def vocab_rows(self, vocab_size: int, tp_size: int) -> int:
        """Rows of the vocabulary each rank holds, or one line saying why it does not split."""
        if not self.vocab_padding:
            return divide(vocab_size, tp_size, "vocab_size")
        padded = self.padded_vocab(vocab_size)
        if padded % tp_size:
            raise TPSizeError(f"vocab_size={vocab_size}, padded to a multiple of "
                              f"{self.vocab_padding} ({padded}), is not divisible by tp_size={tp_size}")
        return padded // tp_size

    def tp_warnings(self, tp_size) -> list[str]:
        """What the engine would not start at this tp, though its layer classes split it."""
        if isinstance(tp_size, int) and tp_size > self.max_tp:
            return [self.notes["max_tp"].format(max_tp=self.max_tp)]
        return []

    def caps_window(self, spec) -> bool:
        """Whether a sliding-window layer's cache holds its window alone (vLLM's hybrid KV cache manager), or
        every token of the context like any layer."""
        return True

    def joint_reduce(self, spec) -> bool:
        """Whether a layer's attention and MLP outputs are summed, then all-reduced once (Falcon, Cohere)."""
        return spec.joint_reduce

    def dense_replicated(self, arch) -> str:
        """Why the engine keeps the dense MLP whole on every GPU (no all-reduce), or ''."""
        return arch.dense_replicated

    def router_fp32(self, arch) -> bool:
        """Whether the engine builds the MoE router (and its score bias) in float32."""
        return arch.router_fp32

    def qkv_order(self, arch) -> str:
        """The order a fused q/k/v is loaded in where the engine's file differs from the record's ('')."""
        return ""

    def regroups_qkv(self, arch) -> bool:
        """Whether the forward all-gathers q/k/v and cuts it again by KV group (vLLM's InternLM2)."""
        return arch.regroups_qkv

    def own_notes(self, spec) -> list[str]:
        """The spec's notes that hold for this engine (one may name another engine's path to the model)."""
        return spec.notes

    def tower_notes(self, spec) -> list[str]:
        """What the map says of a vision tower this engine's rules leave out (none: the map draws it)."""
        return []

    def model_notes(self, model_type: str) -> list[str]:
        """What the engine would not run about this model at all (one line each)."""
        if self.serves is not None and model_type not in self.serves:
            return [self.notes["serves"].format(model_type=model_type or "this model")]
        return []

    def layout_problem(self, layout: Layout, spec=None) -> str | None:
        """What the engine cannot run about the layout's shape (and, given the spec, about this model in it),
        else None."""
        if carved := layout.carved:
            return (f"{self.label} has no {', '.join(CARVED_FLAGS[k] for k in carved)}: that layout is "
                    "SGLang's (rules='sglang'); here attention DP is --data-parallel-size and expert "
                    "parallelism spans tp × dp")
        if self.tp_only and (layout.pp > 1 or layout.dp > 1 or layout.ep):
            return self.notes["tp_only"]
        cls = architecture(getattr(spec, "config", None) or {})
        if self.registry and (last := retired_in(cls, self.registry)):
            return f"vLLM served {cls} until {last}; {self.label} refuses it (\"not supported anymore\")"
        arch = getattr(spec, "arch", None)  # the model file's own layout rules (Kimi-Linear's)
        if arch is not None and not arch.pp and layout.pp > 1 and self.registry:
            return (f"{self.label}'s {cls or arch.hf_class} does not support pipeline parallelism (no "
                    "SupportsPP): use --pipeline-parallel-size 1")
        return arch.layout_problem(layout, spec) if arch is not None and arch.layout_problem else None

    def widths(self, layout: Layout, arch=None) -> Widths:
        """vLLM: every layer is cut over the replica's tp GPUs; the routed experts over tp x dp, or kept whole
        and spread over those GPUs with expert parallelism."""
        tp, ep = layout.tp, layout.tp * layout.dp if layout.ep else 1
        return Widths(tp, tp, 1 if layout.ep else tp * layout.dp, ep, tp, tp, tp)

    def mla_fused_a(self, arch) -> str:
        """The engine's own table for MLA's two latent projections, where it does not merge them as vLLM's
        fused_qkv_a_proj ('')."""
        return ""

    def param_name(self, arch, name: str) -> str:
        """The engine's name for a parameter the plan names as vLLM does (the same layout, its own name)."""
        return name

    def load_problem(self, layout: Layout, spec) -> str | None:
        """What the engine refuses after every weight has loaded (a check over the whole model), else None."""
        return None

    def running_cap(self, gpu) -> int | None:
        """The default cap on sequences one engine worker runs at once on this GPU type (vLLM 0.33
        EngineArgs.get_batch_defaults: 1024 on GPUs of 70 GiB or more but A100, else 256; SGLang: 4096)."""
        if self.max_num_seqs is None:
            return None
        large, small = self.max_num_seqs
        return large if gpu.mem_gib >= 70 and not gpu.name.startswith("a100") else small

    def head_on_every_stage(self, arch) -> bool:
        """Whether every pipeline stage allocates the lm_head (vLLM: the last alone, unless the model file
        builds it unguarded: Arch.head_every_stage)."""
        return arch.head_every_stage

    def embed_on_every_stage(self, arch) -> bool:
        """Whether every pipeline stage allocates embed_tokens (vLLM: as the model file builds it, see
        Arch.embed_every_stage; else the first stage alone)."""
        return arch.embed_every_stage

    def layout_notes(self, layout: Layout, spec) -> list[str]:
        """What the engine does differently in this layout that the map draws the same (one line each)."""
        if layout.pp > 1 and self.embed_on_every_stage(spec.arch):
            if self.head_on_every_stage(spec.arch):  # Jamba
                return [f"{self.label} builds embed_tokens and lm_head on every pipeline stage for this "
                        "model (its model file guards neither by stage): each stage holds its slices of both"]
            return [f"{self.label} builds embed_tokens on every pipeline stage for this model (its model "
                    "file has no first-stage guard), so each stage holds its slice of the embedding table"]
        return []

    def cut_note(self, role: str, cut: int, tp: int) -> str:
        """What a refusal says first when a role is cut other than tp ways (the user typed tp and dp)."""
        if role == "experts" and cut not in (1, tp):
            return f"without expert parallelism the experts are cut tp × dp = {cut} ways: "
        return ""

    def pp_partition(self, num_layers: int, pp: int, override: str | None = None) -> list[int]:
        """Layers per stage: the engine's even split (pp_even), or the override ("20,20,21", the environment
        variable pp_env when none is given) as the engine reads it (pp_override)."""
        if pp < 1:
            raise LayoutError(f"pp={pp} must be at least 1")
        if pp > num_layers:
            raise LayoutError(f"pp={pp} is more pipeline stages than the model's {num_layers} layers")
        text = os.environ.get(self.pp_env) if override is None else override
        parts = self.pp_override(text, num_layers, pp) if text else None
        return self.pp_even(num_layers, pp) if parts is None else parts

    def pp_override(self, text: str, num_layers: int, pp: int) -> list[int] | None:
        """The layers per stage an override gives, checked in the engine's words (None: the engine ignores
        it)."""
        try:
            parts = [int(x) for x in text.split(",")]
        except ValueError:
            raise LayoutError(f"{self.pp_env}={text!r} must be comma-separated layer counts") from None
        if len(parts) != pp:
            raise LayoutError(f"{self.pp_env} has {len(parts)} stages but pp={pp}")
        if sum(parts) != num_layers or min(parts) < 0:
            raise LayoutError(f"{self.pp_env} gives {sum(parts)} layers; the model has {num_layers}")
        return parts

    def pp_even(self, num_layers: int, pp: int) -> list[int]:
        """vLLM: an even share, the remainder on the stages before the last."""
        parts = [num_layers // pp] * pp
        for i in range(2, num_layers % pp + 2):
            parts[-i] += 1
        return parts

    def expert_placement(self, num_experts: int, ep_size: int, placement: str = "linear") -> list[list[int]]:
        """The global experts each EP rank holds: an even share, the first ranks one more when they do not
        divide (vLLM's determine_expert_map), in blocks (linear) or dealt out (round_robin)."""
        if placement not in self.placements:
            raise LayoutError(f"expert placement {placement!r}: use one of {', '.join(self.placements)}")
        if ep_size < 1:
            raise LayoutError(f"ep_size={ep_size} must be at least 1")
        base, extra = divmod(num_experts, ep_size)
        out = []
        for rank in range(ep_size):
            if placement == "round_robin":
                out.append(list(range(rank, num_experts, ep_size)))
            else:
                start = rank * base + min(rank, extra)
                out.append(list(range(start, start + base + (1 if rank < extra else 0))))
        return out

    def candidates(self, gpus: int, moe: bool) -> list[Layout]:
        """Every tp x pp x dp = gpus, with and without expert parallelism (the layouts `plan` ranks)."""
        out = []
        for tp in range(1, gpus + 1):
            for pp in range(1, gpus // tp + 1):
                if gpus % (tp * pp) == 0:
                    dp = gpus // (tp * pp)
                    out.append(Layout(tp, pp, dp))
                    if moe and tp * dp > 1:
                        out.append(Layout(tp, pp, dp, True))
        return out

    def launch(self, model: str, layout: Layout, placement: str = "linear") -> str:
        """The engine's launch line for this layout ('vllm serve MODEL --tensor-parallel-size 8 ...')."""
        f = self.flags
        parts = [f.command.format(model=model), f"{f.tp} {layout.tp}"]
        if layout.pp > 1:
            parts.append(f"{f.pp} {layout.pp}")
        if layout.dp > 1:
            parts.append(f"{f.dp} {layout.dp}")
        if layout.ep:
            parts.append(f.ep)
            if placement != self.placements[0]:
                parts.append(f"{f.placement} {placement}")
        return " ".join(parts)

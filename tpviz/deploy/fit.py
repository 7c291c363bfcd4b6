"""Does a map fit on GPUs of a given size: vLLM's usable memory, the fullest GPU's weights, and the KV cache
and recurrent state the rest holds. Numbers only; the views format them."""
import math
import weakref
from dataclasses import dataclass

from tpviz.config.kinds import ATTENTION_KINDS, STATEFUL
from tpviz.errors import TpvizError
from tpviz.deploy.hardware import Topology
from tpviz.deploy.perf import Perf, Speed, Workload
from tpviz.deploy.sizing import Sizer
from tpviz.errors import LayoutError
from tpviz.rules import Layout, RuleSet, ruleset
from tpviz.trace.shardmap import ShardMap

GPU_SIZES_GIB = (24, 40, 48, 80, 141, 192)  # common accelerator memory sizes (nominal)
GPU_UTILIZATION = 0.9  # vLLM's default gpu_memory_utilization


@dataclass
class Fit:
    """One GPU size's answer: what vLLM may use, the fullest GPU's weights, and the KV-cache room left."""
    gpu_bytes: float
    usable: float  # gpu_memory_utilization x memory
    weights: int  # the fullest GPU's weights
    room: float  # usable - weights (negative: the weights alone do not fit)
    # tokens of KV cache the room holds (None when windows or state make it per sequence)
    kv_tokens: int | None
    per_sequence: int  # KV cache + state one sequence of `context` tokens holds on the fullest GPU
    max_sequences: int  # concurrent sequences of `context` tokens that fit
    context: int  # the context sized: the one asked for, capped at the model's max_model_len
    concurrency: int
    note: str | None = None  # why the context was capped

    @property
    def fits(self) -> bool:
        return self.room > 0 and self.max_sequences >= self.concurrency

    @property
    def sequences(self) -> str:
        """'46 concurrent sequences of 8,192 tokens fit', '1 concurrent sequence of 8,192 tokens fits'."""
        one = self.max_sequences == 1
        return (f"{self.max_sequences:,} concurrent sequence{'' if one else 's'} of {self.context:,} tokens "
                f"fit{'s' if one else ''}")


# vLLM (0.28 and 0.33) Platform._align_hybrid_block_size: the attention block grows until its page holds one
# state
HYBRID_PAGES = ("{engine} sizes a hybrid model's cache pages to its recurrent state: an attention "
                "block takes as many tokens as it needs to hold one state's bytes, each "
                "sequence is rounded up to whole blocks and each state padded to a page, so "
                "{engine} holds somewhat fewer sequences than counted here (the rounding weighs "
                "most on short contexts)")


def sizing_notes(spec, rules: RuleSet | str = "vllm") -> list[str]:
    """What the sequence counts leave out for this model under `rules` (one line each): hybrid models'
    pages."""
    kinds = {mx.kind for layer in spec.layers for mx in layer.mixer.parts}  # Falcon-H1: Mamba2 beside
    hybrid = kinds & set(STATEFUL) and kinds & {*ATTENTION_KINDS, "mla"}
    rules = ruleset(rules)
    return [HYBRID_PAGES.format(engine=rules.label)] if hybrid and rules.hybrid_pages else []


def capped_context(spec, context: int) -> tuple[int, str | None]:
    """The context vLLM can serve, capped at the model's max_model_len, and one line saying so when it was."""
    longest = spec.max_model_len
    if longest and context > longest:
        return (longest,
                (f"context {context:,} is past this model's max_model_len {longest:,} (from its config), "
                         "the longest vLLM serves it (nano-vllm caps there too): sized "
                         f"for {longest:,} tokens"))
    return context, None


class FitInputError(TpvizError):
    """GPU memory, utilization, context or concurrency out of range."""


def check_fit_inputs(gpu_gib: float, utilization: float, context: int, concurrency: int = 1) -> None:
    """One line when a sizing input cannot be real (NaN, a negative context, more than all the memory)."""
    for what, value, ok, want in (
            ("GPU memory", gpu_gib, 0 < gpu_gib <= 10_000, "GiB in (0, 10000]"),
            ("gpu_memory_utilization", utilization, 0 < utilization <= 1, "in (0, 1]"),
            ("context", context, isinstance(context, int) and 1 <= context <= 10**9,
             "a whole number of tokens from 1 to 10^9"),
            ("concurrency", concurrency, isinstance(concurrency, int) and 1 <= concurrency <= 10**9,
             "a whole number of sequences from 1 to 10^9")):
        if (isinstance(value, bool) or not isinstance(value, (int, float))
            or not math.isfinite(value) or not ok): raise FitInputError(f"{what} {value!r} must be {want}")


_SIZERS: dict[int, tuple] = {}  # id(map) -> (weak reference to it, its Sizer): each cut is traced once


def _sizer(m: ShardMap) -> Sizer:
    hit = _SIZERS.get(id(m))
    if hit and hit[0]() is m:
        return hit[1]
    if len(_SIZERS) >= 32:
        _SIZERS.clear()
    sizer = Sizer(m.model, m.rules)
    _SIZERS[id(m)] = (weakref.ref(m), sizer)
    return sizer


def fit(m: ShardMap, gpu_gib: float, utilization: float = GPU_UTILIZATION, context: int = 8192,
        concurrency: int = 1, layout=None) -> Fit:
    """Does the model fit on GPUs of gpu_gib GiB at this tp, and how many sequences of `context` tokens. With
    a pp / dp / ep `layout` (parallel.Layout; SGLang's attention DP and EP inside tp too), as the Plan page
    sizes it: the fullest stage's GPU, and sequences across the dp replicas and attention-DP groups."""
    check_fit_inputs(gpu_gib, utilization, context, concurrency)
    context, note = capped_context(m.model, context)
    usable = gpu_gib * 2**30 * utilization
    uniform = not any(r.kv_cache_windowed or r.state_bytes_per_sequence for r in m.ranks)
    if layout is not None and (layout.pp > 1 or layout.dp > 1 or layout.ep or layout.carved):
        r = _sizer(m).row(layout, gpu_gib * 2**30, utilization, context)
        if r.problem:
            raise LayoutError(r.problem)
        return Fit(gpu_gib * 2**30, usable, r.weights, r.room,
                   r.kv_tokens if r.room > 0 and uniform else None,
                   r.per_sequence, r.max_sequences, context, concurrency, note)
    weights = max(r.weight_bytes for r in m.ranks)
    room = usable - weights
    kv = max(r.kv_cache_bytes_per_token for r in m.ranks)
    per_seq = max(r.cache_bytes(context) for r in m.ranks)
    return Fit(gpu_gib * 2**30, usable, weights, room,
               int(room // kv) if room > 0 and kv and uniform else None,
               per_seq, int(room // per_seq) if room > 0 and per_seq else 0, context, concurrency, note)


def speed(m: ShardMap, topology: Topology, workload: Workload, gpu_gib: float,
          utilization: float = GPU_UTILIZATION, layout=None) -> Perf | None:
    """The speed bound of this map's layout (plain TP at its tp unless given) on the topology's GPUs (of
    gpu_gib each) at the workload; None where it does not fit or its traffic is not modelled."""
    sizer, layout = _sizer(m), layout or Layout(m.tp_size)
    return Speed(sizer, topology, workload).perf(sizer.row(layout, gpu_gib * 2**30, utilization,
                                                            workload.context))

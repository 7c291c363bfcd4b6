"""The plan's data model and the builders every architecture shares.

A ParamPlan says how to build one rank's layer (at probe size) and which checkpoint tensors its
weight_loader receives. Checkpoint names follow each architecture's Hugging Face layout.
"""
import threading
from dataclasses import dataclass, field
from typing import Callable

import torch

from tpviz.layers.linear import copy_checked
from tpviz.layers import (ColumnParallelLinear, LayerNorm, MergedColumnParallelLinear,
                          ParallelLMHead, ReplicatedLinear,
                          RMSNorm, RowParallelLinear, VocabParallelEmbedding)
from tpviz.rules import divide

PROBE = 1  # size kept for the dimension that is not split: cost follows tensors x tp, not parameters
DT = torch.float64  # exact integer tags up to 2**53
# a ColumnParallelLinear built with gather_output=True (its cut is a plain column's; its output is whole)
GATHERED = "gather_output=True: each GPU computes its rows, then all-gathers the whole output"
FP32 = 4  # bytes of a float32 parameter: the recurrent mixers' A_log and conv weights vLLM keeps in float32


@dataclass
class Source:
    """One checkpoint tensor fed to a weight_loader.

    dim is the split dim on disk when it differs from the parameter's (GPT-2's Conv1D weights are stored
    transposed); prepare is what the model's load_weights does to the tensor before the weight_loader
    (a transpose, GPT-NeoX's per-head q/k/v reorder). sections name the tensor's parts along dim.
    """
    name: str
    shape: tuple
    shard_id: str | int | None = None
    split: bool = True  # False: every rank receives it whole
    dim: int | None = None
    prepare: Callable[[torch.Tensor], torch.Tensor] | None = None
    sections: list = field(default_factory=list)  # [label, start, stop, head_size or 0, head word]
    # the shape stored on disk when the map draws it otherwise (gpt-oss's stacked experts)
    disk: tuple | None = None


class LazyClass:
    """A plan's layer class, read off the module it builds at tp 1 the first time it is asked for; the trace
    sets it from the module it builds anyway (the class does not depend on tp), saving one build a plan."""
    def __set_name__(self, owner, name):
        self.key = f"_{name}"

    def __get__(self, plan, owner=None) -> str:
        if plan is None:
            return ""  # the dataclass's default
        if not plan.__dict__.get(self.key):
            plan.__dict__[self.key] = class_name(plan.build)
        return plan.__dict__[self.key]

    def __set__(self, plan, value: str) -> None:
        plan.__dict__[self.key] = value


@dataclass
class ParamPlan:
    """One local parameter: how to build it on a rank, and which checkpoint tensors load into it."""
    name: str
    family: str
    build: Callable[[int, int], tuple]  # (tp_size, tp_rank) -> (module, param)
    shape: tuple  # full logical shape; the traced dim's local size comes from the built param
    tp_dim: int  # the dim that is traced (split dim, or 0 for replicated params)
    sources: list[Source]
    layers: list[int] | None = None
    experts: int = 0
    quantity: tuple | None = None  # (config key, value) named when tp does not divide it
    note: str = ""
    layer_class: str = LazyClass()  # type: ignore[assignment]
    split: bool = True
    by_rank: bool = False  # whole, yet loaded differently by rank (gpt-oss's MXFP4 down bias: GPU 0 alone)
    element_bytes: int = 0  # bytes per stored element (0: the model dtype); quantized tensors set their own
    tower: str = ""  # "vision": a part of the vision tower (plan/tower.py), held by the first stage alone
    blocks: int = 0  # a tower tensor's copies, one per block ('*' in its name is the block, not a layer)
    # per layer, what fills the name's two '*' when the layer's copy is stored under another layer (Zamba2)
    stored_at: list = field(default_factory=list)
    # the layers that run the copies, where more than hold them (Zamba2's shared blocks: every hybrid layer)
    runs: list[int] | None = None

    @property
    def role(self) -> str:
        """What the engine cuts it as: attention, dense, shared, experts, embed, lm_head or replicated."""
        if self.family in ("gate_up", "down_proj"):
            return "shared" if ".shared_expert" in self.name else "dense"
        if self.family in ("experts", "embed", "lm_head", "replicated"):
            return self.family
        return "attention"  # q/k/v, o_proj and the mixers

    def read_class(self, module) -> None:
        """The layer class from a module built anyway, where no one has asked for it yet."""
        if not self.__dict__.get("_layer_class"):
            self.layer_class = type(module).__name__

    @property
    def run_layers(self) -> list[int] | None:
        """The layers whose forward pass reads and multiplies this parameter."""
        return self.layers if self.runs is None else self.runs

    @property
    def count(self) -> int:
        """How many copies of this parameter the model has (layers x experts)."""
        return (len(self.layers) if self.layers is not None else max(self.blocks, 1)) * max(self.experts, 1)


def shared(make: Callable[[int, int], object]) -> Callable[[int, int], object]:
    """One module per rank for a layer's weight and bias plans (the tracer refills each parameter it reads, so
    the two need not build it twice); kept for the two tps last asked (a replicated tensor is traced at tp 1
    between split ones), per thread (app sessions are threads that may trace one cached plan at once: a
    module is never filled by two of them)."""
    local = threading.local()

    def get(tp: int, r: int):
        built = local.__dict__.setdefault("built", {})
        if tp not in built:
            if len(built) == 2:
                del built[next(iter(built))]
            built[tp] = {}
        if r not in built[tp]:
            built[tp][r] = make(tp, r)
        return built[tp][r]
    return get


def class_name(build) -> str:
    module, _ = build(1, 0)
    return type(module).__name__


def param(name, family, build, shape, sources, tp_dim=0, heads=0, **kw) -> ParamPlan:
    """A ParamPlan whose layer class is read off the module it builds."""
    if heads:  # layers that split h*size as a whole must still not cut a head in two
        build = (lambda b: lambda tp, r: (divide(heads, tp, "num_attention_heads"), b(tp, r))[1])(build)
    # built once per rank: the validity check's rank 0 is the trace's, a tp-1 class read a replicated trace's
    plan = ParamPlan(name, family, shared(build), tuple(shape), tp_dim, sources, **kw)  # class read lazily
    plan.split = all(src.split for src in sources)
    return plan


def norm(prefix, size, layers=None, bias: bool | str = False) -> list[ParamPlan]:
    """A replicated norm: RMSNorm, or LayerNorm with weight and bias (bias="weight": a LayerNorm of weight
    alone, Cohere's)."""
    out = []
    make = (lambda: LayerNorm(size, dtype=DT, bias=bias is True)) if bias else \
        (lambda: RMSNorm(size, dtype=DT))
    for suffix in ("weight", "bias") if bias is True else ("weight",):
        name = f"{prefix}.{suffix}"
        build = (lambda s: lambda tp, r: (lambda m: (m, getattr(m, s)))(make()))(suffix)
        out.append(param(name, "replicated", build, (size,),
                         [Source(name, (size,), split=False)], layers=layers))
    return out


def replicated(name, out, inp, layers=None, experts=0, note="", bias=False,
               q=None) -> ParamPlan | list[ParamPlan]:
    if q is not None:  # a quantized replicated layer (MLA latents): its stored tensors, whole on every GPU
        make = lambda ctx, tp, r: ReplicatedLinear(PROBE, out, dtype=DT, quant=ctx)
        return stored(q, False, make, [(name.removesuffix(".weight"), out, None)], out, inp, "replicated",
                      name.removesuffix(".weight"), whole=True, layers=layers, experts=experts, note=note)

    def build(tp, r):
        m = ReplicatedLinear(PROBE, out, bias=bias, dtype=DT)
        return m, (m.bias if bias else m.weight)
    shape = (out,) if bias else (out, inp)
    return param(name, "replicated", build, shape, [Source(name, shape, split=False)], layers=layers,
                 experts=experts, note=note)


def _holder(shape: tuple):
    """A replicated parameter of this exact shape (what every GPU holds of a whole-copied quantization
    tensor)."""
    def build(tp, r):  # traced along dim 0, probe-wide elsewhere
        m = ReplicatedLinear(PROBE, shape[0], bias=len(shape) == 1, dtype=DT)
        p = m.bias if len(shape) == 1 else m.weight
        # each part: the same copy
        p.weight_loader = lambda param, loaded, *shard: copy_checked(param.data, loaded)
        return m, p
    return build


def stored(q, row: bool, make, parts: list[tuple], out: int, inp: int, family: str, name: str, slots: int = 1,
           whole: bool = False, sections: list | None = None, **kw) -> list[ParamPlan]:
    """One ParamPlan per tensor a quantized layer stores. parts: (checkpoint prefix, rows, shard id) per
    logical part (one for a plain layer, gate/up or q/k/v for merged ones); make(ctx) builds the layer."""
    plans, layer = [], shared(lambda tp, r: make(q.ctx(row), tp, r))  # one layer for all its tensors
    for qt in q.tensors(row):
        dim = (qt.in_dim if qt.in_split else None) if row else qt.out_dim
        build = (lambda t: lambda tp, r: (lambda m: (m, getattr(m, t.name)))(layer(tp, r)))(qt)
        replicated_ = qt.per_shard or dim is None or whole
        if dim is None and not qt.per_shard and not whole:  # held whole and sized by a probed dim ([K] g_idx,
            build = _holder(qt.shape(out, inp))  # a row layer's [N, 1] channel scales): traced at full size
        if replicated_:  # replicated: per-tensor scales (one slot per part), weight_shape
            sources = [Source(f"{p}.{qt.name}", qt.shape(n, inp), sid, split=False) for p, n, sid in parts]
            shape = (slots,) if qt.per_shard else qt.shape(out, inp)
        else:  # a tensor in whole output rows keeps the parts' sections (q/k/v heads of a fused qkv)
            secs = sections if sections and not row and qt.out_unit == 1 else []
            sources = [Source(f"{p}.{qt.name}", qt.shape(n, inp), sid, sections=secs) for p, n, sid in parts]
            shape = qt.shape(out, inp)
        note = " · ".join(filter(None, [kw.get("note", ""), qt.note]))
        plan = param(f"{name}.{qt.name}", family, build, shape, sources, tp_dim=0 if replicated_ else dim,
                     element_bytes=qt.element_bytes(q.model_bytes), **{**kw, "note": note})
        # the owning layer's class
        plan.layer_class = class_name(lambda tp, r: (layer(tp, r), None))
        plans.append(plan)
    return plans


def row(prefix, inp, out, family, layers, bias, quantity, experts=0, note="", heads=0, disk_t=False,
        q=None) -> list[ParamPlan]:
    """A row-parallel weight (and its bias, held whole); disk_t: stored transposed ([in, out], Conv1D)."""
    w = f"{prefix}.weight"
    if q is not None:
        make = lambda ctx, tp, r: RowParallelLinear(inp, PROBE, tp, r, dtype=DT, quant=ctx)
        plans = stored(q, True, make, [(prefix, out, None)], out, inp, family, prefix,
                       layers=layers, experts=experts, quantity=quantity, note=note, heads=heads)
        return (plans
                + (row(prefix, inp, out, family, layers, bias, quantity, experts, note)[1:] if bias else []))
    build = lambda tp, r: (lambda m: (m, m.weight))(RowParallelLinear(inp, PROBE, tp, r, dtype=DT))
    src = Source(w, (inp, out), dim=0, prepare=torch.t) if disk_t else Source(w, (out, inp))
    plans = [param(w, family, build, (out, inp), [src], tp_dim=1, layers=layers,
                   experts=experts, quantity=quantity, note=note, heads=heads)]
    if bias:  # input_size=tp keeps the (irrelevant) weight tiny while the bias is real size
        b = f"{prefix}.bias"
        bb = lambda tp, r: (lambda m: (m, m.bias))(RowParallelLinear(tp, out, tp, r, bias=True, dtype=DT))
        plans.append(param(b, "replicated", bb, (out,), [Source(b, (out,), split=False)], layers=layers,
                           experts=experts,
                           note="row-parallel bias: every rank holds it, only rank 0 adds it"))
    return plans


def column(prefix, inp, out, family, layers, bias, quantity, experts=0, note="", heads=0,
           disk_t=False, q=None) -> list[ParamPlan]:
    """A column-parallel weight (and bias); disk_t: the weight is stored transposed ([in, out], Conv1D)."""
    if q is not None:
        make = lambda ctx, tp, r: ColumnParallelLinear(PROBE, out, tp, r, dtype=DT, quant=ctx)
        plans = stored(q, False, make, [(prefix, out, None)], out, inp, family, prefix, layers=layers,
                       experts=experts, quantity=quantity, note=note, heads=heads)
        return plans + (column(prefix, inp, out, family, layers, bias, quantity, experts, note, heads)[1:]
                        if bias else [])
    plans, layer = [], shared(lambda tp, r: ColumnParallelLinear(PROBE, out, tp, r, bias=bias, dtype=DT))
    for suffix, shape in (("weight", (out, inp)),) + ((("bias", (out,)),) if bias else ()):
        name = f"{prefix}.{suffix}"
        build = lambda tp, r, s=suffix: (lambda m: (m, getattr(m, s)))(layer(tp, r))
        src = (Source(name, (inp, out), dim=1, prepare=torch.t) if disk_t and suffix == "weight"
               else Source(name, shape))
        plans.append(param(name, family, build, shape, [src], layers=layers, experts=experts,
                           quantity=quantity, note=note, heads=heads))
    return plans


def merged(name, parts, fused, inp, sizes, family, layers, quantity, experts=0, bias=False, note="",
           labels=("gate", "up"), q=None, whole=False) -> list[ParamPlan]:
    """gate_up_proj (or any merged column table): parts are the separate checkpoint tensors, fused the on-disk
    one. whole: the table is not split (vLLM's disable_tp, MLA's fused_qkv_a_proj): every rank builds it as
    tp 1."""
    cut = (lambda tp, r: (1, 0)) if whole else (lambda tp, r: (tp, r))
    if q is not None:
        make = lambda ctx, tp, r: MergedColumnParallelLinear(PROBE, sizes, *cut(tp, r), dtype=DT, quant=ctx)
        on_disk = ([(fused, sum(sizes), None)] if fused else
                   [(p, n, i) for i, (p, n) in enumerate(zip(parts, sizes))])
        plans = stored(q, False, make, on_disk, sum(sizes), inp, family, name, whole=whole,
                       slots=len(sizes), layers=layers, experts=experts, quantity=quantity, note=note)
        return plans + (merged(name, parts, fused, inp, sizes, family, layers, quantity, experts, bias, note,
                               labels, whole=whole)[1:] if bias else [])
    plans = []
    layer = shared(lambda tp, r: MergedColumnParallelLinear(PROBE, sizes, *cut(tp, r), bias=bias, dtype=DT))
    for suffix in ("weight", "bias") if bias else ("weight",):
        def build(tp, r, s=suffix):
            m = layer(tp, r)
            return m, getattr(m, s)
        tail = (inp,) if suffix == "weight" else ()
        if fused:
            starts = [sum(sizes[:i]) for i in range(len(sizes) + 1)]
            secs = [[lab, a, b, 0, ""] for lab, a, b in zip(labels, starts, starts[1:])]
            sources = [Source(f"{fused}.{suffix}", (sum(sizes),) + tail, None, sections=secs)]
        else:
            sources = [Source(f"{p}.{suffix}", (n,) + tail, i, split=not whole)
                       for i, (p, n) in enumerate(zip(parts, sizes))]
        plans.append(param(f"{name}.{suffix}", family, build, (sum(sizes),) + tail, sources, layers=layers,
                           experts=experts, quantity=quantity, note=note))
    return plans


def embed(spec, names, rules) -> list[ParamPlan]:
    """embed_tokens and lm_head: vocab-parallel (lm_head absent when tied)."""
    v, hidden = spec.vocab_size, spec.hidden_size
    plans = []
    for name, cls, family in ((names.embed, VocabParallelEmbedding, "embed"),
                              (names.lm_head, ParallelLMHead, "lm_head")):
        if family == "lm_head" and spec.tie_word_embeddings:
            continue
        build = lambda tp, r, c=cls: (lambda m: (m, m.weight))(c(v, PROBE, tp, r, rules=rules, dtype=DT))
        note = "tied: lm_head reuses this matrix" if spec.tie_word_embeddings and family == "embed" else ""
        plans.append(param(name, family, build, (v, hidden), [Source(name, (v, hidden))], note=note,
                           quantity=("vocab_size", v)))
    if "head_bias" in spec.arch.extra and not spec.tie_word_embeddings:  # PhiMoE: cut like the head's rows
        b = names.lm_head.replace(".weight", ".bias")
        build = lambda tp, r: (lambda m: (m, m.bias))(ParallelLMHead(v, PROBE, tp, r, rules=rules, dtype=DT,
                                                                     bias=True))
        plans.append(param(b, "lm_head", build, (v,), [Source(b, (v,))], quantity=("vocab_size", v)))
    return plans

"""Which layer class holds each checkpoint tensor of an architecture, as data the tracer executes.

A ParamPlan says how to build one rank's layer (at probe size) and which checkpoint tensors its
weight_loader receives. Checkpoint names follow each architecture's Hugging Face layout.
"""
from dataclasses import dataclass, replace
from typing import Callable

import torch

from tpviz.layers import (ColumnParallelLinear, MergedColumnParallelLinear, ParallelLMHead, QKVParallelLinear,
                          ReplicatedLinear, RMSNorm, RowParallelLinear, VocabParallelEmbedding)
from tpviz.rules import divide
from tpviz.spec import ModelSpec

PROBE = 1  # size kept for the dimension that is not split: cost follows tensors x tp, not parameters
DT = torch.float64  # exact integer tags up to 2**53


@dataclass(frozen=True)
class Names:
    """Checkpoint names of one architecture; '*' is the layer (or expert) index."""
    embed: str = "model.embed_tokens.weight"
    lm_head: str = "lm_head.weight"
    final_norm: str = "model.norm.weight"
    layer: str = "model.layers.*."
    norms: tuple = ("input_layernorm", "post_attention_layernorm")
    q: str = "self_attn.q_proj"
    k: str = "self_attn.k_proj"
    v: str = "self_attn.v_proj"
    o: str = "self_attn.o_proj"
    qkv_fused: str | None = None  # fused on disk (Phi-3): loaded with loaded_shard_id=None
    q_norm: str = "self_attn.q_norm"
    k_norm: str = "self_attn.k_norm"
    gate: str = "mlp.gate_proj"
    up: str = "mlp.up_proj"
    down: str = "mlp.down_proj"
    gate_up_fused: str | None = None
    router: str = "mlp.gate"
    experts: str = "mlp.experts.*."
    expert_gate_up: tuple = ("gate_proj", "up_proj")
    expert_down: str = "down_proj"
    shared: str = "mlp.shared_expert."
    shared_gate: str | None = None


LLAMA = Names()
GEMMA2 = replace(LLAMA, norms=("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                               "post_feedforward_layernorm"))
ARCH_NAMES = {
    "phi3": replace(LLAMA, qkv_fused="self_attn.qkv_proj", gate_up_fused="mlp.gate_up_proj"),
    "mixtral": replace(LLAMA, router="block_sparse_moe.gate", experts="block_sparse_moe.experts.*.",
                       expert_gate_up=("w1", "w3"), expert_down="w2"),
    "qwen2_moe": replace(LLAMA, shared_gate="mlp.shared_expert_gate"),
    "deepseek_v3": replace(LLAMA, shared="mlp.shared_experts."),
    "deepseek_v2": replace(LLAMA, shared="mlp.shared_experts."),
    "gemma2": GEMMA2, "gemma3": GEMMA2, "gemma3_text": GEMMA2,
    "gpt_oss": replace(LLAMA, router="mlp.router", experts="mlp.experts.", expert_gate_up=("gate_up_proj",)),
    "chatglm": replace(LLAMA, embed="transformer.embedding.word_embeddings.weight",
                       lm_head="transformer.output_layer.weight", final_norm="transformer.encoder.final_layernorm.weight",
                       layer="transformer.encoder.layers.*.", qkv_fused="self_attention.query_key_value",
                       o="self_attention.dense", gate_up_fused="mlp.dense_h_to_4h", down="mlp.dense_4h_to_h"),
}


@dataclass
class Source:
    """One checkpoint tensor fed to a weight_loader."""
    name: str
    shape: tuple
    shard_id: str | int | None = None
    split: bool = True  # False: every rank receives it whole


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
    layer_class: str = ""
    split: bool = True

    @property
    def count(self) -> int:
        """How many copies of this parameter the model has (layers x experts)."""
        return (len(self.layers) if self.layers is not None else 1) * max(self.experts, 1)


def _class_name(build) -> str:
    module, _ = build(1, 0)
    return type(module).__name__


def _param(name, family, build, shape, sources, tp_dim=0, heads=0, **kw) -> ParamPlan:
    if heads:  # layers that split h*size as a whole must still not cut a head in two
        build = (lambda b: lambda tp, r: (divide(heads, tp, "num_attention_heads"), b(tp, r))[1])(build)
    plan = ParamPlan(name, family, build, tuple(shape), tp_dim, sources, **kw)
    plan.layer_class = _class_name(build)
    plan.split = all(src.split for src in sources)
    return plan


def _norm(name, size, layers=None, family="replicated") -> ParamPlan:
    build = lambda tp, r: (lambda m: (m, m.weight))(RMSNorm(size, dtype=DT))
    return _param(name, family, build, (size,), [Source(name, (size,), split=False)], layers=layers)


def _replicated(name, out, inp, layers=None, experts=0, note="", bias=False) -> ParamPlan:
    def build(tp, r):
        m = ReplicatedLinear(PROBE, out, bias=bias, dtype=DT)
        return m, (m.bias if bias else m.weight)
    shape = (out,) if bias else (out, inp)
    return _param(name, "replicated", build, shape, [Source(name, shape, split=False)], layers=layers,
                  experts=experts, note=note)


def _row(prefix, inp, out, family, layers, bias, quantity, experts=0, note="", heads=0) -> list[ParamPlan]:
    w = f"{prefix}.weight"
    build = lambda tp, r: (lambda m: (m, m.weight))(RowParallelLinear(inp, PROBE, tp, r, dtype=DT))
    plans = [_param(w, family, build, (out, inp), [Source(w, (out, inp))], tp_dim=1, layers=layers,
                    experts=experts, quantity=quantity, note=note, heads=heads)]
    if bias:  # input_size=tp keeps the (irrelevant) weight tiny while the bias is real size
        b = f"{prefix}.bias"
        bb = lambda tp, r: (lambda m: (m, m.bias))(RowParallelLinear(tp, out, tp, r, bias=True, dtype=DT))
        plans.append(_param(b, "replicated", bb, (out,), [Source(b, (out,), split=False)], layers=layers,
                            experts=experts, note="row-parallel bias: every rank holds it, only rank 0 adds it"))
        plans[-1].layer_class = "RowParallelLinear"
    return plans


def _column(prefix, inp, out, family, layers, bias, quantity, experts=0, note="", heads=0) -> list[ParamPlan]:
    plans = []
    for suffix, shape in (("weight", (out, inp)),) + ((("bias", (out,)),) if bias else ()):
        name = f"{prefix}.{suffix}"
        build = lambda tp, r, s=suffix: (lambda m: (m, getattr(m, s)))(
            ColumnParallelLinear(PROBE, out, tp, r, bias=bias, dtype=DT))
        plans.append(_param(name, family, build, shape, [Source(name, shape)], layers=layers, experts=experts,
                            quantity=quantity, note=note, heads=heads))
    return plans


def _merged(param, parts, fused, inp, sizes, family, layers, quantity, experts=0, bias=False, note=""):
    """gate_up_proj (or any merged column table): parts are the separate checkpoint tensors, fused the on-disk one."""
    plans = []
    for suffix in ("weight", "bias") if bias else ("weight",):
        def build(tp, r, s=suffix):
            m = MergedColumnParallelLinear(PROBE, sizes, tp, r, bias=bias, dtype=DT)
            return m, getattr(m, s)
        tail = (inp,) if suffix == "weight" else ()
        if fused:
            sources = [Source(f"{fused}.{suffix}", (sum(sizes),) + tail, None)]
        else:
            sources = [Source(f"{p}.{suffix}", (n,) + tail, i) for i, (p, n) in enumerate(zip(parts, sizes))]
        plans.append(_param(f"{param}.{suffix}", family, build, (sum(sizes),) + tail, sources, layers=layers,
                            experts=experts, quantity=quantity, note=note))
    return plans


def _qkv(spec: ModelSpec, names: Names, rules: str, layers) -> list[ParamPlan]:
    h, kv, d, hidden = spec.num_attention_heads, spec.num_key_value_heads, spec.head_dim, spec.hidden_size
    p = names.layer
    plans = []
    for suffix in ("weight", "bias") if spec.attention_bias else ("weight",):
        def build(tp, r, s=suffix):
            m = QKVParallelLinear(PROBE, d, h, kv, tp, r, bias=spec.attention_bias, rules=rules, dtype=DT)
            return m, getattr(m, s)
        tail = (hidden,) if suffix == "weight" else ()
        if names.qkv_fused:
            sources = [Source(f"{p}{names.qkv_fused}.{suffix}", ((h + 2 * kv) * d,) + tail, None)]
        else:
            sources = [Source(f"{p}{n}.{suffix}", ((h if sid == "q" else kv) * d,) + tail, sid)
                       for sid, n in zip("qkv", (names.q, names.k, names.v))]
        param = f"{p}{(names.qkv_fused or 'self_attn.qkv_proj')}.{suffix}"
        plans.append(_param(param, "qkv", build, ((h + 2 * kv) * d,) + tail, sources, layers=layers))
    return plans


def _embed(spec: ModelSpec, names: Names, rules: str) -> list[ParamPlan]:
    v, hidden = spec.vocab_size, spec.hidden_size
    plans = []
    for name, cls, family in ((names.embed, VocabParallelEmbedding, "embed"), (names.lm_head, ParallelLMHead, "lm_head")):
        if family == "lm_head" and spec.tie_word_embeddings:
            continue
        build = lambda tp, r, c=cls: (lambda m: (m, m.weight))(c(v, PROBE, tp, r, rules=rules, dtype=DT))
        note = "tied: lm_head reuses this matrix" if spec.tie_word_embeddings and family == "embed" else ""
        plans.append(_param(name, family, build, (v, hidden), [Source(name, (v, hidden))], note=note,
                            quantity=("vocab_size", v)))
    return plans


def _mla(spec: ModelSpec, names: Names, layers) -> list[ParamPlan]:
    """DeepSeek multi-head latent attention: the latent down-projections are replicated, the per-head
    up-projections column-split, o_proj row-split (as vLLM does)."""
    p, hidden, h = f"{names.layer}self_attn.", spec.hidden_size, spec.num_attention_heads
    qk, heads = spec.qk_nope_head_dim + spec.qk_rope_head_dim, ("num_attention_heads", h)
    plans = []
    if spec.q_lora_rank:
        plans += [_replicated(f"{p}q_a_proj.weight", spec.q_lora_rank, hidden, layers),
                  _norm(f"{p}q_a_layernorm.weight", spec.q_lora_rank, layers)]
        plans += _column(f"{p}q_b_proj", spec.q_lora_rank, h * qk, "qkv", layers, False, heads, heads=h)
    else:
        plans += _column(f"{p}q_proj", hidden, h * qk, "qkv", layers, False, heads, heads=h)
    plans += [_replicated(f"{p}kv_a_proj_with_mqa.weight", spec.kv_lora_rank + spec.qk_rope_head_dim, hidden, layers,
                          note="MLA latent: every rank computes and caches the compressed KV"),
              _norm(f"{p}kv_a_layernorm.weight", spec.kv_lora_rank, layers)]
    plans += _column(f"{p}kv_b_proj", spec.kv_lora_rank, h * (spec.qk_nope_head_dim + spec.v_head_dim), "qkv",
                     layers, False, heads, heads=h)
    plans += _row(f"{p}o_proj", h * spec.v_head_dim, hidden, "o_proj", layers, False, heads, heads=h)
    return plans


def _moe(spec: ModelSpec, names: Names) -> list[ParamPlan]:
    """Experts: gate/up column-split and down row-split over moe_intermediate_size; router replicated."""
    p, hidden, layers, e, inter = names.layer, spec.hidden_size, spec.moe_layers, spec.num_experts, spec.moe_intermediate_size
    quantity, ex = ("moe_intermediate_size", inter), f"{p}{names.experts}"
    gpt_oss = spec.model_type == "gpt_oss"
    plans = [_replicated(f"{p}{names.router}.weight", e, hidden, layers)]
    if gpt_oss:
        plans.append(_replicated(f"{p}{names.router}.bias", e, hidden, layers, bias=True))
    if spec.model_type.startswith("deepseek"):
        plans.append(_replicated(f"{p}{names.router}.e_score_correction_bias", e, hidden, layers, bias=True))
    if gpt_oss:
        note = ("stored stacked and transposed as [experts, hidden, 2*intermediate] with gate/up interleaved; "
                "shown per expert as [2*intermediate, hidden]: each rank takes one contiguous block of interleaved rows")
        stacked = _column(f"{ex}gate_up_proj", hidden, 2 * inter, "experts", layers, True, quantity, e, note)
        stacked += _row(f"{ex}down_proj", inter, hidden, "experts", layers, True, quantity, e,
                        "stored stacked and transposed as [experts, intermediate, hidden]; shown per expert")
        for plan in stacked:  # the checkpoint's stacked names: gate_up_proj, gate_up_proj_bias, ...
            for src in plan.sources:
                src.name = src.name.replace(".weight", "").replace(".bias", "_bias")
        plans += stacked
    else:
        parts = [f"{ex}{n}" for n in names.expert_gate_up]
        plans += _merged(f"{ex}gate_up_proj", parts, None, hidden, [inter, inter], "experts", layers, quantity, e)
        plans += _row(f"{ex}{names.expert_down}", inter, hidden, "experts", layers, False, quantity, e)
    shared = spec.shared_expert_intermediate_size
    if shared:
        sh, q = f"{p}{names.shared}", ("shared_expert_intermediate_size", shared)
        plans += _merged(f"{sh}gate_up_proj", [f"{sh}gate_proj", f"{sh}up_proj"], None, hidden, [shared, shared],
                         "gate_up", layers, q, note="shared expert")
        plans += _row(f"{sh}down_proj", shared, hidden, "down_proj", layers, False, q, note="shared expert")
    if names.shared_gate:
        plans.append(_replicated(f"{p}{names.shared_gate}.weight", 1, hidden, layers))
    return plans


def build_plan(spec: ModelSpec, rules: str = "vllm") -> list[ParamPlan]:
    """Every local parameter of the model, with the checkpoint tensors each one loads."""
    names = ARCH_NAMES.get(spec.model_type, LLAMA)
    p, hidden, every = names.layer, spec.hidden_size, list(range(spec.num_hidden_layers))
    h, d = spec.num_attention_heads, spec.head_dim
    plans = _embed(spec, names, rules) + [_norm(names.final_norm, hidden)]
    plans += [_norm(f"{p}{n}.weight", hidden, every) for n in names.norms]
    if spec.is_mla:
        plans += _mla(spec, names, every)
    else:
        plans += _qkv(spec, names, rules, every)
        if spec.qk_norm:
            plans += [_norm(f"{p}{n}.weight", d, every) for n in (names.q_norm, names.k_norm)]
        plans += _row(f"{p}{names.o}", h * d, hidden, "o_proj", every, spec.o_proj_bias, ("num_attention_heads", h))
        if spec.model_type == "gpt_oss":  # one attention-sink logit per head, split with the heads
            plans += _column(f"{p}self_attn.sinks", PROBE, h, "qkv", every, True, ("num_attention_heads", h))[1:]
            plans[-1].name = plans[-1].sources[0].name = f"{p}self_attn.sinks"
    dense = spec.dense_layers
    if dense:
        inter, fused = spec.intermediate_size, names.gate_up_fused
        plans += _merged(f"{p}{fused or 'mlp.gate_up_proj'}", [f"{p}{names.gate}", f"{p}{names.up}"],
                         f"{p}{fused}" if fused else None, hidden, [inter, inter], "gate_up", dense,
                         ("intermediate_size", inter), bias=spec.mlp_bias)
        plans += _row(f"{p}{names.down}", inter, hidden, "down_proj", dense, spec.mlp_bias, ("intermediate_size", inter))
    if spec.is_moe:
        plans += _moe(spec, names)
    return plans

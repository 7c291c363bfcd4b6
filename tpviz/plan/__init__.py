"""Which layer class holds each checkpoint tensor of an architecture, as data the tracer executes.

The plan walks the model's layer groups: every distinct mixer (by the dims that decide its tensors)
and every distinct FFN is planned once, for the layers that share it. Everything that needs "which
tensors does this architecture have" (the tracer, the checkpoint comparison) reads the plan.
"""
from dataclasses import replace

from tpviz.config.kinds import Ffn, Mixer
from tpviz.plan import attention, ffn, kda, ssm
from tpviz.plan.classic import extra_globals
from tpviz.plan.core import DT, PROBE, ParamPlan, Source, embed, norm, replicated
from tpviz.archs import Names
from tpviz.plan.kda import state_plans  # plan/ssm.py's stateful groups and KDA's
from tpviz.plan.per_layer import altup_laurel, per_layer_inputs
from tpviz.plan.shared_blocks import zamba2
from tpviz.plan.tower import tower_plans
from tpviz.plan.tower_audio import audio_plans
from tpviz.config.spec import ModelSpec
from tpviz.errors import ConfigError
from tpviz.rules import RuleSet, ruleset

__all__ = ["DT", "PROBE", "ParamPlan", "Source", "Names", "build_plan", "mixer_groups",
           "ffn_groups", "state_plans", "arch_names"]
MIXERS = {"attention": attention.attention, "mla": attention.mla, "gated_deltanet": ssm.gated_deltanet,
          "mamba2": ssm.mamba2, "short_conv": ssm.short_conv, "kda": kda.kda, "mamba1": ssm.mamba1}
FFNS = {"dense": ffn.dense, "moe": ffn.moe}


def arch_names(spec: ModelSpec) -> Names:
    """The checkpoint names of this architecture (Llama's for unknown ones; Falcon's by its decoder
    variant)."""
    arch = spec.arch
    return arch.names_for(spec.variant, spec.num_key_value_heads) if arch.names_for else arch.names


def _by_key(spec: ModelSpec, key) -> dict:
    groups: dict = {}
    for i, layer in enumerate(spec.layers):
        groups.setdefault(key(layer), []).append(i)
    return groups


def mixer_groups(spec: ModelSpec) -> dict[Mixer, list[int]]:
    """Layers whose mixers hold the same tensors (a sliding and a full attention layer do)."""
    return _by_key(spec, lambda layer: layer.mixer.weights)


def ffn_groups(spec: ModelSpec) -> dict[Ffn, list[int]]:
    return _by_key(spec, lambda layer: layer.ffn.__class__(layer.ffn.kind, layer.ffn.size,
                                                           layer.ffn.experts, 0, layer.ffn.shared))


# no real tensor has a dimension this long (Gemma's 262,400-row vocab is the longest a preset has); the probe
# holds the traced one whole, so a config that asks for more is refused before anything is built
# (by the tracer, the planner, the validity table or Run live alike)
MAX_TRACED = 1 << 22


def check_sizes(plans: list[ParamPlan]) -> None:
    """One line for a tensor with an empty or impossibly long dimension (a config's sizes multiplied out: an
    image smaller than its patch, a position table of 2^40 rows)."""
    for plan in plans:
        for shape in (plan.shape, *(src.shape for src in plan.sources)):
            if shape and not (min(shape) > 0 and max(shape) <= MAX_TRACED):
                what = "an empty dimension" if min(shape) <= 0 else f"a dimension longer than {MAX_TRACED:,}"
                dims = " x ".join(map(str, shape))
                raise ConfigError(f"the config makes {plan.sources[0].name} {dims}: {what}, which no real "
                                  "model has")


def build_plan(spec: ModelSpec, rules: RuleSet | str = "vllm") -> list[ParamPlan]:
    """Every local parameter of the model, with the checkpoint tensors each one loads."""
    rules = ruleset(rules)
    plans = _plans(spec, rules)
    for plan in plans:  # the engine's own name for a parameter it builds alike (SGLang's hunyuan.py router)
        plan.name = rules.param_name(spec.arch, plan.name)
    check_sizes(plans)
    return plans


def _plans(spec: ModelSpec, rules: RuleSet) -> list[ParamPlan]:
    """build_plan's plans, before their sizes are checked."""
    names = arch_names(spec)
    if order := rules.qkv_order(spec.arch):  # the engine's file regroups a fused q/k/v its own way
        names = replace(names, qkv_order=order)
    hidden, p, nb = spec.hidden_size, names.layer, names.norm_bias
    # OLMo-1's final norm holds no weight (Names.final_norm "")
    final = norm(names.final_norm, hidden, bias=nb) if names.final_norm else []
    plans = embed(spec, names, rules) + final + extra_globals(spec, names)
    if spec.shared_blocks:  # Zamba2: its layers and shared blocks (and no tower)
        return plans + zamba2(spec, names, rules)
    every = list(range(spec.num_hidden_layers))
    plans += [pl for n in names.block_norms for pl in norm(f"{p}{n}", hidden, every, bias=nb)]
    # Gemma-4: a saved per-layer output scale (a buffer, in the checkpoint)
    if "layer_scalar" in spec.arch.extra:
        plans.append(replicated(f"{p}layer_scalar", 1, hidden, every, bias=True))
    if spec.per_layer_input:  # Gemma-4 E2B / E4B: per-layer input embeddings
        plans += per_layer_inputs(spec, names, rules)
    if spec.altup_inputs:  # Gemma-3n: AltUp and LAuReL
        plans += altup_laurel(spec, names)
    with_mixer = [i for i, layer in enumerate(spec.layers) if layer.mixer.kind != "none"]
    with_ffn = [i for i, layer in enumerate(spec.layers) if layer.ffn.kind != "none"]
    for names_, layers in ((names.mixer_norms, with_mixer), (names.ffn_norms, with_ffn)):
        plans += [pl for n in names_ if layers for pl in norm(f"{p}{n}", hidden, layers, bias=nb)]
    for mixer, layers in mixer_groups(spec).items():
        for part in mixer.parts if mixer.kind != "none" else ():  # Falcon-H1: attention, and Mamba2 beside
            plans += by_quant(spec, lambda ls, m=part: MIXERS[m.kind](spec, names, rules, m, ls), layers)
    for f, layers in ffn_groups(spec).items():
        if f.kind != "none":
            plans += by_quant(spec, lambda ls, f=f: FFNS[f.kind](spec, names, f, ls, rules), layers)
    return plans + tower_plans(spec, rules) + audio_plans(spec, ruleset(rules))


def by_quant(spec: ModelSpec, plan_for, layers: list[int]) -> list[ParamPlan]:
    """Plans of one layer group, planned apart for the layers an ignore list keeps unquantized (a
    checkpoint may leave one layer's down_proj in bf16)."""
    plans = plan_for(layers)
    q = spec.quant
    if q is None or not q.ignore or len(layers) < 2:
        return plans
    modules = sorted({src.name.rsplit(".", 1)[0] for pl in plans for src in pl.sources if "*" in src.name})
    subsets: dict[tuple, list[int]] = {}
    for i in layers:
        key = tuple(q.quantizes(m.replace("*", str(i), 1).replace("*", "0")) for m in modules)
        subsets.setdefault(key, []).append(i)
    return plans if len(subsets) == 1 else [pl for subset in subsets.values() for pl in plan_for(subset)]

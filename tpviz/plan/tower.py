"""Vision towers and their projectors as vLLM 0.33's model files build them (qwen2_vl.py, qwen2_5_vl.py,
qwen3_vl.py here; siglip.py with gemma3_mm.py, pixtral.py with mistral3.py, mllama4.py, kimi_k25_vit.py in
plan/tower_vit.py; the rest in the other plan/tower_*.py, one BUILDERS entry each):
attention q/k/v column-parallel over the vision heads and its output row-parallel, the MLP column then row,
mergers and projectors likewise; patch embeddings (but Llama-4's unfold linear), norms, plain nn.Linear
mergers, Kimi-K2.5's ReplicatedLinear projector and learned position tables are whole on every GPU. Under
--mm-encoder-tp-mode data every layer is built with disable_tp (whole on every GPU, which runs its own
images), except those SPLIT_IN_DATA names.

A tower's plans carry tower="vision" and, for per-block tensors, blocks (the '*' of their names)."""
from dataclasses import replace
from math import prod

from tpviz.archs.names import Names
from tpviz.config.kinds import Mixer
from tpviz.config.tower import Tower
from tpviz.config.tower_llava import LLAVA, VISION
from tpviz.errors import TPSizeError
from tpviz.plan.attention import qkv, qkv_sections
from tpviz.plan.core import ParamPlan, column, norm, replicated, row
from tpviz.plan.tower_glm import glm4v
from tpviz.plan.tower_hf import gemma4_vision
from tpviz.plan.tower_intern import interns1, internvit
from tpviz.plan.tower_deepseek import HINT as DEEPSEEK_VL2_HINT, deepseek_vl2
from tpviz.plan.tower_minicpm import minicpmv, minicpmv2_0, minicpmv4_6
from tpviz.plan.tower_ocr import deepseek_ocr
from tpviz.plan.tower_vit import FAMILY, llama4, llava_clip, mlp, moonvit, pixtral, siglip
from tpviz.rules import RuleSet, divide, ruleset

DATA_HINT = "--mm-encoder-tp-mode data keeps the vision tower whole on every GPU"
NO_DATA_HINT = "this model's vLLM class has no --mm-encoder-tp-mode data, which would avoid it"
# towers whose layers ask is_vit_use_data_parallel(heads), so vLLM runs them data-parallel by itself where
# the heads do not divide tp (kimi_k25_vit.py): drawn as such with the flag
AUTO_DATA = {"moonvit": ("vLLM 0.33 then runs this tower data-parallel by itself (kimi_k25_vit.py), "
                         "which tpviz draws under --mm-encoder-tp-mode data")}


def _attention(spec, t: Tower, rules: RuleSet, plain: bool, apart: bool = False) -> list[ParamPlan]:
    """q/k/v fused on disk as [q | k | v] and proj; plain: one ColumnParallelLinear cut in 3 * hidden / tp
    rows, as Qwen2-VL's is (its forward all-gathers q/k/v and cuts each again), not head by head; apart:
    attn.q / attn.k / attn.v stored apart (Qwen2.5-Omni), which qwen2_5_vl.py's mapper stacks into qkv."""
    p, h, d = t.blocks, t.heads, t.hidden // t.heads
    if plain:
        plans = column(f"{p}attn.qkv", t.hidden, 3 * t.hidden, FAMILY, None, True,
                       ("3 × vision_config.embed_dim", 3 * t.hidden))
        for plan in plans:
            bias = " bias" if plan.name.endswith(".bias") else ""
            plan.sources[0].sections = qkv_sections("qkv", h, h, d, d, bias)
    else:
        names = (Names(layer=p, attn="attn.", q="q", k="k", v="v") if apart else
                 Names(layer=p, attn="attn.", qkv_fused="qkv"))
        plans = qkv(replace(spec, hidden_size=t.hidden, quant=None), names, rules,
                    Mixer("attention", h, h, d), None, True)
        for plan in plans if apart else ():  # vLLM's parameter keeps the fused layout's name
            plan.name = plan.name.replace(".attn.qkv_proj.", ".attn.qkv.")
    return plans + row(f"{p}attn.proj", t.hidden, t.hidden, FAMILY, None, True,
                       ("vision_config.hidden_size", t.hidden))


def _merger(prefix: str, t: Tower, ln: str, fc: tuple[str, str], norm_width: int, layer_norm: bool):
    """merge² patches concatenated, then column- and row-parallel projections to the decoder's width."""
    wide = t.hidden * t.merge ** 2
    key = ("vision_config.hidden_size × spatial_merge_size²", wide)
    return (norm(f"{prefix}{ln}", norm_width, bias=layer_norm)
            + column(f"{prefix}{fc[0]}", wide, wide, FAMILY, None, True, key)
            + row(f"{prefix}{fc[1]}", wide, t.out_hidden, FAMILY, None, True, key))


def _patch_embed(t: Tower, bias: bool) -> list[ParamPlan]:
    name = f"{t.prefix}patch_embed.proj"
    weight = replicated(f"{name}.weight", t.hidden, prod(t.patch))
    weight.sources[0].disk = (t.hidden,) + tuple(t.patch)  # a Conv3d kernel, drawn as [out, in·t·p·p]
    return [weight] + ([replicated(f"{name}.bias", t.hidden, 1, bias=True)] if bias else [])


def qwen2_vl(spec, t: Tower, rules: RuleSet) -> tuple[list, list, list]:
    """(per-block plans, per-deepstack-merger plans, once-per-tower plans)."""
    blocks = (_attention(spec, t, rules, plain=True) + mlp(t, False, ("fc1", "fc2"))
              + [pl for n in ("norm1", "norm2") for pl in norm(f"{t.blocks}{n}", t.hidden, bias=True)])
    return blocks, [], _patch_embed(t, False) + _merger(f"{t.prefix}merger.", t, "ln_q", ("mlp.0", "mlp.2"),
                                                        t.hidden, True)


def qwen2_5_vl(spec, t: Tower, rules: RuleSet) -> tuple[list, list, list]:
    apart = t.kind == "qwen2_5_omni"  # the same tower in Qwen2.5-Omni, its q/k/v stored apart
    blocks = (_attention(spec, t, rules, plain=False, apart=apart) + mlp(t, True, ("", ""))
              + [pl for n in ("norm1", "norm2") for pl in norm(f"{t.blocks}{n}", t.hidden)])
    return blocks, [], _patch_embed(t, False) + _merger(f"{t.prefix}merger.", t, "ln_q", ("mlp.0", "mlp.2"),
                                                        t.hidden, False)


def qwen3_vl(spec, t: Tower, rules: RuleSet) -> tuple[list, list, list]:
    fc = ("linear_fc1", "linear_fc2")
    blocks = (_attention(spec, t, rules, plain=False) + mlp(t, False, fc)
              + [pl for n in ("norm1", "norm2") for pl in norm(f"{t.blocks}{n}", t.hidden, bias=True)])
    # the deepstack mergers norm after the patches are concatenated (use_postshuffle_norm)
    deep = _merger(f"{t.prefix}deepstack_merger_list.*.", t, "norm", fc, t.hidden * t.merge ** 2, True)
    once = (_patch_embed(t, True) + ([replicated(f"{t.prefix}pos_embed.weight", t.positions, t.hidden)]
                                     if t.positions else [])
            + _merger(f"{t.prefix}merger.", t, "norm", fc, t.hidden, True))
    return blocks, deep if t.deepstack else [], once


def qwen3_omni(spec, t: Tower, rules: RuleSet) -> tuple[list, list, list]:
    """Qwen3-Omni's ViT (qwen3_omni_moe_thinker.py): Qwen3-VL's blocks, its mergers named as Qwen2.5-VL's
    (ln_q, mlp.0, mlp.2) and its deepstack ones merger_list.*, normed after the patches are concatenated."""
    fc, wide = ("mlp.0", "mlp.2"), t.hidden * t.merge ** 2
    blocks, _, _ = qwen3_vl(spec, t, rules)
    deep = _merger(f"{t.prefix}merger_list.*.", t, "ln_q", fc, wide, True)
    once = (_patch_embed(t, True) + [replicated(f"{t.prefix}pos_embed.weight", t.positions, t.hidden)]
            + _merger(f"{t.prefix}merger.", t, "ln_q", fc, t.hidden, True))
    return blocks, deep if t.deepstack else [], once


BUILDERS = {"qwen2_vl": qwen2_vl, "qwen2_5_vl": qwen2_5_vl, "qwen2_5_omni": qwen2_5_vl, "qwen3_vl": qwen3_vl,
            "siglip": siglip, "qwen3_omni": qwen3_omni,
            "pixtral": pixtral, "llava_pixtral": pixtral, "llama4": llama4, "moonvit": moonvit,
            "minicpmv": minicpmv, "deepseek_vl2": deepseek_vl2}
BUILDERS |= {f"{w}_{v}": llava_clip for w in LLAVA for v in VISION.values()}  # config/tower_llava.py
# towers whose attention is not split (deepseek_vl2.py: timm's, with only its MLPs parallel): no head limit
WHOLE_ATTENTION = {"deepseek_vl2": DEEPSEEK_VL2_HINT}
BUILDERS |= {"minicpmv4_6": minicpmv4_6, "minicpmv4_7": minicpmv4_6}  # tower_minicpm.py
BUILDERS |= {"minicpmv2_0": minicpmv2_0}
# Kimi-VL's MoonViT (moonvit.py): the same blocks, but is_vit_use_data_parallel() asked without the heads, so
# no fallback by itself: a tp the 16 vision heads do not divide needs --mm-encoder-tp-mode data
BUILDERS["moonvit_vl"] = moonvit
BUILDERS |= {"internvit": internvit, "glm4v": glm4v, "interns1": interns1}  # tower_intern.py, tower_glm.py
# InternViT builds its attention whole by itself where the heads do not divide tp (tower_intern.py): no head
# limit, and a split MLP that tp breaks is avoided by --mm-encoder-tp-mode data
WHOLE_ATTENTION["internvit"] = DATA_HINT
WHOLE_ATTENTION["interns1"] = ("vLLM 0.33's interns1_vit.py splits only this tower's MLP and interns1.py "
                               "has no --mm-encoder-tp-mode data")
BUILDERS["gemma4_vision"] = gemma4_vision  # transformers' Gemma4VisionModel, whole (tower_hf.py)
BUILDERS["deepseek_ocr"] = deepseek_ocr  # tower_ocr.py: CLIP-L's layers split, SAM's whole
# layers a model file builds without disable_tp: split over tp even in data mode (mllama4.py's projector)
SPLIT_IN_DATA = {"llama4": ("multi_modal_projector.linear_1.",)}


def _guarded(build, t: Tower, quantity):
    """vLLM divides the vision heads by tp first, then each layer's size: a failure names the tower's own
    key and the flag that avoids it."""
    def guarded(tp, r):
        try:
            if t.kind not in WHOLE_ATTENTION:
                divide(t.heads, tp, t.heads_key)
            return build(tp, r)
        except TPSizeError as e:
            key, value = (quantity if e.generic and quantity else (e.quantity, e.value))
            rule = f"{key}={value} is not divisible by tp_size={tp}" if e.generic and quantity else e.reason
            hint = (AUTO_DATA.get(t.kind) or WHOLE_ATTENTION.get(t.kind)
                    or (DATA_HINT if t.supports_data else NO_DATA_HINT))
            raise TPSizeError(f"the vision tower: {rule}; {hint}", key, value, tp) from None
    return guarded


def _whole(plan: ParamPlan) -> ParamPlan:
    """disable_tp: every rank builds the layer as at tp 1 and loads each tensor whole."""
    build = plan.build
    plan.build = lambda tp, r: build(1, 0)
    plan.split = False  # traced along its split dim still, whose full size every rank now holds
    for src in plan.sources:
        src.split = False
    if plan.layer_class.endswith("ParallelLinear"):
        plan.layer_class += " (disable_tp)"  # whole, so a row-parallel bias is added on every GPU
    return plan


def tower_plans(spec, rules: RuleSet | str) -> list[ParamPlan]:
    """Every parameter of the spec's vision tower (none when it has no tower tpviz models)."""
    rules = ruleset(rules)
    t = spec.tower
    if t is None or rules.carves:  # SGLang cuts a tower's attention over attn_tp, its MLP over tp: unmodelled
        return []
    blocks, deep, once = BUILDERS[t.kind](spec, t, rules)
    for group, count in ((blocks, t.depth), (deep, t.deepstack), (once, 0)):
        for plan in group:  # a once-per-tower part keeps the blocks its builder gave (DeepSeek-OCR's SAM)
            plan.family, plan.tower, plan.blocks = FAMILY, "vision", count or plan.blocks
            if t.data_parallel:
                if not plan.name.startswith(SPLIT_IN_DATA.get(t.kind, ())):
                    _whole(plan)
            elif plan.split:
                plan.build = _guarded(plan.build, t, plan.quantity)
    return blocks + deep + once

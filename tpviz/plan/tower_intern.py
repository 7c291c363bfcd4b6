"""InternVL's vision tower and projector as vLLM 0.33's intern_vit.py and internvl.py build them (and, for
InternVL's transformers-format checkpoints, interns1_vit.py and interns1.py: interns1 below).

Each encoder layer: attn.qkv, fused on disk as [q | k | v], one QKVParallelLinear over the vision heads
(biased when qkv_bias), attn.proj row-parallel (biased); with qk_normalization, q_norm and k_norm are RMSNorms
over all heads, whole on every GPU (the forward all-gathers q and k over tp to norm them, then cuts them
again); mlp.fc1 column- and mlp.fc2 row-parallel (biased); norm1 / norm2 (RMSNorm or LayerNorm by norm_type)
and the layer scales ls1 / ls2 whole. internvl.py pads no dummy heads (num_dummy_heads stays 0), so where the
vision heads do not divide tp, InternParallelAttention builds qkv and proj with disable_tp: the attention is
whole on every GPU while the MLP stays split. The embeddings (class token, Conv2d patch kernel, position
table) and mlp1 (LayerNorm, Linear, GELU, Linear: plain torch modules) are whole on every GPU."""
from dataclasses import replace

from tpviz.archs.names import Names
from tpviz.config.kinds import Mixer
from tpviz.config.tower import Tower
from tpviz.plan.attention import qkv
from tpviz.plan.core import ParamPlan, column, norm, replicated, row
from tpviz.plan.tower_minicpm import whole
from tpviz.rules import RuleSet

FAMILY = "vision"
WHOLE_NOTE = "whole on every GPU (disable_tp) where tp does not divide the vision heads"


def whole_unless_heads_divide(plan: ParamPlan, heads: int, note: str = WHOLE_NOTE) -> ParamPlan:
    """InternParallelAttention (and Qwen3-Omni's audio layers): tp_size 1 (disable_tp) when heads % tp; split
    over the heads otherwise."""
    build = plan.build
    plan.build = lambda tp, r: build(tp, r) if heads % tp == 0 else build(1, 0)
    plan.note = " · ".join(filter(None, [plan.note, note]))
    return plan


def internvit(spec, t: Tower, rules: RuleSet) -> tuple[list, list, list]:
    """(per-layer plans, [], once-per-tower plans)."""
    p, h, d, hidden = t.blocks, t.heads, t.hidden // t.heads, t.hidden
    bias, key = "qkv_bias" in t.options, ("vision_config.hidden_size", hidden)
    attn = (qkv(replace(spec, hidden_size=hidden, quant=None), Names(layer=p, attn="attn.", qkv_fused="qkv"),
                rules, Mixer("attention", h, h, d), None, bias)
            + row(f"{p}attn.proj", hidden, hidden, FAMILY, None, True, key))
    attn = [whole_unless_heads_divide(plan, h) for plan in attn]
    qk = [pl for n in ("q_norm", "k_norm") for pl in norm(f"{p}attn.{n}", hidden)] if "qk_norm" in t.options \
        else []
    mlp_key = ("vision_config.intermediate_size", t.intermediate)
    layer_norm = "rms_norm" not in t.options
    blocks = (attn + qk + column(f"{p}mlp.fc1", hidden, t.intermediate, FAMILY, None, True, mlp_key)
              + row(f"{p}mlp.fc2", t.intermediate, hidden, FAMILY, None, True, mlp_key)
              + [pl for n in ("norm1", "norm2") for pl in norm(f"{p}{n}", hidden, bias=layer_norm)]
              + [whole(f"{p}{n}", (hidden,)) for n in ("ls1", "ls2")])
    e, pr, wide = f"{t.prefix}embeddings.", t.projector, hidden * t.merge ** 2
    once = [whole(f"{e}class_embedding", (1, 1, hidden)),
            whole(f"{e}patch_embedding.weight", (hidden, *t.patch)),
            whole(f"{e}patch_embedding.bias", (hidden,)),
            whole(f"{e}position_embedding", (1, t.positions, hidden)), *norm(f"{pr}0", wide, bias=True),
            replicated(f"{pr}1.weight", t.out_hidden, wide),
            replicated(f"{pr}1.bias", t.out_hidden, 1, bias=True),
            replicated(f"{pr}3.weight", t.out_hidden, t.out_hidden),
            replicated(f"{pr}3.bias", t.out_hidden, 1, bias=True)]
    return blocks, [], once


def _linear(prefix: str, out: int, inp: int, bias: bool) -> list[ParamPlan]:
    """A torch nn.Linear: whole on every GPU."""
    return [replicated(f"{prefix}.weight", out, inp)] + (
        [replicated(f"{prefix}.bias", out, 1, bias=True)] if bias else [])


def interns1(spec, t: Tower, rules: RuleSet) -> tuple[list, list, list]:
    """interns1_vit.py (InternVL's transformers-format checkpoints): the attention's q_proj / k_proj / v_proj
    and projection_layer are plain nn.Linear, whole on every GPU (no head limits tp); q_norm / k_norm whole;
    mlp.fc1 column- and fc2 row-parallel; layernorm_before / after and lambda_1 / 2 whole. Once: cls_token,
    mask_token (use_mask_token), the Conv2d patch kernel, the position table, a final layernorm unless
    use_mean_pooling; interns1.py's projector (layer_norm, linear_1, linear_2) nn modules, whole."""
    p, hidden, pr = t.blocks, t.hidden, t.projector
    bias, mlp_key = "qkv_bias" in t.options, ("vision_config.intermediate_size", t.intermediate)
    a = f"{p}attention."
    blocks = ([pl for n in ("q_proj", "k_proj", "v_proj") for pl in _linear(f"{a}{n}", hidden, hidden, bias)]
              + ([pl for n in ("q_norm", "k_norm") for pl in norm(f"{a}{n}", hidden)]
                 if "qk_norm" in t.options else [])
              + _linear(f"{a}projection_layer", hidden, hidden, True)
              + column(f"{p}mlp.fc1", hidden, t.intermediate, FAMILY, None, True, mlp_key)
              + row(f"{p}mlp.fc2", t.intermediate, hidden, FAMILY, None, True, mlp_key)
              + [pl for n in ("layernorm_before", "layernorm_after")
                 for pl in norm(f"{p}{n}", hidden, bias="rms_norm" not in t.options)]
              + [whole(f"{p}{n}", (hidden,)) for n in ("lambda_1", "lambda_2")])
    e, wide = f"{t.prefix}embeddings.", hidden * t.merge ** 2
    once = [whole(f"{e}cls_token", (1, 1, hidden)),
            *([whole(f"{e}mask_token", (1, 1, hidden))] if "mask_token" in t.options else []),
            whole(f"{e}patch_embeddings.projection.weight", (hidden, *t.patch)),
            whole(f"{e}patch_embeddings.projection.bias", (hidden,)),
            *([whole(f"{e}position_embeddings", (1, t.positions, hidden))] if "positions" in t.options
              else []),
            *(norm(f"{t.prefix}layernorm", hidden, bias=True) if "final_norm" in t.options else []),
            *norm(f"{pr}layer_norm", wide, bias=True), *_linear(f"{pr}linear_1", t.out_hidden, wide, True),
            *_linear(f"{pr}linear_2", t.out_hidden, t.out_hidden, True)]
    return blocks, [], once

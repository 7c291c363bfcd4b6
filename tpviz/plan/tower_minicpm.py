"""MiniCPM-V's vision tower and resampler as vLLM 0.33's minicpmv.py builds them (versions 2.5 to 4.5).

The tower is idefics2_vision_model.py's Idefics2VisionTransformer under SigLIP's names: q/k/v stored apart
and loaded into one biased QKVParallelLinear over the vision heads (which tp must divide: the attention
asserts it, with no fallback), out_proj row-parallel, fc1 / fc2 column then row, LayerNorms; the patch kernel,
the position table and post_layernorm whole. The resampler (resampler.py's BaseResampler) is whole on every
GPU in either --mm-encoder-tp-mode: its kv_proj is a ReplicatedLinear and the rest plain torch modules
(learned queries, nn.MultiheadAttention's in_proj and out_proj, three LayerNorms, the output projection)."""
from dataclasses import replace

from tpviz.archs.names import Names
from tpviz.config.kinds import Mixer
from tpviz.config.tower import Tower
from tpviz.plan.attention import qkv
from tpviz.plan.core import ParamPlan, column, norm, replicated, row
from tpviz.rules import RuleSet

FAMILY = "vision"


def whole(name: str, shape: tuple) -> ParamPlan:
    """A plain parameter held whole by every GPU, drawn as [rows, the rest] (leading 1s dropped: timm's
    pos_embed [1, 729, 1152] is drawn [729, 1152])."""
    drawn = tuple(shape)
    while len(drawn) > 1 and drawn[0] == 1:
        drawn = drawn[1:]
    rows, rest = drawn[0], 1
    for d in drawn[1:]:
        rest *= d
    plan = replicated(name, rows, rest) if len(drawn) > 1 else replicated(name, rows, 1, bias=True)
    plan.sources[0].disk = tuple(shape)
    return plan


def whole_linear(prefix: str, out: int, inp: int) -> list[ParamPlan]:
    """A biased torch nn.Linear (timm's): whole on every GPU."""
    return [replicated(f"{prefix}.weight", out, inp), replicated(f"{prefix}.bias", out, 1, bias=True)]


def _resampler(t: Tower, positions: bool) -> list[ParamPlan]:
    """BaseResampler's parameters, all whole; positions: Resampler2's (2.0) learned 2-D table as well."""
    r, wide = t.projector, t.out_hidden
    return [whole(f"{r}query", (t.queries, wide)),
            *([whole(f"{r}pos_embed", (t.queries, wide))] if positions else []),
            # kv_proj exists only where the widths differ (an identity otherwise)
            *([replicated(f"{r}kv_proj.weight", wide, t.hidden)] if wide != t.hidden else []),
            whole(f"{r}attn.in_proj_weight", (3 * wide, wide)), whole(f"{r}attn.in_proj_bias", (3 * wide,)),
            whole(f"{r}attn.out_proj.weight", (wide, wide)), whole(f"{r}attn.out_proj.bias", (wide,)),
            *(pl for n in ("ln_q", "ln_kv", "ln_post") for pl in norm(f"{r}{n}", wide, bias=True)),
            whole(f"{r}proj", (wide, wide))]


def idefics2_blocks(spec, t: Tower, rules: RuleSet) -> list[ParamPlan]:
    """One encoder layer: self_attn q/k/v (QKVParallelLinear) and out_proj, mlp.fc1 / fc2, layer_norm1 / 2."""
    p, h, d = t.blocks, t.heads, t.hidden // t.heads
    attn = qkv(replace(spec, hidden_size=t.hidden, quant=None), Names(layer=p, attn="self_attn."), rules,
               Mixer("attention", h, h, d), None, True)
    key, mlp = ("vision_config.hidden_size", t.hidden), ("vision_config.intermediate_size", t.intermediate)
    return (attn + row(f"{p}self_attn.out_proj", t.hidden, t.hidden, FAMILY, None, True, key)
            + column(f"{p}mlp.fc1", t.hidden, t.intermediate, FAMILY, None, True, mlp)
            + row(f"{p}mlp.fc2", t.intermediate, t.hidden, FAMILY, None, True, mlp)
            + [pl for n in ("layer_norm1", "layer_norm2") for pl in norm(f"{p}{n}", t.hidden, bias=True)])


def minicpmv(spec, t: Tower, rules: RuleSet) -> tuple[list, list, list]:
    """(per-block plans, [], once-per-tower plans): the encoder layers, then the embeddings, post_layernorm
    and the resampler (embed_dim the decoder's width, kv_dim the tower's)."""
    e = f"{t.prefix}embeddings."
    once = [whole(f"{e}patch_embedding.weight", (t.hidden, *t.patch)),
            whole(f"{e}patch_embedding.bias", (t.hidden,)),
            whole(f"{e}position_embedding.weight", (t.positions, t.hidden)),
            *norm(f"{t.prefix}post_layernorm", t.hidden, bias=True), *_resampler(t, False)]
    return idefics2_blocks(spec, t, rules), [], once


def minicpmv2_0(spec, t: Tower, rules: RuleSet) -> tuple[list, list, list]:
    """MiniCPMV2_0: timm's so400m under vpm. with none of its linears swapped (attention pooling replaced by
    an identity, so not built), then Resampler2 (the resampler and its learned 2-D position table): all
    whole on every GPU."""
    p, d, i = t.blocks, t.hidden, t.intermediate
    blocks = (whole_linear(f"{p}attn.qkv", 3 * d, d) + whole_linear(f"{p}attn.proj", d, d)
              + whole_linear(f"{p}mlp.fc1", i, d) + whole_linear(f"{p}mlp.fc2", d, i)
              + [pl for n in ("norm1", "norm2") for pl in norm(f"{p}{n}", d, bias=True)])
    once = [whole(f"{t.prefix}patch_embed.proj.weight", (d, *t.patch)),
            whole(f"{t.prefix}patch_embed.proj.bias", (d,)),
            whole(f"{t.prefix}pos_embed", (1, t.positions, d)),
            *norm(f"{t.prefix}norm", d, bias=True), *_resampler(t, True)]
    return blocks, [], once


def minicpmv4_6(spec, t: Tower, rules: RuleSet) -> tuple[list, list, list]:
    """minicpmv4_6.py (4.7 alike): the Idefics2 tower under vision_tower., then its vit_merger (one window
    attention over the vision heads as the blocks', layer_norm1; 2 × 2 patches concatenated through pre_norm,
    linear_1 and linear_2, plain nn.Linear whole on every GPU) and the merger's downsample MLP (pre_norm,
    linear_1, linear_2 to the decoder's width, whole)."""
    e, v, h = f"{t.prefix}embeddings.", f"{t.prefix}vit_merger.", t.hidden
    wide, inter = 4 * h, 4 * t.intermediate  # the 2 × 2 window's patches side by side
    attn = (qkv(replace(spec, hidden_size=h, quant=None), Names(layer=v, attn="self_attn."), rules,
                Mixer("attention", t.heads, t.heads, h // t.heads), None, True)
            + row(f"{v}self_attn.out_proj", h, h, FAMILY, None, True, ("vision_config.hidden_size", h)))
    m = f"{t.projector}mlp.0."
    once = [whole(f"{e}patch_embedding.weight", (h, *t.patch)), whole(f"{e}patch_embedding.bias", (h,)),
            whole(f"{e}position_embedding.weight", (t.positions, h)),
            *norm(f"{t.prefix}post_layernorm", h, bias=True),
            *attn, *norm(f"{v}layer_norm1", h, bias=True), *norm(f"{v}pre_norm", wide, bias=True),
            replicated(f"{v}linear_1.weight", inter, wide), whole(f"{v}linear_1.bias", (inter,)),
            replicated(f"{v}linear_2.weight", h, inter), whole(f"{v}linear_2.bias", (h,)),
            *norm(f"{m}pre_norm", wide, bias=True),
            replicated(f"{m}linear_1.weight", wide, wide), whole(f"{m}linear_1.bias", (wide,)),
            replicated(f"{m}linear_2.weight", t.out_hidden, wide),
            whole(f"{m}linear_2.bias", (t.out_hidden,))]
    return idefics2_blocks(spec, t, rules), [], once

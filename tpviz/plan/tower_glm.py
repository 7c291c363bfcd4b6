"""GLM-4.1V and GLM-4.5V's vision tower as vLLM 0.33's glm4_1v.py builds it (Glm4vVisionTransformer).

Each block: attn.qkv, fused on disk as [q | k | v], one QKVParallelLinear over the vision heads and attn.proj
row-parallel, neither biased; the MLP gate_proj / up_proj (stored apart) merged into one column-parallel
gate_up_proj out_hidden_size wide, down_proj row-parallel; norm1 / norm2 RMSNorms. Once: the Conv3d patch
kernel (biased), post_conv_layernorm, the learned position table, post_layernorm and the Conv2d downsample
(spatial_merge_size² patches to out_hidden_size, biased) whole on every GPU; the merger's proj
column-parallel (gathered), its post_projection_norm LayerNorm whole, its gate_proj / up_proj merged
column-parallel (intermediate_size wide) and down_proj row-parallel. vLLM's head check comes first:
the vision heads must divide tp, unless --mm-encoder-tp-mode data (Glm4vForConditionalGeneration supports
it) builds every layer whole."""
from dataclasses import replace

from tpviz.archs.names import Names
from tpviz.config.kinds import Mixer
from tpviz.config.tower import Tower
from tpviz.plan.attention import qkv
from tpviz.plan.core import GATHERED, ParamPlan, column, merged, norm, row
from tpviz.plan.tower_minicpm import whole
from tpviz.rules import RuleSet

FAMILY = "vision"


def _gated(prefix: str, inp: int, width: int, key: tuple) -> list[ParamPlan]:
    """gate_proj and up_proj loaded into one MergedColumnParallelLinear, then down_proj; no biases."""
    return (merged(f"{prefix}gate_up_proj", [f"{prefix}gate_proj", f"{prefix}up_proj"], None, inp,
                   [width] * 2, FAMILY, None, key)
            + row(f"{prefix}down_proj", width, inp, FAMILY, None, False, key))


def glm4v(spec, t: Tower, rules: RuleSet) -> tuple[list, list, list]:
    """(per-block plans, [], once-per-tower plans)."""
    p, h, d, out = t.blocks, t.heads, t.hidden // t.heads, t.out_hidden
    names, key = Names(layer=p, attn="attn.", qkv_fused="qkv"), ("vision_config.hidden_size", t.hidden)
    vision = replace(spec, hidden_size=t.hidden, quant=None)
    blocks = (qkv(vision, names, rules, Mixer("attention", h, h, d), None, False)
              + row(f"{p}attn.proj", t.hidden, t.hidden, FAMILY, None, False, key)
              # the block MLP is out_hidden_size wide (Glm4vVisionBlock's mlp_hidden_dim)
              + _gated(f"{p}mlp.", t.hidden, out, ("vision_config.out_hidden_size", out))
              + [pl for n in ("norm1", "norm2") for pl in norm(f"{p}{n}", t.hidden)])
    m = f"{t.prefix}merger."
    once = [whole(f"{t.prefix}patch_embed.proj.weight", (t.hidden, *t.patch)),
            whole(f"{t.prefix}patch_embed.proj.bias", (t.hidden,)),
            *norm(f"{t.prefix}post_conv_layernorm", t.hidden),
            whole(f"{t.prefix}embeddings.position_embedding.weight", (t.positions, t.hidden)),
            *norm(f"{t.prefix}post_layernorm", t.hidden),
            whole(f"{t.prefix}downsample.weight", (out, t.hidden, t.merge, t.merge)),
            whole(f"{t.prefix}downsample.bias", (out,)),
            *column(f"{m}proj", out, out, FAMILY, None, False, ("vision_config.out_hidden_size", out),
                    note=GATHERED),
            *norm(f"{m}post_projection_norm", out, bias=True),
            *_gated(m, out, t.intermediate, ("vision_config.intermediate_size", t.intermediate))]
    return blocks, [], once

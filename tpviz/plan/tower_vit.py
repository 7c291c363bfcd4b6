"""Vision towers whose wrappers store q/k/v their own way, as vLLM 0.33 builds them: siglip.py with
gemma3_mm.py, pixtral.py with mistral3.py, clip.py / siglip.py under llava.py, mllama4.py and
kimi_k25_vit.py (MoonViT); plus the block MLP every tower in plan/tower.py shares. Each builder returns
(per-block plans, per-deepstack-merger plans, once-per-tower plans)."""
from dataclasses import replace
from math import prod

from tpviz.archs.names import Names
from tpviz.config.kinds import Mixer
from tpviz.config.tower import Tower
from tpviz.plan.attention import qkv
from tpviz.plan.core import GATHERED, ParamPlan, column, merged, norm, replicated, row
from tpviz.rules import RuleSet

FAMILY = "vision"


def mlp(t: Tower, gated: bool, fc: tuple[str, str]) -> list[ParamPlan]:
    """A block's MLP: fc[0] column- then fc[1] row-parallel; gated: gate/up merged, then down_proj."""
    p, i = t.blocks, t.intermediate
    key = ("vision_config.intermediate_size", i)
    if gated:  # Qwen2.5-VL: gate/up merged, as the text decoder's
        up = merged(f"{p}mlp.gate_up_proj", [f"{p}mlp.gate_proj", f"{p}mlp.up_proj"], None, t.hidden, [i, i],
                    FAMILY, None, key, bias=True)
        return up + row(f"{p}mlp.down_proj", i, t.hidden, FAMILY, None, True, key)
    return (column(f"{p}mlp.{fc[0]}", t.hidden, i, FAMILY, None, True, key)
            + row(f"{p}mlp.{fc[1]}", i, t.hidden, FAMILY, None, True, key))


def stored_qkv(spec, t: Tower, rules: RuleSet, attn: str, out: str, bias: bool) -> list[ParamPlan]:
    """q/k/v stored apart, loaded into one QKVParallelLinear over the vision heads; the output
    row-parallel."""
    p, h, d = t.blocks, t.heads, t.hidden // t.heads
    plans = qkv(replace(spec, hidden_size=t.hidden, quant=None), Names(layer=p, attn=attn), rules,
                Mixer("attention", h, h, d), None, bias)
    return plans + row(f"{p}{attn}{out}", t.hidden, t.hidden, FAMILY, None, bias,
                       ("vision_config.hidden_size", t.hidden))


def conv(name: str, t: Tower) -> ParamPlan:
    """A Conv2d patch kernel (or the linear of an unfolded one), drawn as [out, in·p·p]."""
    weight = replicated(name, t.hidden, prod(t.patch))
    weight.sources[0].disk = (t.hidden,) + tuple(t.patch)
    return weight


def siglip(spec, t: Tower, rules: RuleSet) -> tuple[list, list, list]:
    """siglip.py as gemma3_mm.py builds it: q/k/v stored apart into one QKVParallelLinear, out_proj,
    fc1 / fc2, a post_layernorm; then Gemma-3's projector, a plain parameter and an RMSNorm (whole on every
    GPU)."""
    p = t.blocks
    blocks = stored_qkv(spec, t, rules, "self_attn.", "out_proj", True) + mlp(t, False, ("fc1", "fc2")) + [
        pl for n in ("layer_norm1", "layer_norm2") for pl in norm(f"{p}{n}", t.hidden, bias=True)]
    e = f"{t.prefix}embeddings."
    once = [conv(f"{e}patch_embedding.weight", t),
            replicated(f"{e}patch_embedding.bias", t.hidden, 1, bias=True),
            replicated(f"{e}position_embedding.weight", t.positions, t.hidden),
            *norm(f"{t.prefix}post_layernorm", t.hidden, bias=True),
            replicated(f"{t.projector}mm_input_projection_weight", t.hidden, t.out_hidden),
            *norm(f"{t.projector}mm_soft_emb_norm", t.hidden)]
    return blocks, [], once


def pixtral(spec, t: Tower, rules: RuleSet) -> tuple[list, list, list]:
    """pixtral.py's PixtralHFVisionModel (RMSNorms, gate/up merged, no biases) and mistral3.py's projector:
    an RMSNorm, the patch merger (a plain nn.Linear, whole on every GPU), linear_1 column- and linear_2
    row-parallel; llava.py's (Pixtral-12B) is those two linears alone."""
    p, i, key = t.blocks, t.intermediate, ("vision_config.intermediate_size", t.intermediate)
    ff = f"{p}feed_forward."
    blocks = (stored_qkv(spec, t, rules, "attention.", "o_proj", False)
              + merged(f"{ff}gate_up_proj", [f"{ff}gate_proj", f"{ff}up_proj"], None, t.hidden, [i, i],
                       FAMILY, None, key)
              + row(f"{ff}down_proj", i, t.hidden, FAMILY, None, False, key)
              + [pl for n in ("attention_norm", "ffn_norm") for pl in norm(f"{p}{n}", t.hidden)])
    pr, text = t.projector, ("text_config.hidden_size", t.out_hidden)
    once = [conv(f"{t.prefix}patch_conv.weight", t), *norm(f"{t.prefix}ln_pre", t.hidden)]
    if t.kind == "pixtral":  # llava.py's projector has neither the norm nor the patch merger
        once += [*norm(f"{pr}norm", t.hidden),
                 replicated(f"{pr}patch_merger.merging_layer.weight", t.hidden, t.hidden * t.merge ** 2)]
    once += [*column(f"{pr}linear_1", t.hidden, t.out_hidden, FAMILY, None, t.proj_bias, text),
             *row(f"{pr}linear_2", t.out_hidden, t.out_hidden, FAMILY, None, t.proj_bias, text)]
    return blocks, [], once


def llava_clip(spec, t: Tower, rules: RuleSet) -> tuple[list, list, list]:
    """clip.py's CLIPVisionModel (or siglip.py's) as llava.py builds it: SigLIP's encoder layers (q/k/v
    stored apart, out_proj, fc1 / fc2, two LayerNorms); CLIP's class token, unbiased patch kernel and
    pre_layrnorm, or SigLIP's biased kernel, and the position table, whole; no post_layernorm; the wrapper's
    projector; LLaVA-NeXT's and LLaVA-OneVision's image_newline whole."""
    e, text = f"{t.prefix}embeddings.", ("text_config.hidden_size", t.out_hidden)
    siglip_tower = t.kind.endswith("siglip")  # a biased patch kernel, no class token nor pre_layrnorm
    first = (f"{e}patch_embedding.bias" if siglip_tower else f"{e}class_embedding")
    once = [replicated(first, t.hidden, 1, bias=True), conv(f"{e}patch_embedding.weight", t),
            replicated(f"{e}position_embedding.weight", t.positions, t.hidden),
            *([] if siglip_tower else norm(f"{t.prefix}pre_layrnorm", t.hidden, bias=True)),
            *_llava_projector(t, text),
            *(replicated(name, t.out_hidden, 1, bias=True) for name in t.extras)]
    return siglip(spec, t, rules)[0], [], once


def _llava_projector(t: Tower, text: tuple) -> list:
    """llava.py's linear_1 column- and linear_2 row-parallel; llava_onevision.py's plain nn.Linears, whole."""
    pr = t.projector
    if not t.kind.startswith("llava_onevision"):
        return [*column(f"{pr}linear_1", t.hidden, t.out_hidden, FAMILY, None, t.proj_bias, text),
                *row(f"{pr}linear_2", t.out_hidden, t.out_hidden, FAMILY, None, t.proj_bias, text)]
    return [pl for name, inp in (("linear_1", t.hidden), ("linear_2", t.out_hidden))
            for pl in [replicated(f"{pr}{name}.weight", t.out_hidden, inp)]
            + ([replicated(f"{pr}{name}.bias", t.out_hidden, 1, bias=True)] if t.proj_bias else [])]


def llama4(spec, t: Tower, rules: RuleSet) -> tuple[list, list, list]:
    """mllama4.py: biased q/k/v in one QKVParallelLinear, o_proj, fc1 / fc2 and LayerNorms per block; the
    unfold patch embedding column-parallel (gathered); a class token, a position table and two LayerNorms
    whole; the pixel-shuffle adapter's MLP column then row; the projector's linear_1 column-parallel
    (gathered), which vLLM builds without disable_tp, so data mode still splits it."""
    p, key = t.blocks, ("vision_config.intermediate_size", t.intermediate)
    blocks = (stored_qkv(spec, t, rules, "self_attn.", "o_proj", True)
              + column(f"{p}mlp.fc1", t.hidden, t.intermediate, FAMILY, None, True, key)
              + row(f"{p}mlp.fc2", t.intermediate, t.hidden, FAMILY, None, True, key)
              + [pl for n in ("input_layernorm", "post_attention_layernorm")
                 for pl in norm(f"{p}{n}", t.hidden, bias=True)])
    mid, out, vision_out = t.adapter
    ad = f"{t.prefix}vision_adapter.mlp."
    embed = column(f"{t.prefix}patch_embedding.linear", prod(t.patch), t.hidden, FAMILY, None, False,
                   ("vision_config.hidden_size", t.hidden), note=GATHERED)
    embed[0].sources[0].disk = None  # stored as the linear it is: [hidden, channels·p·p]
    once = [*embed, replicated(f"{t.prefix}class_embedding", t.hidden, 1, bias=True),
            replicated(f"{t.prefix}positional_embedding_vlm", t.positions, t.hidden),
            *(pl for n in ("layernorm_pre", "layernorm_post")
              for pl in norm(f"{t.prefix}{n}", t.hidden, bias=True)),
            *column(f"{ad}fc1", t.intermediate, mid, FAMILY, None, t.proj_bias,
                    ("vision_config.projector_input_dim", mid)),
            *row(f"{ad}fc2", mid, out, FAMILY, None, t.proj_bias, ("vision_config.projector_input_dim", mid)),
            *column(f"{t.projector}linear_1", vision_out, t.out_hidden, FAMILY, None, False,
                    ("text_config.hidden_size", t.out_hidden), note=GATHERED)]
    return blocks, [], once


def moonvit(spec, t: Tower, rules: RuleSet) -> tuple[list, list, list]:
    """kimi_k25_vit.py's MoonViT: wqkv fused on disk as [q | k | v] into one biased QKVParallelLinear over the
    vision heads, wo row-parallel, mlp.fc0 / fc1 column then row, LayerNorms; the patch kernel, the 2-D
    position table and the final LayerNorm whole. kimi_k25.py's projector is ReplicatedLinear in either
    mode: a LayerNorm, then proj.0 (linear_1, merge² patches wide) and proj.2 (linear_2, to the decoder's
    width)."""
    p, h, d = t.blocks, t.heads, t.hidden // t.heads
    attn = qkv(replace(spec, hidden_size=t.hidden, quant=None),
               Names(layer=p, attn="", qkv_fused="wqkv"), rules, Mixer("attention", h, h, d), None, True)
    key = ("vision_config.hidden_size", t.hidden)
    blocks = (attn + row(f"{p}wo", t.hidden, t.hidden, FAMILY, None, True, key)
              + mlp(t, False, ("fc0", "fc1"))
              + [pl for n in ("norm0", "norm1") for pl in norm(f"{p}{n}", t.hidden, bias=True)])
    pos = replicated(f"{t.prefix}patch_embed.pos_emb.weight", t.positions, t.hidden)
    pos.sources[0].disk = (*t.grid, t.hidden)  # [height, width, hidden], drawn as [height·width, hidden]
    pr, wide = t.projector, t.hidden * t.merge ** 2
    one, two = ("linear_1", "linear_2") if t.kind == "moonvit_vl" else ("proj.0", "proj.2")  # kimi_vl.py's
    once = [conv(f"{t.prefix}patch_embed.proj.weight", t),
            replicated(f"{t.prefix}patch_embed.proj.bias", t.hidden, 1, bias=True), pos,
            *norm(f"{t.prefix}encoder.final_layernorm", t.hidden, bias=True),
            *norm(f"{pr}pre_norm", t.hidden, bias=True),
            replicated(f"{pr}{one}.weight", wide, wide), replicated(f"{pr}{one}.bias", wide, 1, bias=True),
            replicated(f"{pr}{two}.weight", t.out_hidden, wide),
            replicated(f"{pr}{two}.bias", t.out_hidden, 1, bias=True)]
    return blocks, [], once

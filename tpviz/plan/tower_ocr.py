"""DeepSeek-OCR's DeepEncoder and projector as vLLM 0.33's deepseek_ocr.py builds them.

Two towers side by side, neither read from vision_config (config/tower_dims.py's SAM_VIT_B and CLIP_L):
- SAM ViT-B (deepencoder.py's build_sam_vit_b) under sam_model.: plain torch modules, whole on every GPU. Its
  blocks' attn.qkv (fused [q | k | v]), attn.proj, mlp.lin1 and lin2 are nn.Linear; its patch kernel, the
  neck and net_2 / net_3 are Conv2dLayer; its position table and each block's relative-position tables are
  plain parameters, those of the global-attention blocks (2, 5, 8, 11) over the whole 64 x 64 grid (127
  rows), the others over a 14 x 14 window (27 rows).
- CLIP-L (deepencoder.py's DeepCLIPVisionTransformer, clip.py's encoder layers) under vision_model.: the
  fused qkv_proj as stored, loaded into one biased QKVParallelLinear over its 16 heads (which tp must divide:
  is_vit_use_data_parallel is asked without them, so no fallback), out_proj row-parallel, mlp.fc1 / fc2
  column then row; its class token, patch kernel, position table and pre_layrnorm whole.
The projector (deepseek_vl2.py's MlpProjector: one nn.Linear for "linear", DeepSeek-OCR's) and the two learned
vectors are whole. DeepseekOCRForCausalLM has no supports_encoder_tp_data, so --mm-encoder-tp-mode data falls
back to weights."""
from dataclasses import replace

from tpviz.archs.names import Names
from tpviz.config.kinds import Mixer
from tpviz.config.tower import Tower
from tpviz.config.tower_dims import SAM_VIT_B
from tpviz.plan.attention import qkv
from tpviz.plan.core import ParamPlan, column, norm, row
from tpviz.plan.tower_minicpm import whole, whole_linear
from tpviz.rules import RuleSet

FAMILY = "vision"


def _clip_layer(spec, t: Tower, rules: RuleSet) -> list[ParamPlan]:
    """One CLIP encoder layer (clip.py's CLIPEncoderLayer), under '*' for the layer."""
    p, h, d = t.blocks, t.heads, t.hidden // t.heads
    attn = qkv(replace(spec, hidden_size=t.hidden, quant=None),
               Names(layer=p, attn="self_attn.", qkv_fused="qkv_proj"), rules, Mixer("attention", h, h, d),
               None, True)
    width = ("deepseek_ocr.py's CLIP-L hidden_size", t.hidden)
    mlp = ("deepseek_ocr.py's CLIP-L intermediate_size", t.intermediate)
    return (attn + row(f"{p}self_attn.out_proj", t.hidden, t.hidden, FAMILY, None, True, width)
            + column(f"{p}mlp.fc1", t.hidden, t.intermediate, FAMILY, None, True, mlp)
            + row(f"{p}mlp.fc2", t.intermediate, t.hidden, FAMILY, None, True, mlp)
            + [pl for n in ("layer_norm1", "layer_norm2") for pl in norm(f"{p}{n}", t.hidden, bias=True)])


def _sam(prefix: str) -> list[ParamPlan]:
    """SAM ViT-B, all whole: the repeated block parts carry blocks (their '*'), the relative-position tables
    (two sizes) one name per block."""
    s = SAM_VIT_B
    d, grid, b = s["hidden"], s["image"] // s["patch"], f"{prefix}blocks.*."
    i = s["intermediate"]
    blocks = (norm(f"{b}norm1", d, bias=True) + whole_linear(f"{b}attn.qkv", 3 * d, d)
              + whole_linear(f"{b}attn.proj", d, d) + norm(f"{b}norm2", d, bias=True)
              + whole_linear(f"{b}mlp.lin1", i, d) + whole_linear(f"{b}mlp.lin2", d, i))
    for plan in blocks:
        plan.blocks = s["depth"]
    head = d // s["heads"]
    rel = [whole(f"{prefix}blocks.{n}.attn.rel_pos_{axis}",
                 (2 * (grid if n in s["global_blocks"] else s["window"]) - 1, head))
           for n in range(s["depth"]) for axis in "hw"]
    neck, (mid, out), patch = s["neck"], s["downsample"], s["patch"]
    return [whole(f"{prefix}patch_embed.proj.weight", (d, 3, patch, patch)),
            whole(f"{prefix}patch_embed.proj.bias", (d,)), whole(f"{prefix}pos_embed", (1, grid, grid, d)),
            *blocks, *rel,
            whole(f"{prefix}neck.0.weight", (neck, d, 1, 1)), *norm(f"{prefix}neck.1", neck, bias=True),
            whole(f"{prefix}neck.2.weight", (neck, neck, 3, 3)), *norm(f"{prefix}neck.3", neck, bias=True),
            whole(f"{prefix}net_2.weight", (mid, neck, 3, 3)),
            whole(f"{prefix}net_3.weight", (out, mid, 3, 3))]


def deepseek_ocr(spec, t: Tower, rules: RuleSet) -> tuple[list, list, list]:
    """(CLIP's per-layer plans, [], once-per-tower plans: CLIP's embeddings, SAM, the projector, the
    vectors)."""
    e, sam, *vectors = f"{t.prefix}embeddings.", *t.extras
    once = [whole(f"{e}class_embedding", (t.hidden,)),
            whole(f"{e}patch_embedding.weight", (t.hidden, *t.patch)),
            whole(f"{e}position_embedding.weight", (t.positions, t.hidden)),
            *norm(f"{t.prefix}pre_layrnorm", t.hidden, bias=True), *_sam(sam)]
    if "linear_projector" in t.options:  # nn.Linear as the Sequential itself
        once += whole_linear(f"{t.projector}layers", t.mlp[1], t.mlp[0])
    else:  # nn.Sequential: a GELU at every odd index
        for i, (inp, out) in enumerate(zip(t.mlp, t.mlp[1:])):
            once += whole_linear(f"{t.projector}layers.{2 * i}", out, inp)
    once += [whole(name, (t.out_hidden,)) for name in vectors]
    return _clip_layer(spec, t, rules), [], once

"""DeepSeek-VL2's vision tower and projector as vLLM 0.33's deepseek_vl2.py builds them.

The tower is timm's vit_so400m_patch14_siglip_384 (config/tower_readers.py's SO400M, built whatever
vision_config says), whose linears stay torch nn.Linear, whole on every GPU, except those patch_vit_for_tp
swaps at tp > 1: every timm Mlp's fc1 becomes a ColumnParallelLinear and fc2 a RowParallelLinear
(replace_linear_class), in the blocks and in the attention-pooling head (attn_pool, which vLLM keeps though no
output reads it). So the attention (attn.qkv fused [q | k | v], attn.proj) is whole and no head count limits
tp; the MLP width does. The projector (MlpProjector, downsample_mlp_gelu: nn.Linear layers with a GELU between
each two) and the two learned vectors (image_newline, view_seperator, the original's spelling) are whole too.
deepseek_vl2.py has no --mm-encoder-tp-mode data."""
from tpviz.config.tower import Tower
from tpviz.plan.core import ParamPlan, column, norm, row
from tpviz.plan.tower_minicpm import whole, whole_linear
from tpviz.rules import RuleSet

FAMILY = "vision"
HINT = "vLLM 0.33's deepseek_vl2.py splits only this tower's MLPs and has no --mm-encoder-tp-mode data"


def _mlp(prefix: str, t: Tower) -> list[ParamPlan]:
    """A timm Mlp as patch_vit_for_tp swaps it: fc1 column-, fc2 row-parallel, both biased."""
    key = ("the MLP width of timm's so400m (int(1152 × 3.7362))", t.intermediate)
    return (column(f"{prefix}fc1", t.hidden, t.intermediate, FAMILY, None, True, key)
            + row(f"{prefix}fc2", t.intermediate, t.hidden, FAMILY, None, True, key))


def deepseek_vl2(spec, t: Tower, rules: RuleSet) -> tuple[list, list, list]:
    """(per-block plans, [], once-per-tower plans)."""
    p, d = t.blocks, t.hidden
    blocks = (whole_linear(f"{p}attn.qkv", 3 * d, d) + whole_linear(f"{p}attn.proj", d, d)
              + _mlp(f"{p}mlp.", t)
              + [pl for n in ("norm1", "norm2") for pl in norm(f"{p}{n}", d, bias=True)])
    pool = f"{t.prefix}attn_pool."
    once = [whole(f"{t.prefix}patch_embed.proj.weight", (d, *t.patch)),
            whole(f"{t.prefix}patch_embed.proj.bias", (d,)),
            whole(f"{t.prefix}pos_embed", (1, t.positions, d)), *norm(f"{t.prefix}norm", d, bias=True),
            whole(f"{pool}latent", (1, 1, d)), *whole_linear(f"{pool}q", d, d),
            *whole_linear(f"{pool}kv", 2 * d, d), *whole_linear(f"{pool}proj", d, d),
            *norm(f"{pool}norm", d, bias=True), *_mlp(f"{pool}mlp.", t)]
    widths = t.mlp
    for i, (inp, out) in enumerate(zip(widths, widths[1:])):  # nn.Sequential: a GELU at every odd index
        once += whole_linear(f"{t.projector}layers.{2 * i}", out, inp)
    once += [whole(name, (t.out_hidden,)) for name in t.extras]
    return blocks, [], once

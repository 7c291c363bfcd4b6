"""Kimi-Linear's plans (vLLM 0.33 models/kimi_k3, layers/mamba/gdn/kimi_gdn_linear_attn.py): the Kimi Delta
Attention mixer, KimiMoE's padded routed experts, and the recurrent state every KDA layer keeps."""
from tpviz.config.kinds import Mixer
from tpviz.layers.kda import KimiDeltaAttention, PaddedExpertsDown, PaddedExpertsGateUp
from tpviz.plan import ssm
from tpviz.plan.core import DT, FP32, PROBE, ParamPlan, Source, class_name, param
from tpviz.archs.names import Names

# conv1d, A_log and dt_bias: vLLM builds them in float32 (FP32) whatever the model's dtype
HEADS = "linear_attn_config.num_heads"


def _owned(m: Mixer, attr: str):
    """build(tp, rank) -> (the layer that owns attr, the parameter), from one rank's mixer at probe width (the
    hidden size, the conv kernel and the gates' low rank: the dims no GPU cuts)."""
    def build(tp, r):
        owner = KimiDeltaAttention(PROBE, m.heads, m.head_dim, PROBE, tp, r, dtype=DT, fp32=DT,
                                   gate_rank=PROBE)
        *path, last = attr.split(".")
        for part in path:
            owner = getattr(owner, part)
        return owner, getattr(owner, last)
    return build


def kda(spec, names: Names, rules, m: Mixer, layers) -> list[ParamPlan]:
    """q, k, v, b and f_a into in_proj_qkvgfab (f_a whole on every GPU), q/k/v_conv1d into one float32 conv1d,
    f_b_proj and g_b_proj column-parallel, g_a_proj and o_norm replicated, A_log and dt_bias by heads,
    o_proj row-parallel."""
    h, d, k, hidden = m.heads, m.head_dim, m.conv_kernel, spec.hidden_size
    proj, p, quantity = h * d, f"{names.layer}{names.attn}", (HEADS, h)

    def head(label, rows, size=d):
        return [[label, 0, rows, size, "head"]]

    def plan(suffix, attr, shape, sources, tp_dim=0, family="kda", **kw):
        return param(f"{p}{suffix}", family, _owned(m, attr), shape, sources, tp_dim=tp_dim, layers=layers,
                     quantity=quantity, **kw)

    whole = "held whole on every GPU"
    in_proj = [Source(f"{p}{n}_proj.weight", (proj, hidden), i, sections=head(n, proj))
               for i, n in enumerate("qkv")]
    in_proj += [Source(f"{p}b_proj.weight", (h, hidden), 3, sections=head("b", h, 1)),
                Source(f"{p}f_a_proj.weight", (d, hidden), 4, sections=[["f_a", 0, d, d, "whole"]])]
    conv = [Source(f"{p}{n}_conv1d.weight", (proj, 1, k), i, sections=head(n, proj))
            for i, n in enumerate("qkv")]
    return [
        plan("in_proj_qkvgfab.weight", "in_proj_qkvgfab.weight", (3 * proj + h + d, hidden), in_proj,
             note="q, k, v and b cut by heads; f_a_proj " + whole),
        plan("conv1d.weight", "conv1d.weight", (3 * proj, 1, k), conv, element_bytes=FP32,
             note="float32 on the GPU (vLLM builds it so; the checkpoint may store bf16)"),
        plan("f_b_proj.weight", "f_b_proj.weight", (proj, d),
             [Source(f"{p}f_b_proj.weight", (proj, d), sections=head("f_b", proj))]),
        plan("g_a_proj.weight", "g_a_proj.weight", (d, hidden),
             [Source(f"{p}g_a_proj.weight", (d, hidden), split=False)], note=whole),
        plan("g_b_proj.weight", "g_b_proj.weight", (proj, d),
             [Source(f"{p}g_b_proj.weight", (proj, d), sections=head("g_b", proj))]),
        plan("A_log", "A_log", (h,), [Source(f"{p}A_log", (h,), disk=(1, 1, h, 1))], element_bytes=FP32,
             note="stored [1, 1, heads, 1]; float32"),
        plan("dt_bias", "dt_bias", (proj,), [Source(f"{p}dt_bias", (proj,), sections=head("dt_bias", proj))],
             element_bytes=FP32, note="float32, per head and channel"),
        plan("o_norm.weight", "o_norm", (d,), [Source(f"{p}o_norm.weight", (d,), split=False)],
             note="gated RMSNorm over one head: " + whole),
        plan("o_proj.weight", "o_proj.weight", (hidden, proj),
             [Source(f"{p}o_proj.weight", (hidden, proj), sections=head("heads", proj))], tp_dim=1,
             family="o_proj"),
    ]


def pad_experts(plans: list[ParamPlan], hidden: int, inter: int, floor: int) -> None:
    """The routed experts' gate/up and down plans as KimiMoE builds them: each GPU's share of
    moe_intermediate_size padded up to `floor` when tp cuts it finer, its rows at the front, zeros after."""
    gate_up, down = plans
    gate_up.build = lambda tp, r: (lambda mod: (mod, mod.weight))(
        PaddedExpertsGateUp(PROBE, inter, floor, tp, r, dtype=DT))
    down.build = lambda tp, r: (lambda mod: (mod, mod.weight))(
        PaddedExpertsDown(inter, PROBE, floor, tp, r, dtype=DT))
    for plan in plans:
        plan.layer_class = class_name(plan.build)
        plan.note = " · ".join(filter(None, [plan.note, f"each GPU's share is padded to {floor} rows of "
                                             "moe_intermediate_size when tp cuts it finer (zeros)"]))


def state_plans(spec) -> list[tuple[list[int], object]]:
    """(layers, build(tp, rank) -> module with state_shapes()) for every stateful mixer group: KDA's here, the
    others' from plan/ssm.py (its builds for KDA groups are never called)."""
    groups: dict = {}
    for i, layer in enumerate(spec.layers):
        if layer.mixer.kind == "kda":
            groups.setdefault(layer.mixer, []).append(i)
    others = [(layers, build) for layers, build in ssm.state_plans(spec)
              if spec.layers[layers[0]].mixer.kind != "kda"]
    return others + [(layers, (lambda m: lambda tp, r: KimiDeltaAttention(
        PROBE, m.heads, m.head_dim, m.conv_kernel, tp, r))(m)) for m, layers in groups.items()]

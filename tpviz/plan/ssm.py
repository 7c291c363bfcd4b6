"""Plans of the non-attention mixers: which checkpoint tensors each loads, and the state it keeps."""
from tpviz.config.kinds import STATEFUL, Mixer
from tpviz.errors import TPSizeError
from tpviz.layers.linear import RowParallelLinear
from tpviz.layers.ssm import GatedDeltaNet, Mamba2Mixer, MambaMixer, ShortConv
from tpviz.plan.core import DT, FP32, PROBE, ParamPlan, Source, norm, param, shared
from tpviz.archs.names import Names

FAMILY = {"gated_deltanet": "linear_attn", "mamba1": "mamba1", "mamba2": "mamba", "short_conv": "conv"}
# A / A_log: vLLM 0.33 builds it in float32 (FP32) whatever the model's dtype (mamba_mixer.py,
# mamba_mixer2.py, qwen_gdn_linear_attn.py)
A_NOTE = "loaded as A = -exp(A_log), float32 on the GPU (the checkpoint may store bf16)"


def build_mixer(spec, m: Mixer, tp: int, r: int, kernel: int = PROBE):
    """One rank's mixer module; tensors are traced at probe width (hidden and kernel) to stay cheap. A real
    kernel builds it for its state shapes, which never depend on hidden: that stays probe-wide too."""
    hidden = PROBE
    if m.kind == "gated_deltanet":
        return GatedDeltaNet(hidden, m.groups, m.heads, m.key_dim, m.head_dim, kernel, tp, r, dtype=DT,
                             interleaved=not spec.arch.deltanet_split)
    if m.kind == "mamba1":
        if kernel != PROBE:
            return MambaMixer(hidden, m.inner, m.state, m.dt_rank, kernel, tp, r, conv_bias=spec.conv_bias,
                              dtype=DT)
        # probed: x_proj's rows, dt_proj's columns and A's state columns are not cut, so probe-wide
        mixer = MambaMixer(hidden, m.inner, PROBE, PROBE, kernel, tp, r, conv_bias=spec.conv_bias, dtype=DT)
        mixer.x_proj = RowParallelLinear(m.inner, PROBE, tp, r, dtype=DT)
        return mixer
    if m.kind == "mamba2":
        try:
            return Mamba2Mixer(hidden, m.heads, m.head_dim, m.groups, m.state, kernel, tp, r,
                               conv_bias=spec.conv_bias, bias=spec.mlp_bias, dtype=DT)
        except TPSizeError as e:  # the groups as the config names them (Zamba2's mamba_ngroups)
            if (key := dict(spec.arch.config_keys).get(e.quantity)) is None:
                raise
            raise TPSizeError(str(e).replace(e.quantity, key, 1), key, e.value, e.tp) from None
    return ShortConv(spec.hidden_size, kernel, tp, r, bias=spec.conv_bias, dtype=DT, input_size=hidden)


def _plans(spec, m: Mixer, layers, prefix: str, tensors: list) -> list[ParamPlan]:
    """tensors: (checkpoint suffix, attribute path, full shape, split dim, sections, quantity), or for a
    parameter loaded from several checkpoint tensors, (param suffix, attribute, shape, dim, sources, quantity)
    where sources are (checkpoint suffix, shape, shard id, sections)."""
    # one mixer per rank serves all its tensors' plans: the tracer refills each one
    out, built = [], shared(lambda tp, r: build_mixer(spec, m, tp, r))
    for suffix, attr, shape, dim, secs, quantity in tensors:
        if secs and isinstance(secs[0], tuple):  # several checkpoint tensors into one parameter
            srcs = [Source(f"{prefix}{n}", sh, sid, sections=sec) for n, sh, sid, sec in secs]
            out.append(param(f"{prefix}{suffix}", FAMILY[m.kind],
                             (lambda a: lambda tp, r: _attr(spec, m, tp, r, a, built))(
                attr), shape, srcs, tp_dim=0, layers=layers, quantity=quantity))
            continue
        build = (lambda a: lambda tp, r: _attr(spec, m, tp, r, a, built))(attr)
        name = f"{prefix}{suffix}"
        src = Source(name, shape, None, split=dim is not None, sections=secs)
        plan = param(name, FAMILY[m.kind], build, shape, [src], tp_dim=dim or 0,
                     layers=layers, quantity=quantity)
        out.append(plan)
    return out


def _attr(spec, m: Mixer, tp: int, r: int, attr: str, built):
    """(the layer that owns the parameter, the parameter): out_proj's RowParallelLinear, or the mixer
    itself."""
    owner = built(tp, r)
    *path, last = attr.split(".")
    for part in path:
        owner = getattr(owner, part)
    return owner, getattr(owner, last)


def _split_projections(nk, nv, dk, dv, hidden) -> list:
    """Qwen3.5: in_proj_qkv [q | k | v] and in_proj_z into one merged table, in_proj_b and in_proj_a into
    another."""
    kd, vd = nk * dk, nv * dv
    qkv = [["q", 0, kd, dk, "key head"], ["k", kd, 2 * kd, dk, "key head"],
           ["v", 2 * kd, 2 * kd + vd, dv, "value head"]]
    return [("in_proj_qkvz.weight", "in_proj_qkvz.weight", (2 * kd + 2 * vd, hidden), 0,
             [("in_proj_qkv.weight", (2 * kd + vd, hidden), (0, 1, 2), qkv),
              ("in_proj_z.weight", (vd, hidden), 3, [["z", 0, vd, dv, "value head"]])],
             ("linear_num_key_heads", nk)),
            ("in_proj_ba.weight", "in_proj_ba.weight", (2 * nv, hidden), 0,
             [("in_proj_b.weight", (nv, hidden), 0, []), ("in_proj_a.weight", (nv, hidden), 1, [])],
             ("linear_num_value_heads", nv))]


def gated_deltanet(spec, names: Names, rules, m: Mixer, layers) -> list[ParamPlan]:
    nk, nv, dk, dv, hidden, k = m.groups, m.heads, m.key_dim, m.head_dim, spec.hidden_size, m.conv_kernel
    per = nv // nk  # value heads per key head
    kd, vd = nk * dk, nv * dv
    group = 2 * dk + 2 * per * dv
    heads = ("linear_num_value_heads", nv)
    projections = _split_projections(nk, nv, dk, dv, hidden) if spec.arch.deltanet_split else [
        ("in_proj_qkvz.weight", "in_proj_qkvz.weight", (nk * group, hidden), 0,
         [["q|k|v|z", 0, nk * group, group, "key-head group"]], ("linear_num_key_heads", nk)),
        ("in_proj_ba.weight", "in_proj_ba.weight", (2 * nv, hidden), 0,
         [["b|a", 0, 2 * nv, 2 * per, "key-head group"]], ("linear_num_key_heads", nk))]
    plans = _plans(spec, m, layers, f"{names.layer}{names.linear_attn}", projections + [
        ("conv1d.weight", "conv1d.weight", (2 * kd + vd, 1, k), 0,
         [["q", 0, kd, dk, "key head"], ["k", kd, 2 * kd, dk, "key head"],
          ["v", 2 * kd, 2 * kd + vd, dv, "value head"]],
         ("linear_num_key_heads", nk)),
        ("A_log", "A_log", (nv,), 0, [], heads),
        ("dt_bias", "dt_bias", (nv,), 0, [], heads),
        ("norm.weight", "norm", (dv,), None, [], None),
        ("out_proj.weight", "out_proj.weight", (hidden, vd), 1,
         [["value heads", 0, vd, dv, "value head"]], heads),
    ])
    return _fp32_a(plans, "float32 on the GPU, as vLLM builds it (the checkpoint may store bf16)")


def mamba2(spec, names: Names, rules, m: Mixer, layers) -> list[ParamPlan]:
    h, d, g, n, hidden, k = m.heads, m.head_dim, m.groups, m.state, spec.hidden_size, m.conv_kernel
    inter, gs = h * d, g * n
    heads = (dict(spec.arch.config_keys).get("mamba_num_heads", "mamba_num_heads"), h)
    secs = [["z", 0, inter, d, "head"], ["x", inter, 2 * inter, d, "head"],
            ["B", 2 * inter, 2 * inter + gs, n, "group"],
            ["C", 2 * inter + gs, 2 * inter + 2 * gs, n, "group"],
            ["dt", 2 * inter + 2 * gs, 2 * inter + 2 * gs + h, 1, "head"]]
    conv_secs = [["x", 0, inter, d, "head"], ["B", inter, inter + gs, n, "group"],
                 ["C", inter + gs, inter + 2 * gs, n, "group"]]
    tensors = [("in_proj.weight", "in_proj.weight", (2 * inter + 2 * gs + h, hidden), 0, secs, heads),
               ("conv1d.weight", "conv1d.weight", (inter + 2 * gs, 1, k), 0, conv_secs, heads)]
    if spec.conv_bias:
        tensors.append(("conv1d.bias", "conv1d.bias", (inter + 2 * gs,), 0, conv_secs, heads))
    tensors += [("A_log", "A_log", (h,), 0, [], heads), ("D", "D", (h,), 0, [], heads),
                ("dt_bias", "dt_bias", (h,), 0, [], heads),
                ("norm.weight", "norm", (inter,), 0, [["heads", 0, inter, d, "head"]], heads),
                ("out_proj.weight", "out_proj.weight", (hidden, inter), 1,
                 [["heads", 0, inter, d, "head"]], heads)]
    if m.no_norm:  # Falcon-H1 without mamba_rms_norm: vLLM's gated norm registers no weight
        tensors = [t for t in tensors if t[0] != "norm.weight"]
    return _fp32_a(_plans(spec, m, layers, f"{names.layer}{names.mamba}", tensors), A_NOTE)


def mamba1(spec, names: Names, rules, m: Mixer, layers) -> list[ParamPlan]:
    """Mamba1 (Jamba, Mamba): every inner channel's tensors cut by rank; x_proj row-parallel, its dt | B | C
    rows whole on every rank; Jamba's dt / B / C RMSNorms replicated."""
    inner, n, rank, hidden, k = m.inner, m.state, m.dt_rank, spec.hidden_size, m.conv_kernel
    q = (dict(spec.arch.config_keys).get("mamba_inner", "mamba_expand * hidden_size"), inner)
    p = f"{names.layer}{names.mamba}"
    tensors = [("in_proj.weight", "in_proj.weight", (2 * inner, hidden), 0,
                [["x", 0, inner, 0, ""], ["gate", inner, 2 * inner, 0, ""]], q),
               ("conv1d.weight", "conv1d.weight", (inner, 1, k), 0, [], q)]
    if spec.conv_bias:
        tensors.append(("conv1d.bias", "conv1d.bias", (inner,), 0, [], q))
    tensors += [("x_proj.weight", "x_proj.weight", (rank + 2 * n, inner), 1, [], q),
                ("dt_proj.weight", "dt_proj.weight", (inner, rank), 0, [], q),
                ("dt_proj.bias", "dt_proj.bias", (inner,), 0, [], q),
                ("A_log", "A", (inner, n), 0, [], q), ("D", "D", (inner,), 0, [], q),
                ("out_proj.weight", "out_proj.weight", (hidden, inner), 1, [], q)]
    plans = _fp32_a(_plans(spec, m, layers, p, tensors), A_NOTE)
    if m.no_norm:  # mamba.py: no dt / B / C norms (Mamba), or ones without a weight (Falcon-Mamba)
        return plans
    return plans + [pl for name, size in (("dt_layernorm", rank), ("b_layernorm", n), ("c_layernorm", n))
                    for pl in norm(f"{p}{name}", size, layers)]


def _fp32_a(plans: list[ParamPlan], note: str) -> list[ParamPlan]:
    for plan in plans:
        if plan.name.endswith("A_log"):
            plan.element_bytes, plan.note = FP32, note
    return plans


def short_conv(spec, names: Names, rules, m: Mixer, layers) -> list[ParamPlan]:
    h, k = spec.hidden_size, m.conv_kernel
    q = ("hidden_size", h)
    tensors = [("in_proj.weight", "in_proj.weight", (3 * h, h), 0,
                [["B", 0, h, 0, ""], ["C", h, 2 * h, 0, ""], ["x", 2 * h, 3 * h, 0, ""]], q),
               ("conv.weight", "conv.weight", (h, 1, k), 0, [], q),
               ("out_proj.weight", "out_proj.weight", (h, h), 1, [], q)]
    if spec.conv_bias:
        tensors[1:1] = [("in_proj.bias", "in_proj.bias", (3 * h,), 0, [], q)]
        tensors += [("conv.bias", "conv.bias", (h,), 0, [], q),
                    ("out_proj.bias", "out_proj.bias", (h,), None, [], q)]
    return _plans(spec, m, layers, f"{names.layer}{names.conv}", tensors)


def state_plans(spec) -> list[tuple[list[int], object]]:
    """(layers, build(tp, rank) -> module with state_shapes()) for every stateful mixer group."""
    groups: dict = {}
    for i, layer in enumerate(spec.layers):
        for m in layer.mixer.parts:  # Falcon-H1's Mamba2 sits beside its attention
            if m.kind in STATEFUL:
                groups.setdefault(m, []).append(i)
    return [(layers, (lambda m: lambda tp, r: build_mixer(spec, m, tp, r, m.conv_kernel))(m))
            for m, layers in groups.items()]

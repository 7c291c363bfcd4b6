"""FFN parts: a dense MLP (gated SwiGLU or a plain up/down), or routed experts with optional shared ones."""
import torch
from torch import nn

from tpviz.config.kinds import Ffn
from tpviz.errors import TPSizeError
from tpviz.layers.mxfp4 import Mxfp4Down, Mxfp4GateUp
from tpviz.plan.core import PROBE, ParamPlan, Source, column, merged, param, replicated, row
from tpviz.plan.kda import pad_experts
from tpviz.archs.names import Names
from tpviz.plan.quantized import qplan
from tpviz.rules import RuleSet
from tpviz.config.spec import ModelSpec


def dense(spec: ModelSpec, names: Names, f: Ffn, layers, rules: RuleSet) -> list[ParamPlan]:
    """gate/up merged column-parallel (or one up projection) and down row-parallel over the layer's size."""
    p, hidden, inter = f"{names.layer}{names.mlp}", spec.hidden_size, f.size
    quantity = ("intermediate_size", inter)
    # GPTBigCode: vLLM 0.33's Transformers backend has no TP plan for it
    if note := rules.dense_replicated(spec.arch):
        return [replicated(f"{p}{n}.{s}", out, inp, layers, note=note, bias=s == "bias")
                for n, out, inp in ((names.up, inter, hidden), (names.down, hidden, inter))
                for s in ("weight", "bias")[:1 + spec.mlp_bias]]
    if not spec.gated_mlp:
        return (column(f"{p}{names.up}", hidden, inter, "gate_up", layers, spec.mlp_bias, quantity,
                       disk_t=names.conv1d)
                + row(f"{p}{names.down}", inter, hidden, "down_proj", layers, spec.mlp_bias, quantity,
                      disk_t=names.conv1d))
    fused = names.gate_up_fused
    q_up = qplan(spec, rules, f"{p}{fused or names.gate}", layers)
    if spec.arch.mlp_gather:  # GLM-4 on vLLM's backend: one column split of gate | up, gathered whole
        up = column(f"{p}{fused}", hidden, 2 * inter, "gate_up", layers, spec.mlp_bias, quantity, q=q_up,
                    note="gather_output=True (the tp plan's colwise_gather_output)")
        if q_up is None:  # a quantized table's first tensor may be packed along another dim
            up[0].sources[0].sections = [["gate", 0, inter, 0, ""], ["up", inter, 2 * inter, 0, ""]]
        return up + row(f"{p}{names.down}", inter, hidden, "down_proj", layers, spec.mlp_bias, quantity,
                        note="input_is_parallel=False (the tp plan's rowwise_split_input)",
                        q=qplan(spec, rules, f"{p}{names.down}", layers))
    return (merged(f"{p}{fused or 'gate_up_proj'}", [f"{p}{names.gate}", f"{p}{names.up}"],
                   f"{p}{fused}" if fused else None, hidden, [inter, inter], "gate_up", layers, quantity,
                   bias=spec.mlp_bias, q=q_up)
            + row(f"{p}{names.down}", inter, hidden, "down_proj", layers, spec.mlp_bias, quantity,
                  q=qplan(spec, rules, f"{p}{names.down}", layers)))


def moe(spec: ModelSpec, names: Names, f: Ffn, layers, rules: RuleSet) -> list[ParamPlan]:
    """Experts: gate/up column-split and down row-split over moe_intermediate_size; router replicated."""
    p, hidden, e, inter = f"{names.layer}{names.moe or names.mlp}", spec.hidden_size, f.experts, f.size
    quantity, ex = ("moe_intermediate_size", inter), f"{p}{names.experts}"
    # gpt-oss: all experts in one tensor, gate/up interleaved, biases
    stacked = spec.arch.experts == "stacked"
    plans = [replicated(f"{p}{names.router}.weight", e, hidden, layers)]
    # vLLM 0.33's Qwen MoE blocks: tp_size > num_experts raises
    if rules.model_checks and spec.arch.moe_tp_limit:
        plans[0].build = _at_least_one_expert(plans[0].build, e, spec.model_type)
    if "router_bias" in spec.arch.extra:
        plans.append(replicated(f"{p}{names.router}.bias", e, hidden, layers, bias=True))
    if "router_scales" in spec.arch.extra:  # Gemma-4: the router input's scale, and one scale per expert
        router = names.router.rsplit(".", 1)[0]
        plans += [replicated(f"{p}{router}.{n}", size, hidden, layers, bias=True)
                  for n, size in (("scale", hidden), ("per_expert_scale", e))]
    if spec.router_score_bias:
        score = replicated(f"{p}{names.score_bias or names.router + '.e_score_correction_bias'}", e, hidden,
                           layers, bias=True)
        if names.score_bias_rows:  # squeezed by load_weights before the loader (ERNIE-4.5)
            score.sources[0].disk = (names.score_bias_rows, e)
        if spec.arch.score_bias_fp32:  # vLLM builds it in float32, as the checkpoint stores it
            score.element_bytes = 4
        plans.append(score)
    if rules.router_fp32(spec.arch):  # the router too (MiniMax-M2, ERNIE-4.5 in vLLM)
        for plan in plans:
            plan.element_bytes = 4
    if stacked and spec.quant is not None and spec.quant.scheme == "mxfp4":
        plans += mxfp4_experts(ex, hidden, inter, e, layers, quantity)
    elif stacked:
        note = ("stored stacked and transposed as [experts, hidden, 2*intermediate] with "
                "gate/up interleaved; shown per expert as [2*intermediate, hidden]: each rank "
                "takes one contiguous block of interleaved rows")
        stacked = column(f"{ex}gate_up_proj", hidden, 2 * inter, "experts", layers, True, quantity, e, note)
        stacked += row(f"{ex}down_proj", inter, hidden, "experts", layers, True, quantity, e,
                       "stored stacked and transposed as [experts, intermediate, hidden]; shown per expert")
        for plan in stacked:  # the checkpoint's stacked names: gate_up_proj, gate_up_proj_bias, ...
            # stored [experts, in, out] (transformers' GptOssExperts), biases [experts, out]
            for src in plan.sources:
                src.name = src.name.replace(".weight", "").replace(".bias", "_bias")
                src.disk = (e, *src.shape[::-1])
        plans += stacked
    # Granite-MoE, Gemma-4 ("fused": named without .weight): one stacked tensor per projection, gate | up
    # halves
    elif spec.arch.experts in ("halves", "fused"):
        fused, down = (f"{p}{names.expert_gate_up[0]}", f"{p}{names.expert_down}")
        plans += merged(f"{ex}gate_up_proj", [], fused, hidden, [inter, inter], "experts", layers, quantity,
                        e, note="stored stacked as [experts, 2*intermediate, hidden]: gate, then up rows")
        plans += row(f"{ex}down_proj", inter, hidden, "experts", layers, False, quantity, e,
                     "stored stacked as [experts, hidden, intermediate]")
        plans[-1].sources[0].name = f"{down}.weight"  # one tensor for every expert (shown per expert)
        for plan in plans[-2:] if spec.arch.experts == "fused" else []:
            plan.sources[0].name = plan.sources[0].name.removesuffix(".weight")
    # Qwen3-VL-MoE, Llama-4: one tensor per projection, [in, out]. A quantized config is refused
    # (normalize.py); the calibration's served formats alone come quantized, drawn per expert below, for bytes
    elif spec.arch.experts == "transposed" and spec.quant is None:
        plans += merged(f"{ex}gate_up_proj", [], f"{p}experts.gate_up_proj", hidden, [inter, inter],
                        "experts", layers, quantity, e, note="stored stacked and transposed as [experts, "
                        "hidden, 2*intermediate]: gate, then up columns; shown per expert as "
                        "[2*intermediate, hidden]")
        plans += row(f"{ex}down_proj", inter, hidden, "experts", layers, False, quantity, e,
                     "stored stacked and transposed as [experts, intermediate, hidden]; shown per expert")
        for plan in plans[-2:]:  # vLLM's FusedMoE loads them with is_fused_checkpoint_transposed
            src = plan.sources[0]
            src.name, src.disk = src.name.removesuffix(".weight"), (e, *src.shape[::-1])
        plans[-1].sources[0].name = f"{p}experts.down_proj"
    elif spec.arch.experts == "ungated":  # Nemotron-H experts: up and down only (relu2)
        plans += column(f"{ex}{names.up}", hidden, inter, "experts", layers, False, quantity, e)
        plans += row(f"{ex}{names.expert_down}", inter, hidden, "experts", layers, False, quantity, e)
    else:
        parts = [f"{ex}{n}" for n in names.expert_gate_up]
        q_e = qplan(spec, rules, parts[0], layers, role="moe")
        plans += merged(f"{ex}gate_up_proj", parts, None, hidden, [inter, inter], "experts",
                        layers, quantity, e, q=q_e)
        plans += row(f"{ex}{names.expert_down}", inter, hidden, "experts", layers, False, quantity, e,
                     q=qplan(spec, rules, f"{ex}{names.expert_down}", layers, role="moe"))
        if spec.arch.moe_min_partition:  # Kimi-Linear: each GPU's share padded up to a floor
            pad_experts(plans[-2:], hidden, inter, spec.arch.moe_min_partition)
    if f.shared:
        sh = f"{names.layer if names.shared_outside else p}{names.shared}"
        qty, fused = (names.shared_size_key, f.shared), names.shared_fused
        q_sh = qplan(spec, rules, f"{sh}{fused or 'gate_proj'}", layers)
        if fused:  # Granite-4: one stacked [gate | up] table, cut like any merged gate/up
            plans += merged(f"{sh}{fused}", [], f"{sh}{fused}", hidden, [f.shared] * 2, "gate_up", layers,
                            qty, note="shared expert", q=q_sh)
        elif spec.gated_mlp:
            plans += merged(f"{sh}gate_up_proj", [f"{sh}gate_proj", f"{sh}up_proj"], None,
                            hidden, [f.shared] * 2, "gate_up", layers, qty, note="shared expert", q=q_sh)
        else:
            plans += column(f"{sh}{names.up}", hidden, f.shared, "gate_up", layers, False, qty,
                            note="shared expert", q=qplan(spec, rules, f"{sh}{names.up}", layers))
        plans += row(f"{sh}{names.shared_down}", f.shared, hidden, "down_proj", layers, False, qty,
                     note="shared expert", q=qplan(spec, rules, f"{sh}{names.shared_down}", layers))
    if names.shared_gate and f.shared:
        plans.append(replicated(f"{p}{names.shared_gate}.weight", 1, hidden, layers))
    return plans


def _at_least_one_expert(build, experts: int, model_type: str):
    """vLLM 0.33's Qwen MoE blocks refuse a tp larger than the expert count, expert parallelism or not."""
    def checked(tp, r):
        if tp > experts:
            raise TPSizeError(f"tp_size={tp} is greater than num_experts={experts}; vLLM's "
                              f"{model_type} MoE block refuses it", "num_experts", experts, tp)
        return build(tp, r)
    return checked


def _full_bias(hidden: int, inter: int):
    def build(tp, r):
        m = Mxfp4Down(PROBE, inter, tp, r)
        m.bias = nn.Parameter(torch.zeros(hidden, dtype=torch.float64), requires_grad=False)
        m.bias.weight_loader = m.weight_loader  # the layer's own rule: GPU 0 loads it, the others keep zeros
        return m, m.bias
    return build


def mxfp4_experts(ex: str, hidden: int, inter: int, experts: int, layers, quantity) -> list[ParamPlan]:
    """gpt-oss MXFP4 experts: blocks (2 fp4 per byte), E8M0 scales (one per 32) and bf16 biases, cut by
    vLLM's 32-value rule (layers/mxfp4.py); shown per expert."""
    stacked = "stored stacked for all experts; gate/up rows interleaved; shown per expert"
    out = []
    for cls, part, attr, shape, dim, nbytes, note in (
            (Mxfp4GateUp, "gate_up_proj", "blocks", (2 * inter, hidden // 2), 0, 1, "2 fp4 values per byte"),
            (Mxfp4GateUp, "gate_up_proj", "scales", (2 * inter, hidden // 32), 0, 1,
             "one E8M0 scale per 32 values"),
            (Mxfp4GateUp, "gate_up_proj", "bias", (2 * inter,), 0, 2, ""),
            (Mxfp4Down, "down_proj", "blocks", (hidden, inter // 2), 1, 1, "2 fp4 values per byte"),
            (Mxfp4Down, "down_proj", "scales", (hidden, inter // 32), 1, 1, "one E8M0 scale per 32 values"),
            (Mxfp4Down, "down_proj", "bias", (hidden,), 0, 2, "loaded by GPU 0 only: the others hold zeros")):
        name = f"{ex}{part}_{attr}"
        build = (lambda c, a: lambda tp, r: (lambda m: (m, getattr(m, a)))(c(PROBE, inter, tp, r)))(cls, attr)
        if (part, attr) == ("down_proj", "bias"):  # traced along hidden: a full-width bias on a probe-wide
            build = _full_bias(hidden, inter)       # layer, so the blocks never cost hidden x inter
        out.append(param(name, "experts" if attr != "bias" or part == "gate_up_proj" else "replicated", build,
                         shape, [Source(name, shape, dim=dim,
                                        split=part == "gate_up_proj" or attr != "bias")],
                         tp_dim=dim, layers=layers, experts=experts, quantity=quantity, element_bytes=nbytes,
                         by_rank=(part, attr) == ("down_proj", "bias"),
                         note=" · ".join(filter(None, [stacked, note]))))
    return out

"""FFN parts: a dense MLP (gated SwiGLU or a plain up/down), or routed experts with optional shared ones."""
from tpviz.arch import Ffn
from tpviz.plan.core import ParamPlan, column, merged, replicated, row
from tpviz.plan.names import Names
from tpviz.spec import ModelSpec


def dense(spec: ModelSpec, names: Names, f: Ffn, layers) -> list[ParamPlan]:
    """gate/up merged column-parallel (or one up projection) and down row-parallel over the layer's size."""
    p, hidden, inter = f"{names.layer}{names.mlp}", spec.hidden_size, f.size
    quantity = ("intermediate_size", inter)
    if spec.model_type == "gpt_bigcode":  # vLLM 0.33 runs it on the Transformers backend, with no TP plan for the MLP
        note = "vLLM 0.33 serves GPTBigCode through its Transformers backend, which does not split this MLP"
        return [replicated(f"{p}{n}.{s}", out, inp, layers, note=note, bias=s == "bias")
                for n, out, inp in ((names.up, inter, hidden), (names.down, hidden, inter))
                for s in ("weight", "bias")[:1 + spec.mlp_bias]]
    if not spec.gated_mlp:
        return (column(f"{p}{names.up}", hidden, inter, "gate_up", layers, spec.mlp_bias, quantity,
                       disk_t=names.conv1d)
                + row(f"{p}{names.down}", inter, hidden, "down_proj", layers, spec.mlp_bias, quantity,
                      disk_t=names.conv1d))
    fused = names.gate_up_fused
    return (merged(f"{p}{fused or 'gate_up_proj'}", [f"{p}{names.gate}", f"{p}{names.up}"],
                   f"{p}{fused}" if fused else None, hidden, [inter, inter], "gate_up", layers, quantity,
                   bias=spec.mlp_bias)
            + row(f"{p}{names.down}", inter, hidden, "down_proj", layers, spec.mlp_bias, quantity))


def moe(spec: ModelSpec, names: Names, f: Ffn, layers) -> list[ParamPlan]:
    """Experts: gate/up column-split and down row-split over moe_intermediate_size; router replicated."""
    p, hidden, e, inter = f"{names.layer}{names.mlp}", spec.hidden_size, f.experts, f.size
    quantity, ex = ("moe_intermediate_size", inter), f"{p}{names.experts}"
    gpt_oss = spec.model_type == "gpt_oss"
    plans = [replicated(f"{p}{names.router}.weight", e, hidden, layers)]
    if gpt_oss:
        plans.append(replicated(f"{p}{names.router}.bias", e, hidden, layers, bias=True))
    if spec.model_type.startswith("deepseek") or spec.model_type == "nemotron_h":
        plans.append(replicated(f"{p}{names.router}.e_score_correction_bias", e, hidden, layers, bias=True))
    if gpt_oss:
        note = ("stored stacked and transposed as [experts, hidden, 2*intermediate] with gate/up interleaved; "
                "shown per expert as [2*intermediate, hidden]: each rank takes one contiguous block of interleaved rows")
        stacked = column(f"{ex}gate_up_proj", hidden, 2 * inter, "experts", layers, True, quantity, e, note)
        stacked += row(f"{ex}down_proj", inter, hidden, "experts", layers, True, quantity, e,
                       "stored stacked and transposed as [experts, intermediate, hidden]; shown per expert")
        for plan in stacked:  # the checkpoint's stacked names: gate_up_proj, gate_up_proj_bias, ...
            for src in plan.sources:
                src.name = src.name.replace(".weight", "").replace(".bias", "_bias")
        plans += stacked
    elif not spec.gated_mlp:  # Nemotron-H experts: up and down only (relu2)
        plans += column(f"{ex}{names.up}", hidden, inter, "experts", layers, False, quantity, e)
        plans += row(f"{ex}{names.expert_down}", inter, hidden, "experts", layers, False, quantity, e)
    else:
        parts = [f"{ex}{n}" for n in names.expert_gate_up]
        plans += merged(f"{ex}gate_up_proj", parts, None, hidden, [inter, inter], "experts", layers, quantity, e)
        plans += row(f"{ex}{names.expert_down}", inter, hidden, "experts", layers, False, quantity, e)
    if f.shared:
        sh, q = f"{p}{names.shared}", ("shared_expert_intermediate_size", f.shared)
        if spec.gated_mlp:
            plans += merged(f"{sh}gate_up_proj", [f"{sh}gate_proj", f"{sh}up_proj"], None, hidden, [f.shared] * 2,
                            "gate_up", layers, q, note="shared expert")
        else:
            plans += column(f"{sh}{names.up}", hidden, f.shared, "gate_up", layers, False, q, note="shared expert")
        plans += row(f"{sh}down_proj", f.shared, hidden, "down_proj", layers, False, q, note="shared expert")
    if names.shared_gate and f.shared:
        plans.append(replicated(f"{p}{names.shared_gate}.weight", 1, hidden, layers))
    return plans

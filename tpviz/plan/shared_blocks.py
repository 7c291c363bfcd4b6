"""Zamba2's layers as vLLM 0.33's zamba2.py builds them: Mamba2 layers, and hybrid layers whose shared
transformer block is stored once per block and run by every num_mem_blocks-th hybrid layer.

A block's attention reads [hidden | the embeddings] (2 x hidden wide): q/k/v one QKVParallelLinear over all
heads (no fewer KV heads), o_proj back to hidden; its MLP a fused gate_up_proj (split in two, then by rank)
and down_proj. Each hybrid layer j has LoRA adapters on gate_up (and on q, k and v when the config says):
A a ColumnParallelLinear whose adapter_rank outputs are all-gathered (gather_output=True), B cut like the
projection it adds to. They live in block j % num_mem_blocks's lists as index j; vLLM renames .0 / .1 to
.A / .B. The hybrid layer's `linear` is replicated, its Mamba2 is under mamba_decoder.
"""
from dataclasses import replace

from tpviz.config.spec import ModelSpec
from tpviz.plan import ffn, ssm
from tpviz.plan.attention import qkv
from tpviz.plan.core import ParamPlan, column, merged, norm, replicated, row
from tpviz.archs.names import Names
from tpviz.rules import RuleSet

A_GATHERED = "gather_output=True: every GPU all-gathers the adapter_rank outputs before B"


def zamba2(spec: ModelSpec, names: Names, rules: RuleSet) -> list[ParamPlan]:
    """Every per-layer plan of a Zamba2 model (the embedding and final norm are planned as for any)."""
    p, hidden = names.layer, spec.hidden_size
    hybrid = [i for i, layer in enumerate(spec.layers) if layer.mixer.beside]
    mamba = [i for i, layer in enumerate(spec.layers) if not layer.mixer.beside]
    plans = []
    if mamba:
        plans += norm(f"{p}input_layernorm", hidden, mamba)
        plans += ssm.mamba2(spec, names, rules, spec.layers[mamba[0]].mixer, mamba)
    attn, f = spec.layers[hybrid[0]].mixer, spec.layers[hybrid[0]].ffn
    plans += norm(f"{p}mamba_decoder.input_layernorm", hidden, hybrid)
    plans += ssm.mamba2(spec, replace(names, mamba="mamba_decoder.mamba."), rules, attn.beside, hybrid)
    plans.append(replicated(f"{p}linear.weight", hidden, hidden, hybrid))
    return plans + shared_blocks(spec, names, rules, attn, f, hybrid) + adapters(spec, names, hybrid)


def shared_blocks(spec, names: Names, rules, attn, f, hybrid: list[int]) -> list[ParamPlan]:
    """The num_mem_blocks blocks, each stored under its first hybrid layer and run by every
    num_mem_blocks-th."""
    hidden, n = spec.hidden_size, spec.shared_blocks
    stored = hybrid[:n]
    st = f"{names.layer}shared_transformer."
    plans = (norm(f"{st}input_layernorm", 2 * hidden, stored) + norm(f"{st}pre_ff_layernorm", hidden, stored)
             + qkv(replace(spec, hidden_size=2 * hidden), names, rules, attn, stored, False)
             + row(f"{st}self_attn.o_proj", attn.heads * attn.head_dim, hidden, "o_proj", stored, False,
                   ("num_attention_heads", attn.heads)))
    if f.kind == "dense":  # (a copy without FFNs, read for its KV heads alone, has none)
        plans += ffn.dense(spec, names, f, stored, rules)
    note = f"a shared block: stored in layer{'s' * (n > 1)} {', '.join(map(str, stored))}, run by all " \
           f"{len(hybrid)} hybrid layers in turn"
    for plan in plans:
        plan.runs, plan.note = hybrid, " · ".join(filter(None, [plan.note, note]))
    return plans


def adapters(spec, names: Names, hybrid: list[int]) -> list[ParamPlan]:
    """Each hybrid layer's LoRA adapters, stored in its block's lists (index j: the j-th hybrid layer)."""
    hidden, rank, n = spec.hidden_size, spec.adapter_rank, spec.shared_blocks
    inter = spec.layers[hybrid[0]].ffn.size
    at = [[hybrid[j % n], j] for j in range(len(hybrid))]
    st, quantity = f"{names.layer}shared_transformer.", ("adapter_rank", rank)
    lists = [(f"{st}feed_forward.gate_up_proj_adapter_list", hidden, [inter, inter], "gate_up")]
    if not inter:  # a copy without FFNs (read for its KV heads alone)
        lists = []
    if spec.attention_adapters:
        lists += [(f"{st}self_attn.linear_{x}_adapter_list", 2 * hidden, 2 * hidden, "qkv") for x in "qkv"]
    plans = []
    for prefix, inp, out, family in lists:
        a = column(f"{prefix}.*.0", inp, rank, family, hybrid, False, quantity, note=A_GATHERED)
        b = (merged(f"{prefix}.*.1", [], f"{prefix}.*.1", rank, out, family, hybrid, quantity) if isinstance(
            out, list) else column(f"{prefix}.*.1", rank, out, family, hybrid, False, quantity))
        for plan, part in ((a[0], "A"), (b[0], "B")):
            plan.name, plan.stored_at = f"{prefix}.*.{part}.weight", at
            plans.append(plan)
    return plans

"""What each GPU of a layout sends per decoded token, stage by stage: the bytes of each kind of collective,
how many of them a forward pass runs (each pays its latency) and over which group of GPUs."""
from dataclasses import dataclass

from tpviz.config.spec import ModelSpec
from tpviz.deploy.parallel import stage_layers
from tpviz.rules import Layout, RuleSet, ruleset
from tpviz.trace.collectives import (adapter_collectives, altup_laurel_collectives, logits_collective,
                                     mixer_collectives, mlp_gather_collectives, norm_collectives,
                                     per_layer_collectives, shared_collectives)

# the kinds, as the CLI and the speed bound name them
COMM_LABELS = {"tp_all_reduce": "TP all-reduces (and gathered outputs' all-gathers: GLM-4's MLP, "
                                "Zamba2's adapters)",
               "moe_all_reduce": "MoE all-reduces",
               "moe_dispatch_combine": "MoE dispatch/combine over dp", "pp_send_recv": "PP hand-off",
               "norm_collectives": "norm all-gathers / all-reduces",
               "embed_all_reduce": "embedding all-reduce (and per-layer input / AltUp stream gathers)",
               "dp_gather_scatter": "attention-DP gather and scatter (at least)",
               "logits_gather": "logits gather (per sampled token)"}
LEAST = ("dp_gather_scatter",)  # kinds only carved_traffic's lower bound has
LEAST_NOTE = ("their speed bound counts the least they send (an all-gather and a reduce-scatter of tokens "
              "per FFN layer), so beside vLLM's rows theirs is the more optimistic")
# which GPUs each kind runs over: a stage's tp GPUs, its EP group (dp x tp), or the next stage's
GROUP = {"moe_dispatch_combine": "ep", "dp_gather_scatter": "ep", "pp_send_recv": "pp"}


def ring(n: int) -> float:
    """The share of a tensor each of n GPUs sends in a ring all-reduce."""
    return 2 * (n - 1) / n if n > 1 else 0.0


@dataclass(frozen=True)
class Traffic:
    """One kind of collective on the busiest GPU of a stage."""
    kind: str  # a COMM_LABELS key
    sent: float  # bytes per token
    count: int  # collectives per forward pass
    over: str = ""  # the group it runs over, when not its kind's (SGLang's attention TP: "attn")

    @property
    def group(self) -> str:
        return self.over or GROUP.get(self.kind, "tp")


def stage_traffic(spec: ModelSpec, layout: Layout, rules: RuleSet | str = "vllm",
                  all2all: str = "allgather_reducescatter",
                  least: bool = False) -> list[list[Traffic]] | None:
    """Per pipeline stage, its collectives, as vLLM 0.33 runs a forward pass over the stage's layers: ring
    all-reduces over the tp GPUs after the mixers, dense FFNs and MoE blocks (with or without EP: the block's
    final reduce); with dp > 1 a vLLM MoE block also gathers every replica's tokens and reduce-scatters them
    back (the default allgather_reducescatter all2all backend, one hidden state per other replica each way;
    SGLang's --dp-size replicas hold every expert each and exchange nothing).
    Between stages vLLM 0.33 sends the hidden state and the residual (IntermediateTensors), each tp GPU its
    1/tp slice, which the next stage's tp GPUs all-gather (v1/worker/gpu_worker.py: isend_tensor_dict with
    all_gather_group). The first stage all-reduces the embedding; the last gathers the logits (the rule set
    says how); OLMo-2/3 all-gather q and k in every attention layer (collectives.norm_collectives). With
    all2all="deepep" (--all2all-backend deepep_*) a token goes only to the GPUs of its top-k experts: k
    hidden states each way, (ep - 1) / ep of them to other GPUs. SGLang's attention DP and EP inside tp:
    None, or with least=True carved_traffic's lower bound."""
    rules = ruleset(rules)
    if layout.attn_dp > 1 or layout.ep_size > 1:
        return carved_traffic(spec, layout, rules) if least else None
    hidden = spec.hidden_size * spec.dtype_bytes
    moe_layers, tp, pp = set(spec.moe_layers), layout.tp, layout.pp
    whole = bool(rules.dense_replicated(spec.arch))  # GPTBigCode's MLP on vLLM: on every GPU, no reduce
    logits = rules.padded_vocab(spec.vocab_size, tp) * spec.dtype_bytes
    logits_sent = logits_collective(logits, tp, rules).sent_per_rank if tp > 1 else 0.0
    # Gemma-3n's and Gemma-4's per-layer inputs, and Gemma-3n's AltUp stream gathers, beside the embedding's
    # (Gemma-3n runs no pp: its last stage is its first)
    per_layer = per_layer_collectives(spec, tp) + altup_laurel_collectives(spec, tp)[1:]
    out = []
    for stage, layers in enumerate(stage_layers(spec.num_hidden_layers, pp, rules)):
        mine = [spec.layers[i] for i in layers]
        moe = sum(1 for i in layers if i in moe_layers)
        # a shared MLP reduced apart from its experts (Granite-4 hybrids): a second all-reduce in the layer
        reduces = moe + sum(c.count for c in shared_collectives(spec, tp, layers))
        reduced = sum(1 for x in mine if x.ffn.kind == "dense" and not whole) + sum(
            len(x.mixer.parts) for x in mine if x.mixer.kind != "none")
        if rules.joint_reduce(spec):  # one all-reduce of attention + MLP in a layer that has both
            reduced -= sum(1 for x in mine if x.ffn.kind == "dense" and x.mixer.kind != "none")
        norms = norm_collectives(spec, tp, layers)
        # Mamba1's x_proj, Gemma-3n's LAuReL linear_right, GLM-4's gathered gate_up_proj
        inner = (mixer_collectives(spec, tp, layers) + altup_laurel_collectives(spec, tp, layers)[:1]
                 + mlp_gather_collectives(spec, tp, layers) + adapter_collectives(spec, tp, layers))
        sent = 2 * hidden / tp if stage < pp - 1 else 0.0  # its slice of hidden state and residual onward
        gathered = 2 * hidden * (tp - 1) / tp if stage > 0 else 0.0  # the slice it received, to its tp peers
        tp_ops, group = tp > 1, layout.dp * tp
        spread = layout.dp > 1 and rules.dp_moe_exchange
        if not spread:
            dispatch = 0.0
        elif all2all == "deepep":
            dispatch = 2 * spec.num_experts_per_tok * hidden * (group - 1) / group
        else:
            dispatch = 2 * (layout.dp - 1) * hidden
        out.append([t for t in (
            Traffic("tp_all_reduce",
                    ring(tp) * hidden * reduced + sum(c.count * c.sent_per_rank for c in inner),
                    reduced * tp_ops + sum(c.count for c in inner)),
            Traffic("moe_all_reduce", ring(tp) * hidden * reduces, reduces * tp_ops),
            Traffic("moe_dispatch_combine", dispatch * moe, 2 * moe * spread),
            Traffic("pp_send_recv", sent + gathered, (stage < pp - 1) + (stage > 0 and tp_ops)),
            Traffic("norm_collectives", sum(c.count * c.sent_per_rank for c in norms),
                    sum(c.count for c in norms)),
            Traffic("embed_all_reduce", ring(tp) * hidden + sum(c.sent_per_rank for c in per_layer)
                    if stage == 0 else 0.0, (1 + len(per_layer)) * int(stage == 0 and tp_ops)),
            Traffic("logits_gather", logits_sent if stage == pp - 1 else 0.0,
                    int(stage == pp - 1 and tp_ops)))
            if t.count])
    return out


def carved_traffic(spec: ModelSpec, layout: Layout, rules: RuleSet) -> list[list[Traffic]] | None:
    """The least SGLang 0.5.23 sends per token of a stage with attention DP or EP inside tp, bytes per token
    of the whole stage: each attention group all-reduces its own tokens over its attn_tp GPUs; an FFN layer
    cut wider than the group (MoE, and dense unless --moe-dense-tp-size 1) needs every group's tokens and
    sends the sums back, at least an all-gather and a reduce-scatter of them (its padded all-reduce or
    all-gather moves more); without attention DP the MoE output is all-reduced over tp. The embedding and
    the logits are left out. None for a model whose attention is not cut over attn_tp under attention DP."""
    w, tp, dp = rules.widths(layout, spec.arch), layout.tp, layout.attn_dp
    if dp > 1 and w.attention != tp // dp:
        return None
    hidden = spec.hidden_size * spec.dtype_bytes
    gather = 2 * (dp - 1) / dp * hidden  # each group's tokens to the others, and their sums back
    moe_layers, out = set(spec.moe_layers), []
    for stage, layers in enumerate(stage_layers(spec.num_hidden_layers, layout.pp, rules)):
        mixers = sum(1 for i in layers if spec.layers[i].mixer.kind != "none")
        moe = sum(1 for i in layers if i in moe_layers)
        dense = 0 if layout.dense_tp1 else sum(1 for i in layers if spec.layers[i].ffn.kind == "dense")
        ffn_gathered = (moe + dense) if dp > 1 else 0
        out.append([t for t in (
            Traffic("tp_all_reduce",
                    ring(w.attention) * hidden * mixers / dp
                    + (0 if dp > 1 else ring(w.dense) * hidden * dense),
                    (mixers if w.attention > 1 else 0) + (dense if dp == 1 and w.dense > 1 else 0),
                    "attn" if dp > 1 else ""),
            Traffic("moe_all_reduce", 0.0 if dp > 1 else ring(tp) * hidden * moe, 0 if dp > 1 else moe),
            Traffic("dp_gather_scatter", gather * ffn_gathered, 2 * ffn_gathered),
            Traffic("pp_send_recv", 2 * hidden / tp if stage < layout.pp - 1 else 0.0,
                    int(stage < layout.pp - 1))) if t.count])
    return out


def comm_per_token(spec: ModelSpec, layout: Layout, rules: RuleSet | str = "vllm") -> dict[str, float] | None:
    """Bytes the busiest GPU sends per decoded token, by kind (sampled, so the logits count; a prefill token
    skips them): the busiest stage's stage_traffic. None where that is not modelled."""
    stages = stage_traffic(spec, layout, rules)
    if stages is None:
        return None
    busiest = max(stages, key=lambda s: sum(t.sent for t in s))
    return {kind: sum(t.sent for t in busiest if t.kind == kind) for kind in COMM_LABELS if kind not in LEAST}

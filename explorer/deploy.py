"""The explorer's deployment view: a tp x pp x dp (+ EP) layout's GPUs, experts and collectives."""
import streamlit as st

from tpviz.render.text import fmt_bytes
from tpviz.trace.shardmap import Deployment
from tpviz.render.plots.deployment import device_grid, expert_figure
from tpviz.render.summary import layer_span

COMM = {"tp_all_reduce": ("all-reduce over the tp GPUs", "after each attention / mixer and dense FFN "
                          "(and GLM-4's all-gather of gate | up before down_proj)"),
        "moe_all_reduce": ("all-reduce over the tp GPUs", "after each MoE block, with or without EP"),
        "moe_dispatch_combine": ("all-gather + reduce-scatter over the dp replicas",
                                 "each MoE block gathers every replica's tokens and returns their sums"),
        "pp_send_recv": ("send between stages + all-gather over the tp GPUs",
                         "hidden state and residual, a 1/tp slice from each GPU, gathered by the next stage"),
        "norm_collectives": ("all-gather / all-reduce over the tp GPUs",
                             "norms spanning the cut: OLMo's q and k, " "a one-group Mamba2 gated norm"),
        "embed_all_reduce": ("all-reduce over the tp GPUs", "after embed_tokens, on the first stage"),
        "logits_gather": ("all-gather over the tp GPUs",
                          "the lm_head's vocab blocks of each sampled token, on the " "last stage")}


def deployment_section(lay: Deployment, plot_config: dict) -> None:
    """Device grid, expert placement, one row per GPU, and this layout's communication per token."""
    st.markdown(f"### Deployment: {lay.label}")
    st.caption("Ranks as vLLM and SGLang number them (rank = (dp × pp + stage) × tp + tp rank). Every GPU "
               "holds its stage's layers at its tp rank's rows and columns (the maps "
               "below); with EP the routed experts are whole (SGLang's --ep below tp: cut tp / ep ways). "
               "SGLang's attention and MoE groups are blocks of consecutive tp ranks, the EP index outer.")
    for warning in lay.warnings:
        st.warning(warning)
    st.plotly_chart(device_grid(lay), theme=None, key="fig_device_grid", config=plot_config)
    if (fig := expert_figure(lay)) is not None:
        st.plotly_chart(fig, theme=None, key="fig_expert_placement", config=plot_config)
    st.dataframe([{"GPU": g.rank, "stage": g.pp, "replica": g.dp, "tp rank": g.tp,
                   "layers": f"{g.layers[0]}–{g.layers[1] - 1}" if g.layers[1] > g.layers[0] else "none",
                   **({"experts": layer_span(g.experts, 6) or "none"} if g.experts is not None else {}),
                   "weights": fmt_bytes(g.weight_bytes),
                   "KV cache / token": fmt_bytes(g.kv_cache_bytes_per_token) + (
                       f" + {fmt_bytes(g.kv_windowed_bytes_per_token)} up to a window"
                       if g.kv_windowed_bytes_per_token else "")}
                  for g in lay.gpus], hide_index=True, width="stretch")
    rows = [{"collective": COMM[k][0], "when": COMM[k][1], "bytes sent per decoded token": fmt_bytes(v)}
            for k, v in lay.comm_bytes_per_token.items() if v]
    if rows:
        st.dataframe(rows, hide_index=True, width="stretch")
        st.caption("As vLLM 0.33 runs them, for the busiest GPU and each decoded token (a "
                   "decoded token is sampled, so the logits count; a prefill token skips them): ring "
                   "shares summed over its stage's layers; the MoE dispatch uses the default "
                   "allgather_reducescatter backend.")
    else:
        st.caption("One GPU: nothing is communicated.")

"""The Run-live page's result view: the verdict, per-stage and per-rank charts, the greedy continuations, the
environment, and the memory estimate before a run."""
import json

import streamlit as st

from explorer.text import literal
from tpviz.live.check.memory import MemoryEstimate
from tpviz.live.check.report import environment_rows, rank_figure, stage_figure

PLOTLY_CONFIG = {"displaylogo": False}
RANK_COLUMNS = {"read % of checkpoint": st.column_config.NumberColumn("read %",
                                                                      help="share of the checkpoint read"),
                "held % of checkpoint": st.column_config.NumberColumn(
                    "held %", help="this rank's parameters in the checkpoint's own dtype, as a share of it"),
                "collective MiB": st.column_config.NumberColumn(
                    "coll. MiB", help="bytes of the tensors passed to collectives")}


def short(x: float) -> str:
    """A metric-sized number: '3.88', '0.25', '3.4e-4' (the exact values are in the line above the
    metrics)."""
    if x == 0 or 1e-2 <= abs(x) < 1e4:
        return f"{x:.3g}"
    mantissa, exponent = f"{x:.1e}".split("e")
    return f"{mantissa}e{int(exponent)}"


def show_generation(result) -> None:
    """Both continuations side by side, where they first differ and why, and that step's stage chart."""
    g = result.generation
    st.subheader("Greedy continuation")
    if g.prompt_text is not None:
        st.caption(f"Prompt ({len(g.prompt_ids)} tokens): {literal(g.prompt_text)}")
    cols = st.columns(2)
    for col, who, text, ids, eos in ((cols[0], result.layout, g.tp_text, g.tp_tokens, g.tp_stopped_at_eos),
                                     (cols[1], "tp=1", g.ref_text, g.ref_tokens, g.ref_stopped_at_eos)):
        col.caption(f"{who}: {len(ids)} new tokens" + (", stopped at EOS" if eos else ""))
        col.code(text if text is not None else " ".join(map(str, ids)), language=None, wrap_lines=True)
    where = g.divergence(result.layout)  # the explanation already says "Identical for all N new tokens"
    line = g.explanation if g.diverged_at is None else f"{where[0].upper()}{where[1:]}. {g.explanation}"
    (st.success if g.diverged_at is None else st.info if g.noise_explained else st.warning)(line)
    if g.diverged_at:
        st.plotly_chart(stage_figure(result, g.layers,
                                     f"New token #{g.diverged_at + 1}: TP vs tp=1 on the same "
                                     f"{len(g.prompt_ids) + g.diverged_at} tokens"),
                        config=PLOTLY_CONFIG, key="generation_chart")
    elif g.diverged_at == 0:
        st.caption("The first new token already differs: the chart above is that step (the "
                   "prompt's forward pass).")


def show_result(result) -> None:
    """Verdict, per-stage chart, generation, per-rank table, environment and downloads of one finished run."""
    (st.success if result.passed else st.error)(result.headline())  # a caught mismatch is a failure
    st.caption(f"Weights: random, from seed {result.seed} (not the checkpoint's)." if result.random_weights
               else "Weights: the checkpoint's own (real weights).")
    cols = st.columns([1, 1, 1, 1.35])  # the verdict is in the banner above; where it starts matters most
    cols[0].metric("max |Δlogit|", short(result.max_abs_diff))
    cols[1].metric("tolerance", short(result.tolerance))
    cols[2].metric("argmax agreement", f"{100 * result.argmax_agreement:.1f}%")
    cols[3].metric("first beyond tolerance", result.diverges_at or "none",
                   help="The first stage whose TP output differs from tp=1 by more than its tolerance")
    st.caption(literal(f"Tolerance: {result.tolerance_rule}. Relative difference (max|Δ| / max|logit|): "
                       f"{result.max_rel_diff:.3g}."))
    # MoE: a token TP sent to other experts; noise at a near tie, or a real mismatch
    if flip := result.routing:
        (st.info if flip.noise_explained else st.error)(f"Routing: {literal(flip.explanation)}.")
    for inj in result.injections:
        (st.info if inj.has_effect else st.warning)(
            f"Injected **{inj.name}**: {inj.description}. " + ("" if inj.has_effect
                                                               else "It has **no effect** here: ")
            + inj.reason + ".")
    st.plotly_chart(stage_figure(result), config=PLOTLY_CONFIG, key="stage_chart")
    if result.generation is not None:
        show_generation(result)
    st.subheader("Per rank")
    one_device = len({r.device for r in result.ranks}) == 1  # then the device is in the environment table
    rows = [r.row(result.pp_size > 1, result.ep) for r in result.ranks]
    st.dataframe([{k: v for k, v in row.items() if not (one_device and k == "device")} for row in rows],
                 hide_index=True, column_config=RANK_COLUMNS)
    st.plotly_chart(rank_figure(result), config=PLOTLY_CONFIG, key="rank_chart")
    with st.expander("Local parameter shapes per rank"):
        st.json({f"rank {r.rank}": r.param_shapes for r in result.ranks}, expanded=False)
    st.subheader("Environment")
    st.dataframe(environment_rows(result), hide_index=True)
    st.caption("Phases: " + ", ".join(f"{k} {v:.2f} s" for k, v in result.phases.items()))
    for note in result.notes:
        st.caption(literal(f"Note: {note}"))
    st.download_button("Download result JSON", json.dumps(result.to_dict(), indent=2),
                       file_name="verify.json", mime="application/json", key="download_json")


def show_memory(est: MemoryEstimate, available: dict[str, int]) -> None:
    """The estimate in one caption, and per rank in an expander."""
    st.caption(literal(f"Memory estimate: {est.summary(available)}. Not counted: a prompt's own tokens "
                       "(until it is tokenized) and each process's own torch and CUDA context."))
    with st.expander("Memory estimate per rank"):
        st.table(est.rows())  # a static table: the run's own tables stay the page's dataframes

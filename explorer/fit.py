"""The "does it fit" section: the user's GPU memory, utilization, context and concurrency against the map."""
import streamlit as st

from explorer.plan_state import MAX_GPUS, plan_link, plan_of_view
from explorer.state import EXTRAS, FIT_KEYS, HUB_SOURCES, link_markdown, with_fit
from explorer.text import literal
from tpviz.deploy.fit import GPU_SIZES_GIB, GPU_UTILIZATION, capped_context, fit, sizing_notes, speed
from tpviz.deploy.hardware import Topology, catalog
from tpviz.deploy.perf import Workload, bound_sentence
from tpviz.render.plots.perf import terms_figure
from tpviz.render.text import fmt_bytes
from tpviz.trace.shardmap import ShardMap

QUICK_GIB = (24, 40, 48, 80, 94, 141, 192, 288)  # common accelerator memory sizes (nominal GiB)


def _tokens(n: float) -> str:
    return f"{n / 1e6:.2f} M" if n >= 1e6 else f"{n / 1e3:.0f} k" if n >= 1e3 else f"{int(n)}"


def fit_rows(m: ShardMap, sizes: tuple[int, ...] = GPU_SIZES_GIB, utilization: float = GPU_UTILIZATION,
             context: int = 8192, layout=None) -> list[dict]:
    """The fit at common GPU sizes, as table rows: what vLLM may use, the room left for KV cache, how many
    tokens of full-attention KV cache that holds, and how many sequences of `context` tokens fit."""
    rows, context = [], capped_context(m.model, context)[0]
    for gib in sizes:
        f = fit(m, gib, utilization, context, layout=layout)
        rows.append({"GPU memory": f"{gib} GiB", f"vLLM may use (×{utilization:g})": fmt_bytes(f.usable),
                     "left for KV cache": fmt_bytes(f.room) if f.room > 0 else "does not fit",
                     "KV-cache tokens": _tokens(f.kv_tokens) if f.kv_tokens is not None else "—",
                     f"sequences of {context:,} tokens": f"{f.max_sequences:,}"
                     if f.room > 0 and f.per_sequence else "—"})
    return rows


def _pick() -> None:
    if st.session_state.get("gpu_pick"):
        st.session_state.gpu_mem = float(st.session_state.gpu_pick)


@st.fragment  # its inputs rerun this section alone, not the page
def fit_section(m: ShardMap, layout=None, link=None) -> None:
    """Inputs, the answer for the user's GPU, and the same at common sizes (a table drawn when opened); with a
    pp / dp / ep layout, sized for its fullest stage and its dp replicas, as the Plan page sizes it. `link`:
    the sidebar's share link (an st.empty), written with the address at every run of this section."""
    st.markdown("### Does it fit, and how fast?")
    st.pills("Quick picks (GiB)", QUICK_GIB, key="gpu_pick", on_change=_pick)
    state = st.session_state
    for key in FIT_KEYS:  # a link's values are set before the widgets: none of them passes its own default
        state.setdefault(key, EXTRAS[key][1])
    c1, c2, c3, c4 = st.columns(4)
    gib = c1.number_input("GPU memory (GiB)", 1.0, 10_000.0, step=1.0, key="gpu_mem")
    util = c2.slider("gpu_memory_utilization", 0.5, 0.98, step=0.01, key="gpu_util")
    context = c3.number_input("Context per sequence (tokens)", 1, 10_000_000, step=1024, key="context")
    concurrency = c4.number_input("Concurrent sequences", 1, 100_000, key="concurrency")
    state.setdefault("speed_on", bool(state.gpu_type))  # a link's hw= opens it
    if st.toggle("How fast? A speed bound on a GPU type", key="speed_on"):
        st.selectbox("GPU type", ["", *catalog()], key="gpu_type", on_change=_gpu_type,
                     format_func=lambda n: catalog()[n].label if n else "pick one")
    else:
        state.gpu_type = ""  # off: no GPU type in the link either
    if (query := with_fit(st.query_params.to_dict(), state)) != st.query_params.to_dict():
        st.query_params.from_dict(query)  # this section reruns alone: its inputs go in the link here
    if link is not None:  # every run, full ones too: a fragment can fill a place outside it only if it
        link.markdown(link_markdown(st.query_params.to_dict()))  # wrote there at the last full run
    plan_section(m, layout)
    f = fit(m, gib, util, int(context), int(concurrency), layout=layout)
    context = f.context  # capped at the model's max_model_len
    if f.note:
        st.warning(literal(f"{f.note}."))
    if f.room <= 0:
        st.warning(f"Does not fit: {fmt_bytes(f.weights)} of weights on the fullest GPU, and vLLM may use "
                   f"{fmt_bytes(f.usable)} of {gib:g} GiB at gpu_memory_utilization {util:g}.")
    else:
        tokens = f" ({f.kv_tokens:,} tokens of KV cache)" if f.kv_tokens is not None else ""
        verdict = st.success if f.fits else st.warning
        verdict(f"{fmt_bytes(f.room)} per GPU left for KV cache{tokens}: {f.sequences} "
                f"({'enough for' if f.fits else 'fewer than'} the {int(concurrency):,} asked for).")
    rows = fit_rows(m, QUICK_GIB, utilization=util, context=int(context), layout=layout)  # the picks' sizes
    room = [r["GPU memory"] for r in rows if r["left for KV cache"] != "does not fit"]
    label = (f"At common GPU sizes ({rows[0]['GPU memory']} to {rows[-1]['GPU memory']}): "
             + (f"room for KV cache from {room[0]} up" if room else "none leaves room for KV cache"))
    # below the fold, drawn only when opened: a tp change redraws what is on screen
    if (box := st.expander(label, key="open_fit", on_change="rerun")).open:
        box.dataframe(rows, hide_index=True, width="stretch")
    st.caption(f"Every GPU caches its share of every token; one sequence of {int(context):,} tokens holds "
               f"{fmt_bytes(f.per_sequence)} on the fullest GPU (windowed layers capped, "
               "recurrent state once). Activations, CUDA graphs and NCCL buffers take a few GiB more.")
    for note in sizing_notes(m.model, m.rules) if f.room > 0 else []:
        st.caption(literal(f"Note: {note}."))
    if state.gpu_type:  # its output length is asked only then (a link's out= without hw= has no meaning)
        output = st.number_input("Of the context, output tokens", 1, 10_000_000, key="output_len")
        speed_part(m, layout, gib, util, int(context), int(output), int(concurrency))


def plan_section(m: ShardMap, layout) -> None:
    """A link to the Plan page's ranking of every layout of these GPUs, asked with this view's inputs (a
    model the Plan page can read: a preset or a hub id, not a local folder or an upload)."""
    gpus = layout.gpus if layout else m.tp_size
    model = st.query_params.get("model")
    if model and st.session_state.get("source") in HUB_SOURCES and gpus <= MAX_GPUS:
        query = plan_of_view(model, gpus, m.rules.name, st.session_state)
        st.caption(plan_link(query, "Plan a deployment", "/Plan") + f": every layout of {gpus} GPUs for "
                   "this model, ranked by what fits" + (" and the speed bound." if query.get("hw") else "."))


def _gpu_type() -> None:  # a GPU type brings its memory
    if (name := st.session_state.get("gpu_type")) in catalog():
        st.session_state.gpu_mem = float(catalog()[name].mem_gib)


def speed_part(m: ShardMap, layout, gib: float, util: float, context: int, output: int, concurrency: int):
    """The speed bound of this layout on the chosen GPU type: TPOT, throughput, TTFT and its terms."""
    gpu = catalog()[st.session_state.gpu_type]
    if output >= context:
        st.error(f"{output:,} output tokens leave no prompt in a context of {context:,}: give fewer output "
                 "tokens or a longer context")
        return
    work, topo = Workload(context - output, output, concurrency), Topology(gpu)
    p = speed(m, topo, work, gib, util, layout)
    if p is None:
        st.caption("No speed bound: the layout does not fit one whole sequence, or its traffic is not "
                   "modelled.")
        return
    c1, c2, c3, c4 = st.columns(4)
    c1.metric("TPOT, at least", f"{p.tpot_ms:.2f} ms", f"batch {p.batch:,}", delta_color="off",
              delta_arrow="off")
    c2.metric("Output tokens/s per GPU, at most", f"{p.out_tok_s_per_gpu:,.0f}")
    c3.metric(f"TTFT for {work.input_len:,} tokens, at least", f"{p.ttft_ms:.1f} ms")
    c4.metric("Bottleneck", p.bottleneck_label)
    if p.capped:
        st.caption(f"The KV room or {m.rules.label}'s cap on running sequences holds {p.batch:,} of the "
                   f"{concurrency:,} asked for: the bound decodes those.")
    if p.crosses:
        st.warning(f"On {gpu.label} nodes of {topo.gpus_per_node}, the {', '.join(p.crosses)} group "
                   f"crosses nodes: its collectives run at the scale-out network ({gpu.scale_out_gbit:g} "
                   "Gbit/s per GPU).")
    label = layout.label if layout else f"TP {m.tp_size}"
    st.plotly_chart(terms_figure(p.stage_terms, label, p.tpot_ms), theme=None, key="fig_speed_terms")
    st.caption(literal(f"Speed on {gpu.label}: {bound_sentence(m.model)}"))

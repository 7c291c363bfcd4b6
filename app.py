"""tpviz explorer: how tensor parallelism splits every weight matrix of a real LLM across GPUs.

Run: streamlit run app.py  (optionally ?model=Qwen/Qwen3-8B&tp=8&rules=vllm). A thin view: the shard map,
figures, summaries and exports all come from tpviz/.
"""
import json
from dataclasses import replace

import streamlit as st

from explorer.fit import fit_section
from explorer.groups import family_of, layer_groups, tab_label
from explorer.header import LABELS, header
from explorer.cache import (Page, every_group_figures, group_figures, layout_for,
                            page_for, png_renderer, screen_figure, valid_rows)
from explorer.deploy import deployment_section
from explorer.sidebar import (RULE_LABELS, NeedInput, checkpoint_key, layout_controls, restore_from_query,
                              sidebar_exports, sidebar_source, source_config, sync_link, tp_control)
from explorer.state import DEFAULT_VIEW
from explorer.style import PLOTLY_CONFIG, narrow_screens
from explorer.tables import collective_rows, valid_tp_rows
from explorer.text import literal
from tpviz.render import summary as S
from tpviz.trace.collectives import collectives
from tpviz.render.text import fmt_bytes
from tpviz.trace.validity import ValidRow
from tpviz.errors import DenseEPError, HubError, MissingFieldError, NotJSONError, TPSizeError, TpvizError
from tpviz.render.export import chromium_path, figure_png, png_names
from tpviz.render.plots.memory import memory_figure
from tpviz.trace.shardmap import Deployment
from tpviz.rules.layout import CARVED
from tpviz.config.sources import presets, web_local_root

FIELDS_HINT = ("a decoder config.json needs hidden_size, num_attention_heads, num_hidden_layers, "
               "intermediate_size and vocab_size")


def explain(error: Exception, name: str | None, rows: list[ValidRow] | None, rules: str) -> str:
    """One line: the reason, and what would work."""
    text = str(error)
    if isinstance(error, TPSizeError) and rows:
        sizes = ", ".join(map(str, S.valid_sizes(rows, rules))) or "none"
        return f"{text.rstrip('.')}. Valid tp sizes for {name} under {RULE_LABELS[rules]} rules: {sizes}."
    if isinstance(error, MissingFieldError):
        return f"{text}; {FIELDS_HINT}."
    if isinstance(error, NotJSONError) and not text.endswith("config.json"):  # say it once
        return f"{text}. Upload the model's config.json as plain JSON."
    # local paths are off here: what works is upload
    if isinstance(error, HubError) and web_local_root() is None:
        text = text.replace("a local config.json", "upload a config.json")
    return (text if isinstance(error, TpvizError)
            else f"unexpected {type(error).__name__}: {text.splitlines()[0] if text else ''}")


def render_page(page: Page, rows: list[ValidRow], lay: Deployment | None = None, values: dict | None = None,
                link=None) -> None:
    """The main area: header, metrics, the three special cases, a deployment's GPUs, one figure per family,
    summaries. `values`: the controls, written into the address with the layer group and tab drawn here;
    `link`: the sidebar's share link, which the fit section writes (its own reruns change the view too)."""
    m = page.m
    mem, coll = S.memory_rows(m), collectives(m)
    # the figures go out first and the header fills its place above them after: the open figure, the slowest
    # thing on the page to draw, reaches the browser before the elements around it (bench/bench_browser.py)
    top = st.container()
    has_browser = chromium_path() is not None
    shown = replace(m, deployment=lay) if lay else m  # a PNG's title names the whole layout on screen
    st.markdown("### Where every matrix goes")
    sections = [(None, page.figs)]  # (layer group or None, its figures)
    if len(m.groups) > 1:
        group = layer_groups(m, PLOTLY_CONFIG)
        sections = ([(m.groups[group], group_figures(*page.key, group))] if group is not None else
                    every_group_figures(*page.key) + [(None, {"memory": page.figs["memory"]})])
    st.caption("One tab per matrix family. Hover a band for its GPU, head, global range and local offset; "
               "in a window narrower than a figure, scroll it sideways for the rank view on its right. "
               "Each GPU keeps one colour everywhere on this page.")
    if lay:  # the memory figure says that it is the tensor-parallel map's, not the layout's GPUs
        sections = [(g, {k: memory_figure(shown) if k == "memory" else f for k, f in figs.items()})
                    for g, figs in sections]
    cut = lay.layout.expert_cut if lay else None
    if cut == 1:  # EP keeps every routed expert whole: a tp slice of them is not what the GPUs hold
        sections = [(g, {k: f for k, f in figs.items() if not k.endswith("experts")}) for g, figs in sections]
        st.caption("Expert parallelism keeps each routed expert whole on one GPU: the expert placement above "
                   "shows which GPU holds which.")
    for i, (g, figs) in enumerate(sections):
        if g is not None:
            st.markdown(f"#### Layers {S.layer_span(g.layers)}: {literal(g.label)}")
        names = png_names(m, list(figs))
        # one tab per matrix family, drawn only while open: a tp change redraws what is on screen, not every
        # figure
        linked = next((k for k in figs if family_of(k) == st.session_state.get("link_tab")), None) if i == 0 \
            else None
        tabs = st.tabs([tab_label(key) for key in figs], default=tab_label(linked) if linked else None,
                       key=f"figtabs_{i}_{g.label if g else ''}", on_change="rerun")
        for j, (tab, (key, fig)) in enumerate(zip(tabs, figs.items())):
            if tab.open is False:
                continue
            if i == 0:  # the first section's open tab goes in the link, unless it is the first
                st.session_state.open_tab = family_of(key) if j else None
                st.session_state.pop("link_tab", None)
            with tab:
                if cut and key.endswith("experts"):
                    st.caption(f"Each expert is cut over the {cut} GPUs of its EP block; each block cuts "
                               "its own experts the same way (the expert placement above).")
                screen = screen_figure((page.key, tuple(g.layers) if g else None, key,
                                        lay.label if lay and key == "memory" else None), fig)
                st.plotly_chart(screen, theme=None, key=f"fig_{key}", config=PLOTLY_CONFIG)
                st.download_button("PNG", lambda f=fig: figure_png(f, png_renderer(), shown),
                                   names[key], "image/png",
                                   key=f"png_{key}", on_click="ignore", icon=":material/download:",
                                   disabled=not has_browser, type="tertiary")
    with top:
        header(page, rows, lay, mem, coll)
    # below the fold, drawn only when opened: a tp change redraws what is on screen
    if (table := st.expander("Memory table", key="open_memory", on_change="rerun")).open:
        table.dataframe([{LABELS.get(k) or S.FAMILY_LABELS.get(k, k): (v if k == "rank" else fmt_bytes(v))
                          for k, v in row.items()} for row in mem], hide_index=True, width="stretch")
    if values is not None:
        sync_link(values)  # the controls as chosen, with the group and tab drawn above; the fit section adds
    fit_section(m, lay.layout if lay else None, link)  # its inputs (and writes the sidebar's link)
    if (box := st.expander(f"Collectives per forward pass: {sum(c.count for c in coll)}",
                           key="open_collectives", on_change="rerun")).open:
        if coll:
            box.dataframe(collective_rows(m), hide_index=True, width="stretch")
            box.caption("Bytes are per token and per occurrence; “sent per GPU” assumes ring collectives "
                        "(an all-reduce sends 2(tp−1)/tp of the tensor, an all-gather (tp−1)/tp). "
                        "Multiply by the batch's tokens for a step (the logits' row by the "
                        "tokens sampled, one per sequence).")
        else:
            box.caption("tp=1: the tensor-parallel map communicates nothing" + (
                "; the deployment's pipeline hand-offs and MoE traffic are in its table above." if lay
                else "."))
    sizes = ", ".join(map(str, S.valid_sizes(rows, m.rules)))
    if (box := st.expander(f"Valid tp sizes ({m.rules.label}: {sizes}) and why the others fail",
                           key="open_valid", on_change="rerun")).open:
        box.dataframe(valid_tp_rows(rows), hide_index=True, width="stretch", height=300)


def deployment(cfg_json: str, name: str, values: dict, problems: list[str]) -> dict | None:
    """The pp / dp / ep layout of the view, or None with one line in `problems`."""
    try:
        return layout_for(cfg_json, name, values["tp"], values["pp"], values["dp"],
                          values["ep"], values["rules"],
                          tuple((k, values[k]) for k, v in CARVED.items() if values[k] != v),
                          st.session_state.get("mm_encoder", "weights"))
    except TpvizError as e:
        if isinstance(e, DenseEPError) and (values["pp"] > 1 or values["dp"] > 1):  # keep the chosen pp / dp
            problems.append(f"{e} (showing the layout without EP)")
            return deployment(cfg_json, name, {**values, "ep": False}, problems)
        problems.append(str(e))
        return None


def nearest_view(cfg_json: str | None, name: str | None, rows: list[ValidRow] | None,
                 values: dict) -> tuple | None:
    """A first view whose tp does not work: the same model at the nearest valid tp (largest below, else
    smallest)."""
    bad_tp = bool(cfg_json and rows and S.tp_problem(rows, values["tp"], values["rules"]))
    sizes = S.valid_sizes(rows, values["rules"]) if bad_tp else []
    if not sizes:
        return None
    tp = max((t for t in sizes if t <= values["tp"]), default=sizes[0])
    return cfg_json, name, tp, values["rules"]


def ep_only_view(name: str, lay: Deployment, refused: TPSizeError) -> None:
    """A layout that exists only with EP: its GPUs, without the per-tensor maps (which cut every expert by
    tp)."""
    st.markdown(f"## {literal(name)} on {len(lay.gpus)} GPUs · {lay.label}")
    st.info(f"Without EP this tp is refused ({literal(refused.reason.rstrip('.'))}). With EP every routed "
            "expert stays whole on one GPU, so the per-tensor maps, which cut the experts by tp, are not "
            "drawn: the GPUs below are the layout vLLM runs. Exports need the per-tensor map: pick a tp the "
            "experts split by for them.")
    deployment_section(lay, PLOTLY_CONFIG)


def main() -> None:
    """Read the controls, build (or recall) the view, and render it; errors keep the last good view."""
    st.set_page_config(page_title="tpviz explorer", page_icon="🧩", layout="wide")
    restore_from_query()
    local_off = web_local_root() is None
    errors = list(st.session_state.pop("query_problems", []))
    if rejected := st.session_state.pop("upload_rejected", None):
        errors.append(rejected)
    with st.sidebar:
        st.markdown("## :material/view_column: tpviz")
        st.caption("How tensor parallelism splits every weight matrix across GPUs.")
        upload = sidebar_source(local_off)
        values = {k: st.session_state.get(k, DEFAULT_VIEW[k]) for k in DEFAULT_VIEW}
        cfg_json = name = rows = None
        hint = None
        try:
            cfg_json, name = source_config(values, upload)
            rows = valid_rows(cfg_json, name, st.session_state.get("mm_encoder", "weights"))
        except NeedInput as e:
            hint = str(e)
        except Exception as e:  # noqa: BLE001 - every failure is one line, never a traceback
            errors.append(explain(e, name, rows, values["rules"]))
        values["tp"] = tp_control(rows, values["rules"])
        values.update(layout_controls(values))
    page = lay = ep_only = None
    if cfg_json is not None and rows is not None:
        try:
            checkpoint = checkpoint_key(values)
            state = st.session_state
            serving = ",".join(state.get(k, d) for k, d in (("serve_dtype", "auto"), ("kv_dtype", "auto"),
                                                              ("mm_encoder", "weights")))
            problems = []  # the deployment's: said with the TP map's fate below
            carved = tuple((k, values[k]) for k, v in CARVED.items() if values[k] != v)  # SGLang's, inside tp
            if values["pp"] > 1 or values["dp"] > 1 or values["ep"] or carved:
                lay = deployment(cfg_json, name, values, problems)
            try:
                carved = carved if lay is not None else ()  # a refused layout: the plain TP map, said below
                page = page_for(cfg_json, name, values["tp"], values["rules"], checkpoint, serving, carved)
                st.session_state.good = (cfg_json, name, values["tp"], values["rules"], checkpoint, serving,
                                         carved)
                errors += [p if lay else f"{p} (showing the tensor-parallel map alone)" for p in problems]
            except TPSizeError as e:  # with EP the experts are whole: their tp cut may be all that failed
                errors += problems
                if lay is None or not lay.layout.ep:
                    raise
                ep_only = e
        except Exception as e:  # noqa: BLE001
            errors.append(explain(e, name, rows, values["rules"]))
    for line in errors:
        st.error(literal(line))
    if hint:
        st.info(hint)
    if ep_only is not None:
        sync_link(values)
        return ep_only_view(name, lay, ep_only)
    if page is None:
        nearest = None if "good" in st.session_state else nearest_view(cfg_json, name, rows, values)
        good = st.session_state.get("good") or nearest or (
            json.dumps(presets()[DEFAULT_VIEW["preset"]], sort_keys=True), DEFAULT_VIEW["preset"],
            DEFAULT_VIEW["tp"], "vllm")
        try:
            page, rows = page_for(*good), valid_rows(good[0], good[1])
        except Exception as e:  # noqa: BLE001 - even the fallback failed: say so, still no traceback
            st.error(literal(explain(e, good[1], None, good[3])))
            sync_link(values)
            return
        last = ("the nearest valid view" if nearest else "the last good view" if "good" in st.session_state
                else "the default view")
        st.caption(f"Showing {last}: {literal(good[1])} at tp={good[2]} ({RULE_LABELS[good[3]]} rules).")
    with st.sidebar:
        link = sidebar_exports(page, values, lay)
    render_page(page, rows, lay, values, link)


if __name__ == "__main__":  # spawned Run-live ranks re-import this file: build no page there
    narrow_screens()  # every page: phone-width figures scroll instead of overlapping
    # app_pages/, not pages/: Streamlit serves a pages/ folder's files by themselves (no Explorer entry, no
    # styles) to whoever first opens a /Plan or /Run_live link on a fresh server
    st.navigation([st.Page(main, title="Explorer", icon="🧩", default=True),
                   st.Page("app_pages/1_Run_live.py", title="Run live", icon="▶️",
                           url_path="Run_live"),
                   st.Page("app_pages/2_Plan.py", title="Plan", icon="🗺️", url_path="Plan")]).run()

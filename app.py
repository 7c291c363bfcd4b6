"""tpviz explorer: how tensor parallelism splits every weight matrix of a real LLM across GPUs.

Run: streamlit run app.py  (optionally ?model=Qwen/Qwen3-8B&tp=8&rules=vllm). A thin view: the shard map,
figures, summaries and exports all come from tpviz/.
"""
import json
import os
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlencode

import streamlit as st
from streamlit.runtime.uploaded_file_manager import UploadedFile

from tpviz import load_spec, shard_map
from tpviz import summary as S
from tpviz.cli import fmt_bytes, valid_table
from tpviz.errors import ConfigError, TPSizeError, TpvizError
from tpviz.export import NO_CHROMIUM, PngRenderer, chromium_path, file_stem, figures_zip, png_names, shard_map_json
from tpviz.plots import all_figures, export_figures, grouped_figures
from tpviz.plots.strip import layer_strip
from tpviz.rules import RULES
from tpviz.shardmap import ShardMap
from tpviz.sources import LOCAL_ROOT_ENV, find_preset, local_config, parse_config, presets

RULE_LABELS = {"vllm": "vLLM", "nano-vllm": "nano-vllm"}
PLOTLY_CONFIG = {"displaylogo": False, "modeBarButtonsToRemove": ["select2d", "lasso2d", "autoScale2d"]}
FIELDS_HINT = ("a decoder config.json needs hidden_size, num_attention_heads, num_hidden_layers, "
               "intermediate_size and vocab_size")
UPLOAD_MB = 1


class NeedInput(Exception):
    """The chosen source has nothing in it yet: a hint, not an error."""


@dataclass(frozen=True)
class Page:
    """Everything one view shows, built once per (config, tp, rules) and shared by all sessions."""
    m: ShardMap
    figs: dict
    json_bytes: bytes
    key: tuple  # (config JSON, name, tp, rules): what page_for was called with


@st.cache_data(show_spinner=False, max_entries=256, ttl=3600)
def resolve_hub(repo_id: str) -> tuple[str, str]:
    """A hub repo's config as canonical JSON text, and its name (cached: the hub is slow)."""
    from tpviz.hub import fetch_config
    return json.dumps(fetch_config(repo_id), sort_keys=True), repo_id


@st.cache_data(show_spinner=False, max_entries=64)
def valid_rows(cfg_json: str, name: str) -> list[dict]:
    """cli.valid_table rows (tp 1..64, both rule sets) of a config."""
    return valid_table(load_spec(json.loads(cfg_json), name), S.MAX_TP)[1]


@st.cache_resource(show_spinner=False, max_entries=64, ttl=3600)
def checkpoint_names(checkpoint: str) -> tuple[frozenset | None, str]:
    """The tensor names of 'hub:owner/name' (its index) or 'local:/path' (index or header), and where from."""
    kind, _, where = checkpoint.partition(":")
    if kind == "hub":
        from tpviz.checkpoint import hub_tensor_names
        names = hub_tensor_names(where)
    else:
        from tpviz.checkpoint import local_folder, local_tensor_names
        folder = local_folder(where)
        names = local_tensor_names(folder) if folder else None
    return (frozenset(names) if names else None), where


@st.cache_resource(show_spinner=False, max_entries=32)
def page_for(cfg_json: str, name: str, tp: int, rules: str, checkpoint: str = "") -> Page:
    """Shard map, figures and JSON of one view; kept as objects (no copy per rerun) since nothing mutates them.
    checkpoint names the checkpoint whose tensor list the map is checked against ('' for none)."""
    names, where = checkpoint_names(checkpoint) if checkpoint else (None, "")
    m = shard_map(load_spec(json.loads(cfg_json), name), tp, rules, tensor_names=set(names) if names else None,
                  checkpoint_source=where)
    return Page(m, all_figures(m), shard_map_json(m), (cfg_json, name, tp, rules, checkpoint))


@st.cache_resource(show_spinner=False)
def png_renderer() -> PngRenderer:
    """One persistent headless Chromium for every session's PNG downloads (closed when the server exits)."""
    import atexit
    renderer = PngRenderer()
    atexit.register(renderer.close)
    return renderer


def source_config(values: dict, upload: UploadedFile | None) -> tuple[str, str]:
    """(canonical config JSON, display name) for the selected source; raises TpvizError with one line."""
    source = values["source"]
    if source == "Preset":
        key = find_preset(values["preset"]) or values["preset"]
        return json.dumps(presets()[key], sort_keys=True), key
    if source == "Hub repo id":
        text = values["hub"].strip()
        if not text:
            raise NeedInput("Type a Hugging Face repo id such as Qwen/Qwen3-8B and press Enter.")
        if key := find_preset(text):  # a preset id works offline
            return json.dumps(presets()[key], sort_keys=True), key
        failed = st.session_state.get("hub_failure")
        if failed and failed[0] == text:  # don't re-probe a failing hub on every rerun
            raise TpvizError(failed[1])
        try:
            return resolve_hub(text)
        except TpvizError as e:
            st.session_state.hub_failure = (text, str(e))
            raise
    if source == "Local path":
        if not values["path"].strip():
            raise NeedInput("Type the path of a config.json or a checkpoint folder and press Enter.")
        cfg, name = local_config(values["path"].strip())
        return json.dumps(cfg, sort_keys=True), name
    if upload is None:
        raise NeedInput(f"Upload a model's config.json (at most {UPLOAD_MB} MB).")
    cfg = parse_config(upload.getvalue(), f"uploaded {upload.name}")
    return json.dumps(cfg, sort_keys=True), str(cfg.get("_name_or_path") or Path(upload.name).stem)


def checkpoint_key(values: dict) -> str:
    """Which checkpoint the view is checked against: a hub repo's index, or a local folder's weights."""
    if values["source"] == "Hub repo id" and values["hub"].strip() and not find_preset(values["hub"].strip()):
        return f"hub:{values['hub'].strip()}"
    if values["source"] == "Local path" and values["path"].strip():
        return f"local:{values['path'].strip()}"
    return ""


def explain(error: Exception, name: str | None, rows: list[dict] | None, rules: str) -> str:
    """One line: the reason, and what would work."""
    text = str(error)
    if isinstance(error, TPSizeError) and rows:
        sizes = ", ".join(map(str, S.valid_sizes(rows, rules))) or "none"
        return f"{text}. Valid tp sizes for {name} under {RULE_LABELS[rules]} rules: {sizes}."
    if isinstance(error, ConfigError) and "missing" in text:
        return f"{text}; {FIELDS_HINT}."
    if isinstance(error, ConfigError) and "JSON" in text:
        return f"{text}. Upload the model's config.json as plain JSON."
    return text if isinstance(error, TpvizError) else f"unexpected {type(error).__name__}: {text.splitlines()[0] if text else ''}"


def restore_from_query() -> None:
    """Once per session: set the controls from ?model=&tp=&rules=."""
    if "restored" in st.session_state:
        return
    values, problems = S.controls_from_query(st.query_params.to_dict(), list(presets()))
    for key, value in values.items():
        st.session_state[key] = value
    st.session_state.restored = True
    st.session_state.query_problems = problems


def sidebar_source(local_off: bool) -> UploadedFile | None:
    """The model-source controls; returns the uploaded file, if any."""
    source = st.radio("Model source", S.SOURCES, key="source", persist_state="session")
    upload = None
    if source == "Preset":
        st.selectbox("Preset (works offline)", list(presets()), key="preset", persist_state="session")
    elif source == "Hub repo id":
        st.text_input("Hugging Face repo id", key="hub", placeholder="owner/name", persist_state="session",
                      help="Read from the local cache first; HF_TOKEN is used for gated repos.")
    elif source == "Local path":
        st.text_input("config.json or checkpoint folder", key="path", persist_state="session", disabled=local_off)
        if local_off:
            st.caption(f"Local paths are disabled on this server ({LOCAL_ROOT_ENV}=off).")
        elif root := os.environ.get(LOCAL_ROOT_ENV, "").strip():
            st.caption(f"Limited to {root}.")
    else:
        upload = st.file_uploader("config.json", type=["json"], key="upload", max_upload_size=UPLOAD_MB)
    st.radio("Rules", RULES, key="rules", horizontal=True, format_func=RULE_LABELS.get, persist_state="session")
    return upload


def tp_control(rows: list[dict] | None, rules: str) -> int:
    """tp 1..64, each invalid size marked with its reason."""
    def label(tp: int) -> str:
        """'4', or '3  ✗ <failing rule>'."""
        problem = S.tp_problem(rows, tp, rules) if rows else None
        return f"{tp}" if problem is None else f"{tp}  ✗ {problem}"
    return st.selectbox("tp size (GPUs)", list(range(1, S.MAX_TP + 1)), key="tp", format_func=label,
                        persist_state="session")


def sidebar_exports(page: Page, values: dict) -> None:
    """JSON, ZIP of PNGs and the share link."""
    st.subheader("Export")
    stem = file_stem(page.m)
    st.download_button("Shard map (JSON)", page.json_bytes, f"{stem}.json", "application/json",
                       key="dl_json", on_click="ignore", icon=":material/data_object:", width="stretch")
    has_browser = chromium_path() is not None
    st.download_button("All figures (ZIP of PNGs)", lambda: figures_zip(page.m, export_figures(page.m), png_renderer()),
                       f"{stem}_figures.zip", "application/zip", key="dl_zip", on_click="ignore",
                       icon=":material/folder_zip:", width="stretch", disabled=not has_browser)
    if not has_browser:
        st.error(NO_CHROMIUM)
    query = S.query_from_controls(values)
    if values["source"] == "Upload config.json":
        st.caption("An uploaded config cannot travel in a link; the link keeps tp and rules.")
    st.markdown(f"[Link to this view](?{urlencode(query, safe='/')})")


@st.cache_resource(show_spinner=False, max_entries=64)
def group_figures(cfg_json: str, name: str, tp: int, rules: str, checkpoint: str, group: int) -> dict:
    """The figures of one layer group (cached like the page; nothing mutates them)."""
    m = page_for(cfg_json, name, tp, rules, checkpoint).m
    return all_figures(m, m.groups[group])


@st.cache_resource(show_spinner=False, max_entries=16)
def every_group_figures(cfg_json: str, name: str, tp: int, rules: str, checkpoint: str) -> list:
    """"All layers": each group's heading with the figures it adds (shared families drawn once)."""
    return grouped_figures(page_for(cfg_json, name, tp, rules, checkpoint).m)


def layer_groups(m: ShardMap) -> int | None:
    """The layer strip and the group picker; returns the selected group's index (None: all layers)."""
    labels = [f"{i + 1}. {g.label} · layers {S.layer_span(g.layers)}" for i, g in enumerate(m.groups)]
    options = list(range(len(labels))) + [-1]
    if st.session_state.get("layer_group") not in options:
        st.session_state.layer_group = 0
    group = st.session_state.layer_group
    # keyed by the group, so a click's own selection highlight is dropped once the group is shown
    event = st.plotly_chart(layer_strip(m, group if group >= 0 else None), theme=None, key=f"strip_{group}",
                            on_select="rerun", selection_mode="points", config=PLOTLY_CONFIG)
    points = event.get("selection", {}).get("points", []) if isinstance(event, dict) else []
    if points and points[0].get("customdata") is not None and int(points[0]["customdata"]) != group:
        st.session_state.layer_group = int(points[0]["customdata"])
        st.rerun()
    chosen = st.radio("Layer group", options, key="layer_group", horizontal=False,
                      format_func=lambda i: "All layers" if i < 0 else labels[i])
    return None if chosen < 0 else chosen


def versus(value: float, naive: float) -> dict:
    """metric() delta arguments against the naive total/tp: red and up when above it, plain when equal."""
    pct = (value / naive - 1) * 100 if naive else 0.0
    if abs(pct) < 0.05:
        return dict(delta="= total/tp", delta_color="off", delta_arrow="off")
    return dict(delta=f"{pct:+.1f}% vs total/tp", delta_color="inverse")


def render_page(page: Page, rows: list[dict]) -> None:
    """The main area: header, metrics, the three special cases, one figure per family, summaries."""
    m, spec = page.m, page.m.model
    st.markdown(f"## {spec['name']} on {m.tp_size} GPU{'s' if m.tp_size > 1 else ''}")
    heads = (f"{spec['num_attention_heads']} q heads, {spec['num_key_value_heads']} KV heads × {spec['head_dim']}"
             if not spec.get("kv_lora_rank") else f"{spec['num_attention_heads']} heads, MLA latent {spec['kv_lora_rank']}")
    st.caption(f"{RULE_LABELS[m.rules]} rules · {spec['num_hidden_layers']} layers · hidden {spec['hidden_size']} · "
               f"{heads} · vocab {spec['vocab_size']:,} · {spec['dtype']}")
    for note in spec.get("notes", []):
        st.caption(f"Note: {note}")
    if m.checkpoint:
        from tpviz.checkpoint import checkpoint_sentence
        (st.success if m.checkpoint["verified"] else st.warning)(checkpoint_sentence(m.checkpoint))
    mem, coll = S.memory_rows(m), S.collectives(m)
    worst = max(mem, key=lambda r: r["weights"])
    c1, c2, c3, c4 = st.columns(4)
    c1.metric("Weights per GPU", fmt_bytes(worst["weights"]), **versus(worst["weights"], worst["naive"]))
    c2.metric("KV cache per token per GPU", fmt_bytes(worst["kv_per_token"]),
              **versus(worst["kv_per_token"], worst["kv_naive_per_token"]))
    c3.metric("Collectives per forward", sum(c.count for c in coll),
              f"{fmt_bytes(sum(c.total_per_token for c in coll))} per token", delta_color="off", delta_arrow="off")
    c4.metric(f"Valid tp sizes ({RULE_LABELS[m.rules]})", " ".join(map(str, S.valid_sizes(rows, m.rules))))
    for sentence in filter(None, [*S.special_cases(m).values(), S.mla_kv_sentence(m), *S.cache_sentences(m)]):
        st.info(sentence)
    if absent := S.absent_cases(m):
        st.caption("Not in this view: " + "; ".join(absent) + ".")
    has_browser = chromium_path() is not None
    st.markdown("### Where every matrix goes")
    sections = [(None, page.figs)]  # (layer group or None, its figures)
    if len(m.groups) > 1:
        group = layer_groups(m)
        sections = ([(m.groups[group], group_figures(*page.key, group))] if group is not None else
                    every_group_figures(*page.key) + [(None, {"memory": page.figs["memory"]})])
    st.caption("Hover a band for its GPU, head, global range and local offset. "
               "Each GPU keeps one colour everywhere on this page.")
    for g, figs in sections:
        if g is not None:
            st.markdown(f"#### Layers {S.layer_span(g.layers)}: {g.label}")
        names = png_names(m, list(figs))
        for key, fig in figs.items():
            with st.container(border=True):
                st.plotly_chart(fig, theme=None, key=f"fig_{key}", config=PLOTLY_CONFIG)
                st.download_button("PNG", lambda f=fig: png_renderer().render(f), names[key], "image/png",
                                   key=f"png_{key}", on_click="ignore", icon=":material/download:",
                                   disabled=not has_browser, type="tertiary")
    with st.expander("Memory table (bytes)"):
        st.dataframe(mem, hide_index=True, width="stretch")
    st.markdown("### Does it fit? KV-cache room per GPU")
    context = st.number_input("Context length per sequence (tokens)", 1, 10_000_000, 8192, step=1024, key="context")
    st.dataframe(S.fit_rows(m, context=int(context)), hide_index=True, width="stretch")
    st.caption(f"Weights on the fullest GPU: {fmt_bytes(worst['weights'])}; every GPU caches its share of every "
               f"token ({fmt_bytes(worst['kv_per_token'])} per token). Estimates at vLLM's default "
               "gpu_memory_utilization; activations, CUDA graphs and NCCL buffers take a few GiB more.")
    st.markdown("### Collectives per forward pass")
    if coll:
        st.dataframe(S.collective_rows(m), hide_index=True, width="stretch")
        st.caption("Bytes are per token and per occurrence; “sent per GPU” assumes a ring all-reduce. "
                   "Multiply by the batch's tokens for a step.")
    else:
        st.caption("tp=1: one GPU holds everything, so nothing is communicated.")
    st.markdown("### Valid tp sizes")
    st.dataframe(S.valid_tp_rows(rows), hide_index=True, width="stretch", height=300)


def nearest_view(cfg_json: str | None, name: str | None, rows: list[dict] | None, values: dict) -> tuple | None:
    """A first view whose tp does not work: the same model at the nearest valid tp (largest below, else smallest)."""
    bad_tp = bool(cfg_json and rows and S.tp_problem(rows, values["tp"], values["rules"]))
    sizes = S.valid_sizes(rows, values["rules"]) if bad_tp else []
    if not sizes:
        return None
    tp = max((t for t in sizes if t <= values["tp"]), default=sizes[0])
    return cfg_json, name, tp, values["rules"]


def main() -> None:
    """Read the controls, build (or recall) the view, and render it; errors keep the last good view."""
    st.set_page_config(page_title="tpviz explorer", page_icon="🧩", layout="wide")
    restore_from_query()
    local_off = os.environ.get(LOCAL_ROOT_ENV, "").strip().lower() in ("off", "none", "0", "false")
    errors = list(st.session_state.pop("query_problems", []))
    with st.sidebar:
        st.markdown("## :material/view_column: tpviz")
        st.caption("How tensor parallelism splits every weight matrix across GPUs.")
        upload = sidebar_source(local_off)
        values = {k: st.session_state.get(k, S.DEFAULT_VIEW[k]) for k in S.DEFAULT_VIEW}
        cfg_json = name = rows = None
        hint = None
        try:
            cfg_json, name = source_config(values, upload)
            rows = valid_rows(cfg_json, name)
        except NeedInput as e:
            hint = str(e)
        except Exception as e:  # noqa: BLE001 - every failure is one line, never a traceback
            errors.append(explain(e, name, rows, values["rules"]))
        values["tp"] = tp_control(rows, values["rules"])
    page = None
    if cfg_json is not None and rows is not None:
        try:
            checkpoint = checkpoint_key(values)
            page = page_for(cfg_json, name, values["tp"], values["rules"], checkpoint)
            st.session_state.good = (cfg_json, name, values["tp"], values["rules"], checkpoint)
            query = S.query_from_controls(values)
            if st.query_params.to_dict() != query:
                st.query_params.from_dict(query)
        except Exception as e:  # noqa: BLE001
            errors.append(explain(e, name, rows, values["rules"]))
    for line in errors:
        st.error(line)
    if hint:
        st.info(hint)
    if page is None:
        nearest = None if "good" in st.session_state else nearest_view(cfg_json, name, rows, values)
        good = st.session_state.get("good") or nearest or (
            json.dumps(presets()[S.DEFAULT_VIEW["preset"]], sort_keys=True), S.DEFAULT_VIEW["preset"],
            S.DEFAULT_VIEW["tp"], "vllm")
        try:
            page, rows = page_for(*good), valid_rows(good[0], good[1])
        except Exception as e:  # noqa: BLE001 - even the fallback failed: say so, still no traceback
            st.error(explain(e, good[1], None, good[3]))
            return
        last = "the nearest valid view" if nearest else "the last good view"
        st.caption(f"Showing {last}: {good[1]} at tp={good[2]} ({RULE_LABELS[good[3]]} rules).")
    with st.sidebar:
        sidebar_exports(page, values)
    render_page(page, rows)


if __name__ == "__main__":  # spawned Run-live ranks re-import this file: build no page there
    st.navigation([st.Page(main, title="Explorer", icon=":material/view_column:", default=True),
                   st.Page("pages/1_Run_live.py", title="Run live", icon=":material/play_circle:",
                           url_path="Run_live")]).run()

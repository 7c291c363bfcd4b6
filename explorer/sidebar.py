"""The explorer's sidebar: model source, rules, tp (each invalid size with its reason) and exports."""
import json
from dataclasses import replace
from pathlib import Path

import streamlit as st
from streamlit.runtime.uploaded_file_manager import UploadedFile

from explorer.cache import Page, png_renderer, resolve_hub
from explorer.state import (DEFAULT_VIEW, EXTRAS, MAX_PP_DP, SOURCES, controls_from_query,
                            query_from_controls)
from explorer.text import literal
from tpviz.render import summary as S
from tpviz.errors import SourceError, TpvizError
from tpviz.trace.shardmap import Deployment
from tpviz.trace.validity import ValidRow
from tpviz.render.export import NO_CHROMIUM, chromium_path, file_stem, figures_zip, shard_map_json
from tpviz.render.plots import export_figures
from tpviz.rules import RULE_SETS, RULES, ruleset
from tpviz.rules.layout import CARVED
from tpviz.config.spec import KV_DTYPES, SERVE_DTYPES
from tpviz.config.tower import MODES
from tpviz.config.files import check_config_size, parse_config
from tpviz.config.sources import (WEB_LOCAL_HINT, WEB_LOCAL_OFF, find_preset, local_config,
                                  presets, repo_from_url, web_local_root)

RULE_LABELS = {name: r.label for name, r in RULE_SETS.items()}  # the UI names the engine version
UPLOAD_MB = 1
RECEIVE_MB = 16  # the browser refuses bigger files itself; between 1 and 16 MB we say why in a red line


class NeedInput(Exception):
    """The chosen source has nothing in it yet: a hint, not an error."""


def source_config(values: dict, upload: UploadedFile | None) -> tuple[str, str]:
    """(canonical config JSON, display name) for the selected source; raises TpvizError with one line."""
    source = values["source"]
    if source == "Preset":
        key = find_preset(values["preset"]) or values["preset"]
        return json.dumps(presets()[key], sort_keys=True), key
    if source == "Hub repo id":
        text = repo_from_url(values["hub"].strip())  # a pasted https://huggingface.co/owner/name works too
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
        if web_local_root() is None:  # e.g. ?model=/etc/... in a link: never probe the server's files
            raise SourceError(WEB_LOCAL_OFF)
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
    hub = repo_from_url(values["hub"].strip())
    if values["source"] == "Hub repo id" and hub and not find_preset(hub):
        return f"hub:{hub}"
    if values["source"] == "Local path" and values["path"].strip() and web_local_root() is not None:
        return f"local:{values['path'].strip()}"
    return ""


def capped_upload(label: str, key: str) -> UploadedFile | None:
    """A config.json uploader: a file over UPLOAD_MB is dropped (a fresh widget) and its one-line error kept
    for this run in st.session_state[key + "_rejected"]; the browser's own limit message is easy to miss."""
    turn = st.session_state.get(f"{key}_turn", 0)
    upload = st.file_uploader(label, type=["json"], key=key if turn == 0 else f"{key}_{turn}",
                              max_upload_size=RECEIVE_MB)
    if upload is not None:
        try:
            check_config_size(upload.size, f"uploaded {upload.name}")
        except SourceError as e:
            st.session_state[f"{key}_turn"] = turn + 1  # the next run draws an empty uploader
            st.session_state[f"{key}_rejected"] = str(e)
            st.rerun()
    return upload


def restore_from_query() -> None:
    """Once per session: set the controls from ?model=&tp=&rules=."""
    if "restored" in st.session_state:
        return
    values, problems = controls_from_query(st.query_params.to_dict(), list(presets()))
    if tab := values.pop("tab", None):
        st.session_state.link_tab = tab  # opened once its figures are drawn
    for key, value in values.items():
        st.session_state[key] = value
    st.session_state.restored = True
    st.session_state.query_problems = problems


def sidebar_source(local_off: bool) -> UploadedFile | None:
    """The model-source controls; returns the uploaded file, if any."""
    source = st.radio("Model source", SOURCES, key="source", persist_state="session")
    upload = None
    if source == "Preset":
        st.selectbox("Preset (works offline)", list(presets()), key="preset", persist_state="session")
    elif source == "Hub repo id":
        st.text_input("Hugging Face repo id", key="hub", placeholder="owner/name", persist_state="session",
                      help="Read from the local cache first; HF_TOKEN is used for gated repos.")
    elif source == "Local path":
        st.text_input("config.json or checkpoint folder", key="path",
                      persist_state="session", disabled=local_off)
        if local_off:
            st.caption(f"Local paths are off in the web app; {WEB_LOCAL_HINT}.")
        else:
            st.caption(literal(f"Limited to {web_local_root()}."))
    else:
        upload = capped_upload("config.json", "upload")
    st.radio("Rules", RULES, key="rules", format_func=RULE_LABELS.get, persist_state="session",
             help=" · ".join(r.note for r in RULE_SETS.values()))
    # drawn only when opened (a rerun draws no collapsed widgets); the choices persist in the session
    # meanwhile
    if (box := st.expander("Serving choices", key="open_serving", on_change="rerun")).open:
        box.selectbox("Weight dtype", SERVE_DTYPES, key="serve_dtype", persist_state="session",
                      help="vLLM's auto serves a float32 config in bfloat16; quantized weights "
                           "keep their own bytes.")
        box.selectbox("KV-cache dtype", list(KV_DTYPES), key="kv_dtype", persist_state="session",
                      help="fp8 stores the KV cache in one byte per value.")
        box.selectbox("Vision encoder", MODES, key="mm_encoder", persist_state="session",
                      help="vLLM's --mm-encoder-tp-mode: weights splits a vision tower over tp as drawn; "
                           "data keeps it whole on every GPU, each encoding its own images (any tp).")
    return upload


def tp_control(rows: list[ValidRow] | None, rules: str) -> int:
    """The valid tp sizes (and the current one); with "Show invalid sizes", all of 1..64, each invalid size
    marked, and every reason written out in full below."""
    show_all = st.toggle("Show invalid tp sizes", key="tp_show_invalid", persist_state="session",
                         help="List the sizes this model cannot be split by, with the rule each one breaks")
    problems = {row.tp: row.problems[rules] for row in rows or []}
    current = st.session_state.get("tp", DEFAULT_VIEW["tp"])
    if isinstance(current, str):  # a browser can send back the option's text once the option list has changed
        head = current.split()[0] if current.split() else ""
        current = st.session_state["tp"] = int(head) if head.isdigit() else DEFAULT_VIEW["tp"]
    every = list(range(1, S.MAX_TP + 1))
    options = every if show_all or not rows else sorted({t for t in every
                                                         if problems.get(t) is None} | {current})
    tp = st.selectbox("tp size (GPUs)", options, key="tp", persist_state="session", filter_mode="prefix",
                      format_func=lambda t: f"{t}" if problems.get(t) is None else f"{t}  ✗ invalid")
    if show_all and rows:
        with st.container(height=260, border=True):
            for t in every:
                if problems.get(t):
                    st.caption(f"**tp={t}** ✗ {literal(problems[t])}")
    return tp


def layout_controls(values: dict) -> dict:
    """pp, dp and expert parallelism: a deployment beyond one tensor-parallel group (defaults: plain TP);
    under SGLang, its attention DP, EP size and switches inside tp instead of vLLM's EP."""
    carves = ruleset(values["rules"]).carves
    carved = {k: values[k] for k in CARVED} if carves else dict(CARVED)
    # open for a layout link, and kept open once opened: unticking EP must not close the section in use
    wide = (values["pp"] > 1 or values["dp"] > 1 or values["ep"] or carved != CARVED
            or bool(st.session_state.get("open_layout")))
    box = st.expander("Pipeline, data and expert parallelism", expanded=bool(wide), key="open_layout",
                      on_change="rerun")
    if not box.open:  # drawn only when opened, like the serving choices
        return {"pp": int(values["pp"]), "dp": int(values["dp"]), "ep": bool(values["ep"]) and not carves,
                **carved}
    pp = box.number_input("pp: pipeline stages", 1, MAX_PP_DP, key="pp", persist_state="session",
                          help="the engine's --pipeline-parallel-size (SGLang: --pp-size): the layers are "
                               "divided between stages")
    dp = box.number_input("dp: data-parallel replicas", 1, MAX_PP_DP, key="dp", persist_state="session",
                          help="vLLM's --data-parallel-size: attention replicas, MoE experts span tp × dp "
                               "GPUs; SGLang's --dp-size: whole copies")
    if not carves:
        ep = box.checkbox("Expert parallelism (EP)", key="ep", persist_state="session",
                          help="vLLM's --enable-expert-parallel: each routed expert whole on one "
                               "of the tp × dp GPUs (linear placement)")
        return {"pp": int(pp), "dp": int(dp), "ep": bool(ep), **CARVED}
    tp = int(values["tp"])
    divisors = [n for n in range(1, tp + 1) if tp % n == 0]
    for key in ("attn_dp", "ep_size"):  # a size kept from another tp: back to 1, not an error
        if st.session_state.get(key, 1) not in divisors:
            st.session_state[key] = 1
    attn_dp = box.selectbox("attn-dp: attention-DP groups", divisors, key="attn_dp",
                            help="SGLang's --attn-dp-size: tp / N GPUs per attention group, each serving its "
                                 "own requests (Qwen3, Qwen3-MoE, DeepSeek cut attention over the group)")
    ep_size = box.selectbox("ep: expert-parallel size", divisors, key="ep_size",
                            help="SGLang's --ep: the experts in N contiguous blocks, each expert cut tp / N "
                                 "ways (N = tp: whole)")
    dense = box.checkbox("--moe-dense-tp-size 1", key="dense_tp1",
                         help="DeepSeek's dense MLPs whole on every GPU")
    head = box.checkbox("--enable-dp-lm-head", key="dp_lm_head",
                        help="the lm_head cut over the attention group")
    shared = box.checkbox("SGLANG_SHARED_EXPERT_TP1=1", key="shared_tp1",
                          help="DeepSeek's shared experts whole on every GPU")
    return {"pp": int(pp), "dp": int(dp), "ep": False, "attn_dp": int(attn_dp), "ep_size": int(ep_size),
            "dense_tp1": bool(dense), "dp_lm_head": bool(head), "shared_tp1": bool(shared)}


def sidebar_exports(page: Page, values: dict, lay: Deployment | None = None):
    """JSON, ZIP of PNGs and the place of the share link (returned, for sync_link)."""
    st.subheader("Export")
    # a copy: the cached map is shared by every session
    m = replace(page.m, deployment=lay) if lay else page.m
    stem = file_stem(m)
    # deferred, like the ZIPs: bytes given up front are stored and fetched by the browser on every rerun
    st.download_button("Shard map (JSON)", (lambda: shard_map_json(m)) if lay else (lambda: page.json_bytes),
                       f"{stem}.json", "application/json", key="dl_json", on_click="ignore",
                       icon=":material/data_object:", width="stretch")
    has_browser = chromium_path() is not None
    st.download_button("All figures (ZIP of PNGs + JSON)",
                       lambda: figures_zip(m, export_figures(m), png_renderer()),
                       f"{stem}_figures.zip", "application/zip", key="dl_zip", on_click="ignore",
                       icon=":material/folder_zip:", width="stretch", disabled=not has_browser)
    st.download_button("All figures (ZIP of SVGs + JSON)",
                       lambda: figures_zip(m, export_figures(m), png_renderer(), "svg"),
                       f"{stem}_figures_svg.zip", "application/zip", key="dl_zip_svg", on_click="ignore",
                       icon=":material/folder_zip:", width="stretch", disabled=not has_browser)
    if not has_browser:
        st.error(NO_CHROMIUM)
    if values["source"] == "Upload config.json":
        st.caption("An uploaded config cannot travel in a link; the link keeps the rest of the view.")
    return st.empty()  # the link, once the page has drawn its layer group and tab (fit_section)


def view_values(values: dict) -> dict:
    """The controls plus the rest of the view as the session holds it now: serving choices, fit inputs, the
    layer group the reader picked (not the one the page opened on) and the open figure tab."""
    state = st.session_state
    extras = {k: state.get(k, default) for k, (_, default) in EXTRAS.items() if k != "tab"}
    if extras["layer_group"] == state.get("group_auto"):
        extras["layer_group"] = None
    return {**values, **extras, "tab": state.get("open_tab")}


def sync_link(values: dict) -> None:
    """Write the whole view into the address bar (after an error too; the fit section writes the sidebar's
    link)."""
    query = query_from_controls(view_values(values))
    if st.query_params.to_dict() != query:
        st.query_params.from_dict(query)

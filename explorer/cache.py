"""What the explorer computes once and shares between sessions: shard maps, figures, valid-tp rows, the
checkpoint's tensor list and the PNG renderer. Nothing cached here is mutated by a page."""
import atexit
import hashlib
import json
from dataclasses import dataclass

import plotly.graph_objects as go
import streamlit as st

from tpviz import load_spec, shard_map
from tpviz.config.hub import fetch_config
from tpviz.config.spec import ModelSpec
from tpviz.deploy.deployment import deploy
from tpviz.deploy.equivalent import equivalent
from tpviz.errors import TpvizError
from tpviz.rules import Layout, ruleset
from tpviz.trace.model_map import hub_checkpoint, local_checkpoint
from tpviz.trace.shardmap import Deployment
from tpviz.trace.validity import ValidRow, valid_table
from tpviz.render.export import PngRenderer, shard_map_json
from tpviz.render import plots  # looked up at call time (tests swap a figure function to inject a failure)
from tpviz.trace.shardmap import ShardMap
from tpviz.render.summary import MAX_TP


@dataclass(frozen=True)
class Page:
    """Everything one view shows, built once per (config, tp, rules) and shared by all sessions."""
    m: ShardMap
    figs: dict
    json_bytes: bytes
    key: tuple  # (config JSON, name, tp, rules, checkpoint, serving, carved): what page_for was called with


@st.cache_data(show_spinner=False, max_entries=256, ttl=3600)
def resolve_hub(repo_id: str) -> tuple[str, str]:
    """A hub repo's config as canonical JSON text, and its name (cached: the hub is slow)."""
    return json.dumps(fetch_config(repo_id), sort_keys=True), repo_id


@st.cache_resource(show_spinner=False, max_entries=64)
def spec_for(cfg_json: str, name: str, mm: str = "weights") -> ModelSpec:
    """A config read once for every view of it (one object: nothing mutates a spec after normalize); mm: its
    vision tower's --mm-encoder-tp-mode."""
    spec = load_spec(json.loads(cfg_json), name)
    return spec if mm == "weights" else spec.served(mm_encoder=mm)


@st.cache_data(show_spinner=False, max_entries=64)
def valid_rows(cfg_json: str, name: str, mm: str = "weights") -> list[ValidRow]:
    """valid_table rows (tp 1..64, every rule set) of a config (its tower under --mm-encoder-tp-mode mm)."""
    return valid_table(spec_for(cfg_json, name, mm), MAX_TP)[1]


@st.cache_resource(show_spinner=False, max_entries=64, ttl=3600)
def checkpoint_names(checkpoint: str) -> tuple[frozenset | None, str, dict | None]:
    """The tensor names of 'hub:owner/name' (its index) or 'local:/path' (index or header), where from, and
    for a hub repo the stored bytes of each tensor when the hub answers."""
    kind, _, where = checkpoint.partition(":")
    found = hub_checkpoint(where) if kind == "hub" else local_checkpoint(where)
    return (found.names if found else None), where, found.sizes if found and kind == "hub" else None


@st.cache_resource(show_spinner=False, max_entries=32)
def page_for(cfg_json: str, name: str, tp: int, rules: str, checkpoint: str = "",
             serving: str = "auto,auto,weights", carved: tuple = ()) -> Page:
    """Shard map, figures and JSON of one view; kept as objects (no copy per rerun) since nothing mutates
    them. checkpoint names the checkpoint whose tensor list the map is checked against ('' for none); carved:
    SGLang's attention-DP and EP fields ((name, value) pairs), whose groups cut the map's weights; serving:
    'dtype,kv_cache_dtype,mm_encoder_tp_mode'."""
    names, where, sizes = checkpoint_names(checkpoint) if checkpoint else (None, "", None)
    dtype, kv_cache_dtype, mm = (serving.split(",") + ["weights"])[:3]
    m = shard_map(spec_for(cfg_json, name, mm), tp, rules,
                  tensor_names=set(names) if names else None,
                  checkpoint_source=where, dtype=dtype, kv_cache_dtype=kv_cache_dtype, tensor_bytes=sizes,
                  layout=Layout(tp, **dict(carved)) if carved else None)
    return Page(m, plots.all_figures(m), shard_map_json(m),
                (cfg_json, name, tp, rules, checkpoint, serving, carved))


@st.cache_data(show_spinner=False, max_entries=64)
def other_engine(cfg_json: str, name: str, layout: Layout, rules: str) -> str | None:
    """The same GPUs in the other engine (its launch line), or why there are none; None for an engine compared
    with neither, or a layout that does not deploy (its refusal is said elsewhere)."""
    if ruleset(rules).tp_only:
        return None
    try:
        return equivalent(spec_for(cfg_json, name), layout, rules).line
    except TpvizError:
        return None


@st.cache_resource(show_spinner=False, max_entries=256)
def screen_figure(key: tuple, _fig: go.Figure) -> go.Figure:
    """The copy of a cached figure that the page sends (`key` names it; exports use the figure itself).
    Streamlit hands a new chart to Plotly twice, and the second pass redraws it all when it meets a new
    template object or, without a datarevision, new data arrays: no template (plotly.js's default look is
    plotly.py's "none") and a fixed datarevision make it a no-op."""
    screen = go.Figure(_fig)
    screen.layout.template = None
    screen.layout.datarevision = hashlib.sha1(repr(key).encode()).hexdigest()[:12]
    return screen


@st.cache_resource(show_spinner=False)
def png_renderer() -> PngRenderer:
    """One persistent headless Chromium for every session's PNG downloads (closed when the server exits)."""
    renderer = PngRenderer()
    atexit.register(renderer.close)
    return renderer


@st.cache_resource(show_spinner=False, max_entries=64)
def group_figures(cfg_json: str, name: str, tp: int, rules: str, checkpoint: str, serving: str,
                  carved: tuple, group: int) -> dict:
    """The figures of one layer group (cached like the page; nothing mutates them)."""
    m = page_for(cfg_json, name, tp, rules, checkpoint, serving, carved).m
    return plots.all_figures(m, m.groups[group])


@st.cache_resource(show_spinner=False, max_entries=16)
def every_group_figures(cfg_json: str, name: str, tp: int, rules: str, checkpoint: str, serving: str,
                        carved: tuple = ()) -> list:
    """"All layers": each group's heading with the figures it adds (shared families drawn once)."""
    return plots.grouped_figures(page_for(cfg_json, name, tp, rules, checkpoint, serving, carved).m)


@st.cache_data(show_spinner=False, max_entries=64)
def layout_for(cfg_json: str, name: str, tp: int, pp: int, dp: int, ep: bool, rules: str,
               carved: tuple = (), mm: str = "weights") -> Deployment:
    """One tp x pp x dp (+ EP, or SGLang's carved-out fields) deployment's GPUs: stages, experts, bytes,
    communication (tpviz.deploy.deployment)."""
    return deploy(spec_for(cfg_json, name, mm), Layout(tp, pp, dp, ep, **dict(carved)), rules)

"""Plan: every tp x pp x dp (+ expert parallel) layout of N GPUs for a checkpoint, ranked by what fits and by
the KV-cache room it leaves; rejected layouts with the rule that rejects them. A thin view over
tpviz.deploy.ranking."""
import json
from urllib.parse import urlencode

import streamlit as st

from explorer.cache import layout_for, spec_for
from explorer.fit import QUICK_GIB
from explorer.plan_state import ENGINES, PLAN_FIELDS, plan_from_query, plan_link, plan_query
from explorer.sidebar import RULE_LABELS
from explorer.state import query_from_controls
from explorer.text import literal
from tpviz.deploy.fit import capped_context
from tpviz.render.text import fmt_bytes
from tpviz.errors import TpvizError
from tpviz.deploy.equivalent import PAIRED_WITHOUT_TOWER, compare
from tpviz.deploy.hardware import Topology, catalog, gpu_type
from tpviz.deploy.perf import EP_SAME, GOALS, Speed, Workload, bound_sentence
from tpviz.deploy.traffic import LEAST_NOTE
from tpviz.deploy.ranking import plan_notes, plan_rows, rank_engines
from tpviz.deploy.sizing import Sizer
from tpviz.render.plots.deployment import device_grid, expert_figure
from tpviz.render.plots.perf import terms_figure
from tpviz.rules import BOTH, engines_of, ruleset
from tpviz.rules.layout import CARVED
from tpviz.config.sources import find_preset, presets, repo_from_url
from tpviz.config.hub import PICK_HINT, fetch_config


ENGINE_LABELS = {**RULE_LABELS, BOTH: "vLLM 0.33 + SGLang 0.5.23"}
# this page reads presets and hub ids; a local config.json plans from the command line
PLAN_HINT = "pick a preset, or plan a local config.json with python -m tpviz plan PATH --gpus N --gpu-mem GIB"


@st.cache_resource(show_spinner=False, max_entries=16)
def sizer_for(cfg_json: str, name: str, rules: str) -> Sizer:
    """One Sizer per model and engine: its traced cuts serve every question (GPUs, goal, context) asked."""
    return Sizer(spec_for(cfg_json, name), rules)


@st.cache_data(show_spinner=False, max_entries=64)
def cached_plan(cfg_json: str, name: str, gpus: int, gib: float, rules: str, util: float,
                context: int, speed: tuple | None = None) -> list[dict]:
    """plan_rows of one question (the same answer for every visitor who asks it), each with its engine's rule
    set and launch line; speed = (GPU type, GPUs per node, Workload fields) ranks by the speed bound."""
    spec = spec_for(cfg_json, name)
    topo, work = (Topology(gpu_type(speed[0]), speed[1]), Workload(*speed[2:])) if speed else (None, None)
    engines = engines_of(rules)
    pairs = rank_engines(spec, gpus, gib, engines, util, context, topo, work,
                         {r: sizer_for(cfg_json, name, r) for r in engines})
    return [{**plan_rows([row], speed is not None)[0], "rules": r.name, "engine": r.label,
             "launch": r.launch(name, row.layout)} for r, row in pairs]


@st.cache_data(show_spinner=False, max_entries=32)
def cached_compare(cfg_json: str, name: str, gpus: int, gib: float, util: float, context: int) -> list[dict]:
    """vLLM's layouts beside the same deployment in SGLang (tpviz.deploy.equivalent.compare), as table
    rows."""
    def side(engine: str, s) -> dict:
        if s is None:
            return {engine: "—", f"{engine} verdict": "no such layout", f"{engine} weights / GPU": "",
                    f"{engine} KV tokens": ""}
        r = s.row
        return {engine: r.layout.label,
                f"{engine} verdict": ("fits" if r.fits else "does not fit") if r.problem is None else
                f"rejected: {r.problem}",
                f"{engine} weights / GPU": fmt_bytes(r.weights) if r.problem is None else "",
                f"{engine} KV tokens": f"{r.kv_tokens:,}" if r.problem is None else ""}
    pairs = compare(spec_for(cfg_json, name), gpus, gib, util, context)
    return [{**side("vLLM 0.33", a), **side("SGLang 0.5.23", b)} for a, b in pairs]


def speed_cells(r: dict) -> dict:
    """The speed bound's columns of one row (blank where a layout does not fit or is not modelled)."""
    if (p := r.get("perf")) is None:
        why = "not one whole sequence fits" if r["fits"] and not r["max_sequences"] else \
            "not modelled" if r["fits"] else ""
        return {"TPOT ms ≥": None, "tok/s per GPU ≤": None, "TTFT ms ≥": None, "batch": None,
                "bottleneck": why}
    return {"TPOT ms ≥": round(p["tpot_ms"], 2), "tok/s per GPU ≤": round(p["out_tok_s_per_gpu"]),
            "TTFT ms ≥": round(p["ttft_ms"], 1), "batch": p["batch"],
            "bottleneck": p["bottleneck"] + ("" if p["meets_limits"] else " · misses the TPOT limit")
            + (f" · crosses nodes ({', '.join(p['crosses'])})" if p["crosses"] else "")}


def model_config(text: str) -> tuple[str, str]:
    """(config JSON, name) for a preset or a hub id; a hub failure names what works here instead."""
    text = repo_from_url(text.strip())
    key = find_preset(text)
    if key:
        return json.dumps(presets()[key], sort_keys=True), key
    try:
        return json.dumps(fetch_config(text), sort_keys=True), text
    except TpvizError as e:
        raise type(e)(str(e).replace(PICK_HINT, PLAN_HINT)) from None


def _pick() -> None:
    if st.session_state.get("plan_pick"):
        st.session_state.plan_gib = float(st.session_state.plan_pick)


def _gpu_type() -> None:  # a GPU type brings its memory
    if (name := st.session_state.get("plan_gpu")) in catalog():
        st.session_state.plan_gib = float(catalog()[name].mem_gib)


def speed_inputs() -> tuple | None:
    """The GPU type and workload of a speed ranking (None: rank by fit and KV room alone)."""
    names = ["", *catalog()]
    gpu = st.selectbox("GPU type (ranks layouts by a speed bound)", names, key="plan_gpu",
                       on_change=_gpu_type,
                       format_func=lambda n: catalog()[n].label if n else "memory only: rank by KV room")
    if not gpu:
        return None
    c1, c2, c3, c4, c5, c6 = st.columns(6)
    prompt = c1.number_input("Input tokens", 1, 1 << 24, key="plan_in")
    output = c2.number_input("Output tokens", 1, 1 << 24, key="plan_out")
    concurrency = c3.number_input("Concurrency (0: as many as fit)", 0, 1_000_000, key="plan_conc")
    goal = c4.radio("Goal", GOALS, key="plan_goal", horizontal=True,
                    format_func={"throughput": "most tokens/s per GPU", "latency": "lowest TPOT"}.get)
    tpot = c5.number_input("TPOT limit, ms (0: none)", 0.0, 10_000.0, key="plan_tpot")
    per_node = c6.number_input("GPUs per node", 1, 72, key="plan_per_node")
    if goal == "latency" and not concurrency:
        concurrency = 1  # TPOT at a concurrency: one request unless asked
    return gpu, int(per_node), int(prompt), int(output), int(concurrency) or None, goal, float(tpot) or None


def show_row(r: dict, cfg_json: str, name: str, gib: float, util: float, context: int, speed) -> None:
    """A picked row: its link to the explorer (with the fit and speed inputs, so it opens to the same
    verdict), its launch line, its speed terms and its GPUs."""
    fit_inputs = {"gpu_mem": gib, "gpu_util": util, "context": context}
    if speed and r.get("perf"):
        fit_inputs |= {"gpu_type": speed[0], "output_len": speed[3],
                       "concurrency": min(r["perf"]["batch"], 100_000)}
    query = urlencode(query_from_controls({"source": "Hub repo id", "hub": name, **r, **fit_inputs}),
                      safe="/")
    st.markdown(f"**{literal(r['layout'])}** ({r['engine']}): [open its map in the explorer](/?{query}) "
                "(every GPU's rows and columns, its stage and experts, and this layout's collectives).")
    st.code(r["launch"], language="bash")
    if not r["valid"]:
        return
    st.caption("Weights per GPU by stage: " + ", ".join(fmt_bytes(b) for b in r["stage_weights"]))
    lay = layout_for(cfg_json, name, r["tp"], r["pp"], r["dp"], r["ep"], r["rules"],
                     tuple((k, r[k]) for k in CARVED if k in r))
    steps = None
    if speed and (p := r.get("perf")):
        st.plotly_chart(terms_figure(p["stage_terms"], r["layout"], p["tpot_ms"]), theme=None, key="terms")
        steps = [Speed.step_time(t) for t in p["stage_terms"]]
    st.plotly_chart(device_grid(lay, steps), theme=None, key="grid")
    if (fig := expert_figure(lay)) is not None:
        st.plotly_chart(fig, theme=None, key="experts")


def restore_from_query() -> list[str]:
    """A fresh page (or one come back to: Streamlit drops an unseen page's widgets) takes its question from
    the link, the defaults elsewhere; set before the widgets, so none passes a default of its own. Returns the
    link's values it had to ignore."""
    state, problems = st.session_state, []
    if "plan_model" not in state:
        values, problems = plan_from_query(st.query_params.to_dict())
        for key, value in values.items():
            state[key] = value
    for key, (_, default) in PLAN_FIELDS.items():
        state.setdefault(key, default)
    return problems


def main() -> None:
    st.set_page_config(page_title="tpviz · Plan", layout="wide")  # the table's "why" column needs the room
    st.title("Plan a deployment")
    st.caption("Every layout of your GPUs that the chosen engine would accept for this "
               "checkpoint, ranked: what fits first, then the most concurrent sequences, or, with a GPU "
               "type, by a speed bound for your workload. Per-GPU bytes come from the traced maps of each "
               "cut.")
    for problem in restore_from_query():
        st.error(literal(problem))
    c1, c2, c3 = st.columns([3, 1, 1])
    text = c1.selectbox("Model (preset) or type a hub id", list(presets()), key="plan_model",
                        accept_new_options=True)
    gpus = c2.number_input("GPUs", 1, 1024, key="plan_gpus")
    rules = c3.radio("Rules", ENGINES, key="plan_rules", format_func=ENGINE_LABELS.get)
    st.pills("GPU memory quick picks (GiB)", QUICK_GIB, key="plan_pick", on_change=_pick)
    speed = speed_inputs()
    c4, c5, c6 = st.columns(3)
    gib = c4.number_input("GPU memory (GiB)", 1.0, 10_000.0, key="plan_gib")
    util = c5.slider("gpu_memory_utilization", 0.5, 0.98, step=0.01, key="plan_util")
    context = speed[2] + speed[3] if speed else \
        c6.number_input("Context per sequence (tokens)", 1, 10_000_000, step=1024, key="plan_context")
    query = plan_query({k: st.session_state.get(k) for k in PLAN_FIELDS})
    if st.query_params.to_dict() != query:  # the address is the question, after an error too
        st.query_params.from_dict(query)
    st.markdown(plan_link(query))
    try:
        cfg_json, name = model_config(str(text or ""))
        with st.spinner("Tracing each cut of the model…"):
            rows = cached_plan(cfg_json, name, int(gpus), float(gib), rules, float(util), int(context), speed)
    except TpvizError as e:
        st.error(literal(str(e)))
        return
    spec = spec_for(cfg_json, name)
    sized = capped_context(spec, int(context))[0]  # the notes below say when it was capped
    accepted = [r for r in rows if r["valid"]]
    if not accepted:
        st.warning(f"No layout of {int(gpus)} GPUs is accepted for {literal(name)}; the reasons are below.")
    table = [{**({"engine": r["engine"]} if rules == BOTH else {}), "layout": r["layout"],
              "verdict": ("fits" if r["fits"] else "does not fit") if r["valid"] else "rejected",
              "weights / GPU": fmt_bytes(r["weights_per_gpu"]) if r["valid"] else "",
              "KV tokens": f"{r['kv_tokens']:,}" if r["valid"] else "",
              f"sequences of {sized:,}": f"{r['max_sequences']:,}" if r["valid"] else "",
              "comm / token": ("not modelled" if r["comm_per_token"] is None
                               else fmt_bytes(r["comm_per_token"]))
              if r["valid"] else "",
              **(speed_cells(r) if speed else {}),
              "why": r["problem"] or "; ".join(r["warnings"]),
              **({"launch": r["launch"]} if rules == BOTH or speed else {})} for r in rows]
    event = st.dataframe(table, hide_index=True, width="stretch", key="plan_table", on_select="rerun",
                         selection_mode="single-row")
    if rules == BOTH:
        st.markdown("#### The same deployment in both engines")
        st.caption("Each vLLM layout beside SGLang's flags for it, paired only where both "
                   "put the same bytes, experts and KV cache on every GPU; — : that "
                   "engine has no such layout (SGLang's partial EP, vLLM's experts over tp × dp replicas).")
        st.dataframe(cached_compare(cfg_json, name, int(gpus), float(gib), float(util), int(context)),
                     hide_index=True, width="stretch", key="compare_table")
        if spec_for(cfg_json, name).tower:
            st.caption(f"{PAIRED_WITHOUT_TOWER[0].upper()}{PAIRED_WITHOUT_TOWER[1:]}.")
    picked = event.selection.rows if event and hasattr(event, "selection") else []
    if picked:
        show_row(rows[picked[0]], cfg_json, name, float(gib), float(util), int(context), speed)
    logits = "gather to GPU 0" if rules != BOTH and ruleset(rules).logits == "gather" else "all-gather"
    st.caption("Comm / token: what the busiest GPU sends for each decoded token: ring "
               "all-reduces over the tp GPUs after attention, dense and MoE layers (with or without "
               "EP) and the embedding; the MoE blocks' gather and reduce-scatter of tokens "
               "across dp replicas (vLLM 0.33's default all2all backend); the pipeline "
               "hand-off (hidden state and residual, 1/tp from each GPU, all-gathered by the next "
               "stage); norms spanning the tp cut (OLMo's q and k, a one-group Mamba2 norm); and the "
               f"logits' {logits} (a decoded token is sampled; a prefill token is not).")
    if any(r["valid"] and r["comm_per_token"] is None for r in rows):
        st.caption("Comm / token is not modelled for SGLang's attention DP and EP (its DP gathers and expert "
                   "sums): those rows say so rather than guess."
                   + (f" {LEAST_NOTE[0].upper()}{LEAST_NOTE[1:]}." if speed else ""))
    if speed:
        st.caption(literal(f"Speed: {bound_sentence(spec)}"))
        if any(r.get("perf") and r["ep"] for r in rows):
            st.caption(f"Note: {EP_SAME}.")
    for note in {n: None for r in ([rules] if rules != BOTH else ["vllm", "sglang"])
                 for n in plan_notes(spec, r, any(x["fits"] for x in rows), int(context))}:
        st.caption(literal(f"Note: {note}."))


if __name__ == "__main__":  # spawned Run-live ranks re-import pages: build nothing there
    main()

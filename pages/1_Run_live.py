"""Run live: a real TP forward pass over spawned ranks, checked against one device.

Spawn-safe: Streamlit runs this file as __main__, and every spawned rank re-imports __main__, so the
whole body lives in main() under the guard below; the ranks' code is in tpviz.live.
"""
import json
import time
from pathlib import Path

import streamlit as st
from streamlit.runtime.scriptrunner_utils.exceptions import RerunException, StopException
import torch

from explorer.text import literal
from tpviz.errors import TpvizError
from tpviz.live.check import NOISE_MULTIPLE, verify
from tpviz.live.download import human_size
from tpviz.live.errors import for_page
from tpviz.live.inject import INJECTIONS
from tpviz.live.inputs import parse_ids_text, tokenize
from tpviz.live.report import environment_rows, rank_figure, stage_figure
from tpviz.live.runner import choose_backend
from tpviz.live.slot import max_ranks, one_run_at_a_time
from tpviz.live.source import local_tokenizer, resolve_model

UPLOAD_MB = 1  # a config.json is a few KB; as in the explorer
QUEUED = "Another run is in progress on this server; yours starts when it ends (one live run at a time)."
PHASES = {"download": "Download the checkpoint", "spawn": "Spawn ranks and join the process group",
          "load": "Load each rank's weight slices",
          "forward": "Forward pass on every rank", "compare": "Compare against tp=1"}
SOURCES = ("Preset", "Hub repo id", "Local folder", "Upload config.json")
DEFAULT_PRESET = "Qwen/Qwen3-0.6B"
PLOTLY_CONFIG = {"displaylogo": False}
HUB_SOURCES = ("Preset", "Hub repo id")
RANK_COLUMNS = {"read % of checkpoint": st.column_config.NumberColumn("read %", help="share of the checkpoint read"),
                "params MiB": st.column_config.NumberColumn("held MiB", help="local parameters this rank holds"),
                "collective MiB": st.column_config.NumberColumn(
                    "coll. MiB", help="bytes of the tensors passed to collectives")}


class PhaseStatus:
    """One st.status per phase: the previous one completes (with its time) when the next begins."""

    def __init__(self):
        self.box, self.phase, self.started, self.shown, self.bar = None, None, 0.0, 0.0, None

    def __call__(self, phase: str) -> None:
        self.finish()
        if phase in PHASES:
            self.box, self.phase, self.started = st.status(f"{PHASES[phase]}…", state="running"), phase, time.time()

    def tick(self) -> None:
        """Every 0.1 s of a run: the elapsed time in the running box, twice a second. Each update is also a
        point where Streamlit can end the script, so Stop (or a changed control) ends the run at once."""
        now = time.time()
        if self.box is not None and now - self.shown >= 0.5:
            self.box.update(label=f"{PHASES[self.phase]}… {now - self.started:.0f} s")
            self.shown = now

    def download(self, message: str, done: int, total: int) -> None:
        """Checkpoint download progress (called on the script's thread while the download runs): a bar in its
        box, updated twice a second; like tick, each update is a point where Stop ends the run and the download."""
        now = time.time()
        if self.phase != "download":
            self("download")
            with self.box:
                self.bar = st.progress(0.0)
            self.shown = 0.0
        if self.bar is not None and (now - self.shown >= 0.5 or done >= total):
            self.bar.progress(min(1.0, done / total) if total else 1.0,
                              text=f"{human_size(done)} of {human_size(total)}")
            self.shown = now

    def finish(self, state: str = "complete") -> None:
        if self.box is not None:
            self.box.update(label=f"{PHASES[self.phase]} ({time.time() - self.started:.1f} s)", state=state)
            self.box = None


def model_input() -> tuple[str | bytes, bool]:
    """The model widget(s) (the explorer's presets, a hub id, a local checkpoint folder, or an uploaded config)
    and whether to run random weights instead of the checkpoint's."""
    from tpviz.sources import WEB_LOCAL_HINT, presets, web_local_root
    root = web_local_root()
    kind = st.radio("Model source", [s for s in SOURCES if root or s != "Local folder"],
                    horizontal=True, key="live_source")
    if root is None:
        st.caption(f"Local folders are off in the web app; {WEB_LOCAL_HINT}.")
    random = kind == "Upload config.json" or bool(st.session_state.get("live_random"))  # the box is drawn below
    weights = "random weights from the seed" if random else "its checkpoint is downloaded from the Hugging Face hub"
    if kind == "Preset":
        names = list(presets())
        model = st.selectbox(f"Preset ({weights})", names, key="live_preset",
                             index=names.index(DEFAULT_PRESET) if DEFAULT_PRESET in names else 0)
    elif kind == "Hub repo id":
        model = hub_id(st.text_input(f"Hugging Face repo id ({weights})", key="live_hub",
                                     placeholder="Qwen/Qwen3-0.6B"), root)
    elif kind == "Local folder":
        model = st.text_input("Checkpoint folder (config.json, *.safetensors; "
                              + ("its weights are not read: random weights)" if random else "random weights if none)"),
                              key="live_folder", placeholder="/models/Qwen3-0.6B")
        st.caption(f"Limited to {root}.")
    else:
        upload = st.file_uploader("config.json (random weights)", type=["json"], key="live_upload",
                                  max_upload_size=UPLOAD_MB)
        st.caption("A config alone has no weights: it runs with random weights from the seed.")
        return (upload.getvalue() if upload is not None else ""), True
    random = st.checkbox("Random weights", key="live_random",
                         help="Seeded random weights of the model's shapes instead of its checkpoint: nothing is "
                              "downloaded or read, and the result says random weights")
    if kind in HUB_SOURCES:
        st.caption("Random weights from the seed (Advanced): nothing is downloaded." if random else
                   "Real weights: the safetensors checkpoint is downloaded once into the Hugging Face cache and "
                   "reused, also offline; pickle-only repos are refused.")
    return model, random


def hub_id(text: str, root: str | None) -> str:
    """A hub id or preset from the hub box, never a server path (unless local folders are allowed);
    an error line and no model otherwise."""
    from tpviz.sources import REPO_ID, find_preset, repo_from_url
    text = repo_from_url(text.strip())
    if not text or find_preset(text) or root:  # with a root set, the library confines local paths
        return text
    if REPO_ID.match(text) and not {".", ".."} & set(text.split("/")) and not Path(text).exists():
        return text
    st.error(f"{literal(text)} is not a Hugging Face repo id (owner/name); pick Preset for the built-in models")
    return ""


def input_ids_for(model: str | bytes, prompt: str, tp: int, layers: int | None, seed: int,
                  ep: bool = False, random: bool = False, download=None) -> torch.Tensor | None:
    """Ids from the prompt: tokenized when the checkpoint has a tokenizer, typed ids otherwise; None = random."""
    if not prompt.strip():
        return None
    source = resolve_model(model, layers, seed, tp, ep=ep, random_weights=random, download=download)
    vocab = source.cfg.spec.vocab_size
    if source.tokenizer_dir is not None:
        return tokenize(prompt, source.tokenizer_dir, vocab)
    return parse_ids_text(prompt, vocab)


def short(x: float) -> str:
    """A metric-sized number: '3.88', '0.25', '3.4e-4' (the exact values are in the line above the metrics)."""
    if x == 0 or 1e-2 <= abs(x) < 1e4:
        return f"{x:.3g}"
    mantissa, exponent = f"{x:.1e}".split("e")
    return f"{mantissa}e{int(exponent)}"


def show_result(result) -> None:
    """Verdict, per-stage chart, per-rank table, environment and downloads of one finished run."""
    (st.success if result.passed else st.warning)(result.headline())
    st.caption(f"Weights: random, from seed {result.seed} (not the checkpoint's)." if result.random_weights
               else "Weights: the checkpoint's own (real weights).")
    cols = st.columns([1, 1, 1, 1.35])  # the verdict is in the banner above; where it starts matters most
    cols[0].metric("max |Δlogit|", short(result.max_abs_diff))
    cols[1].metric("tolerance", short(result.tolerance))
    cols[2].metric("argmax agreement", f"{100 * result.argmax_agreement:.1f}%")
    cols[3].metric("first beyond tolerance", result.diverges_at or "none",
                   help="The first stage whose TP output differs from tp=1 by more than its tolerance")
    st.caption(f"Tolerance: {result.tolerance_rule}. Relative difference (max|Δ| / max|logit|): "
               f"{result.max_rel_diff:.3g}.")
    for inj in result.injections:
        (st.info if inj.has_effect else st.warning)(
            f"Injected **{inj.name}**: {inj.description}. " + ("" if inj.has_effect else "It has **no effect** here: ")
            + inj.reason + ".")
    st.plotly_chart(stage_figure(result), config=PLOTLY_CONFIG, key="stage_chart")
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
        st.caption(f"Note: {note}")
    st.download_button("Download result JSON", json.dumps(result.to_dict(), indent=2), file_name="verify.json",
                       mime="application/json", key="download_json")


def main() -> None:
    """The page: inputs on the left, phases and results on the right."""
    st.set_page_config(page_title="tpviz · Run live", layout="wide")
    st.title("Run live")
    st.caption("Split a real model over tp ranks (one process each; pipeline stages and expert parallelism too), "
               "run one forward pass, and check it against a single device: is a difference a bug or float noise, "
               "and where does it start?")
    left, right = st.columns([1, 2])
    with left:
        model, random = model_input()
        tp = int(st.number_input("tp size", min_value=1, max_value=64, value=2, key="live_tp"))
        pp = int(st.number_input("Pipeline stages", min_value=1, max_value=16, value=1, key="live_pp",
                                 help="Each stage runs its share of the layers on tp ranks and sends the hidden "
                                      "state on (point-to-point)"))
        ep = st.checkbox("Expert parallelism", key="live_ep",
                         help="MoE models: each routed expert lives whole on one of the tp ranks")
        placement = st.radio("Expert placement", ["linear", "round_robin"], horizontal=True, key="live_placement",
                             disabled=not ep)
        device = st.selectbox("Device", ["auto", "cpu", "cuda"], key="live_device")
        dtype = st.selectbox("dtype", ["float32", "bfloat16", "float16"], key="live_dtype",
                             help=f"bf16/fp16 pass within {NOISE_MULTIPLE:g}x the measured noise floor")
        layers = int(st.number_input("Layers to keep (0 = all)", min_value=0, max_value=512, value=2, key="live_layers",
                                     help="Keep only the first layers: a quick check of a big config"))
        inject = st.multiselect("Inject a TP bug", list(INJECTIONS), key="live_inject",
                                help="; ".join(f"{k}: {v}" for k, v in INJECTIONS.items()))
        if local_tokenizer(model) is not None:
            prompt = st.text_area("Prompt (tokenized with the folder's tokenizer)", key="live_prompt",
                                  value="Tensor parallelism splits every weight matrix")
        elif st.session_state.get("live_source") in HUB_SOURCES and not random:
            prompt = st.text_area("Prompt (tokenized with the repo's tokenizer, or token ids; empty = random ids)",
                                  key="live_prompt")
        else:
            prompt = st.text_input("Token ids (e.g. 1 2 3, or [[1, 2], [3, 4]]; empty = random)", key="live_ids")
        with st.expander("Advanced"):
            seq_len = int(st.number_input("Random ids per row", 1, 4096, 32, key="live_seq_len"))
            seed = int(st.number_input("Seed", 0, 2**31 - 1, 0, key="live_seed"))
            timeout = float(st.number_input("Timeout (s)", 5, 3600, 300, key="live_timeout"))
        run = st.button("Run", type="primary", key="live_run")
    with right:
        try:
            env = choose_backend(tp * pp, device)
            gpus = ", ".join(env.gpus) if env.gpus else "none"
            cap = max_ranks(len(env.gpus))
            st.caption(f"GPUs found: {gpus}. Backend: **{env.backend}** on {env.device} ({env.reason}). "
                       + (f"This machine runs at most {cap} ranks; one live run at a time." if cap else ""))
        except TpvizError as e:
            st.error(str(e))
            return
        if stopped := st.session_state.pop("live_stopped", None):
            st.warning(f"The last run was stopped during “{stopped.lower()}”; its ranks were ended.")
        if run:
            status = PhaseStatus()
            try:
                ids = input_ids_for(model, prompt, tp, layers or None, seed, ep, random, status.download)
                with one_run_at_a_time(on_wait=lambda: st.info(QUEUED)):
                    result, _ = verify(model, tp, device=device, dtype=dtype, input_ids=ids, inject=inject,
                                       layers=layers or None, seed=seed, seq_len=seq_len, timeout=timeout,
                                       progress=status, tick=status.tick, pp=pp, ep=ep, placement=placement,
                                       random_weights=random, download_progress=status.download)
                st.session_state["live_result"] = result
            except TpvizError as e:  # every user error (and a failed rank) is one line, never a traceback
                status.finish("error")
                st.error(for_page(str(e)))
                if "live_result" in st.session_state:
                    st.caption("The previous run's result:")
            except Exception as e:  # noqa: BLE001 - last resort: still one line, never a traceback
                status.finish("error")
                first = (str(e).strip().splitlines() or [""])[0][:300]
                st.error(f"unexpected {type(e).__name__}: {first}")
                if "live_result" in st.session_state:
                    st.caption("The previous run's result:")
            except (StopException, RerunException):  # run_group's finally has stopped the ranks already;
                st.session_state["live_stopped"] = PHASES.get(status.phase, "Start")  # the page can only say so
                raise                                                                 # on its next run
        if "live_result" in st.session_state:
            show_result(st.session_state["live_result"])
        else:
            st.info("Pick a model and tp size, then press Run.")


if __name__ == "__main__":
    main()

"""Run live: a real TP forward pass over spawned ranks, checked against one device.

Spawn-safe: Streamlit runs this file as __main__, and every spawned rank re-imports __main__, so the
whole body lives in main() under the guard below; the ranks' code is in tpviz.live, the widgets and
result view in explorer.run_live and explorer.live_result.
"""
import time

import streamlit as st
from streamlit.runtime.scriptrunner_utils.exceptions import RerunException, StopException

from explorer.live_result import show_memory, show_result
from explorer.run_live import (PHASES, PhaseStatus, injection_hint, injection_reach, layout_input,
                               memory_estimate, model_input, text_input, typed_shape)
from explorer.text import literal
from tpviz.errors import TpvizError
from tpviz.live.check.compare import NOISE_MULTIPLE
from tpviz.live.check.verify import verify
from tpviz.live.errors import for_page
from tpviz.live.check.inject import INJECTIONS
from tpviz.live.load.inputs import parse_ids_text
from tpviz.live.check import memory
from tpviz.live.load.dtypes import DTYPE_CHOICES
from tpviz.live.run.runner import choose_backend
from tpviz.live.run.slot import max_ranks, one_run_at_a_time

QUEUED = "Another run is in progress on this server; yours starts when it ends (one live run at a time)."


def main() -> None:
    """The page: inputs on the left, phases and results on the right."""
    st.set_page_config(page_title="tpviz · Run live", layout="wide")
    st.title("Run live")
    st.caption("Split a real model over tp ranks (one process each; pipeline stages and "
               "expert parallelism too), run one forward pass, and check it against a single "
               "device: is a difference a bug or float noise, and where does it start?")
    left, right = st.columns([1, 2])
    with left:
        model, random = model_input()
        tp = int(st.number_input("tp size", min_value=1, max_value=64, value=2, key="live_tp"))
        pp = int(st.number_input("Pipeline stages", min_value=1, max_value=16, value=1, key="live_pp",
                                 help="Each stage runs its share of the layers on tp ranks "
                                      "and sends the hidden state on (point-to-point)"))
        rules, ep, placement, carve = layout_input(tp)
        attn_dp = carve.get("attn_dp", 1)
        device = st.selectbox("Device", ["auto", "cpu", "cuda"], key="live_device")
        dtype = st.selectbox("dtype", [d for d in DTYPE_CHOICES if d != "auto"] + ["auto"], key="live_dtype",
                             help=f"bf16/fp16 pass within {NOISE_MULTIPLE:g}x the measured "
                                  "noise floor; auto runs in the dtype the checkpoint is stored in")
        layers = int(st.number_input("Layers to keep (0 = all)", min_value=0, max_value=512,
                                     value=2, key="live_layers",
                                     help="Keep only the first layers: a quick check of a big config"))
        # which bugs can bite this model, up front
        reach = injection_reach(model, tp, layers, rules, attn_dp) if model else {}
        inject = st.multiselect("Inject a TP bug", list(INJECTIONS), key="live_inject",
                                format_func=lambda n: n if reach.get(n, (True,))[0]
                                else f"{n} (no effect here)",
                                help="; ".join(f"{k}: {v}" for k, v in INJECTIONS.items()))
        if hint := injection_hint(reach, inject):
            st.caption(literal(hint))
        text, is_prompt, generate = text_input(model, random)
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
            st.caption(f"GPUs found: {literal(gpus)}. Backend: **{env.backend}** on {env.device} "
                       f"({literal(env.reason)}). "
                       + (f"This machine runs at most {cap} ranks; one live run at a time." if cap else ""))
            available = memory.available_memory(env.device, len(env.gpus))  # fresh: other runs come and go
        except TpvizError as e:
            st.error(str(e))
            return
        est = memory_estimate(model, tp, pp, ep, placement, layers, dtype, random, env.device,
                              len(env.gpus), typed_shape(text, is_prompt, generate, attn_dp), rules,
                              tuple(carve.items())) if model else None
        if isinstance(est, str):  # the run would refuse it: say so before Run is pressed
            st.warning(f"As chosen, this cannot run: {literal(for_page(est))}")
            est = None
        elif est is not None:
            show_memory(est, available)
        # the last run's own record: a stopped script thread cannot write st.session_state (each write is a
        # point where Streamlit stops it again), but it can fill a dict it took from there
        flight = st.session_state.get("live_flight") or {}
        if flight.get("running"):  # Stop (or a changed control) started this rerun while the last run's
            # thread still works; it ends at its next tick and says where
            with st.spinner("Stopping the last run: its ranks end at its next step…"):
                deadline = time.monotonic() + 600
                while flight.get("running") and time.monotonic() < deadline:
                    time.sleep(0.1)
        if stopped := flight.pop("stopped", None):
            st.warning(f"The last run was stopped during “{stopped.lower()}”; its ranks were ended.")
        chosen = (model, tp, pp, ep, placement, layers, dtype, random, device, tuple(inject), text, generate,
                  rules, tuple(carve.items()))
        if run:
            # a click while the ranks work reruns the page: the run ends at its next tick, and the rerun says
            # where (Streamlit's own Stop ends it too, said at the next rerun)
            stop = st.empty()
            stop.button("Stop", key="live_stop", help="End the ranks now")
            status = PhaseStatus()
            flight = st.session_state["live_flight"] = {"running": True}
            try:  # a prompt is tokenized by the run, after its memory check; typed ids are read here
                prompt = text if is_prompt and text.strip() else None
                ids = parse_ids_text(text, None) if not is_prompt and text.strip() else None
                # said once the run has passed its checks, never above one line saying why it could not run
                note = ("Random ids have nothing to continue: this run checks one forward pass (type a "
                        "prompt or token ids to generate text)." if prompt is None and ids is None else
                        "Generation continues one sequence: these rows are checked without it."
                        if ids is not None and ids.shape[0] > 1 else
                        "Attention DP gives each group its own rows: this run checks one forward pass "
                        "without generating." if attn_dp > 1 else "") if generate else ""
                one_row = prompt is not None or ids is not None and ids.shape[0] == 1
                generate = generate if one_row and attn_dp == 1 else 0
                with one_run_at_a_time(on_wait=lambda: st.info(QUEUED)):
                    result, _ = verify(model, tp, device=device, dtype=dtype, input_ids=ids, inject=inject,
                                       layers=layers or None, seed=seed, seq_len=seq_len, timeout=timeout,
                                       progress=status, tick=status.tick, pp=pp, ep=ep, placement=placement,
                                       random_weights=random, download_progress=status.download,
                                       prompt=prompt, generate=generate, rules=rules, carve=carve,
                                       batch=max(2, attn_dp))
                st.session_state["live_result"], st.session_state["live_result_for"] = result, chosen
                if note:
                    st.caption(note)
            except TpvizError as e:  # every user error (and a failed rank) is one line, never a traceback
                status.finish("error")
                st.error(for_page(str(e)))
                if "live_result" in st.session_state:
                    st.caption("The previous run's result:")
            except Exception as e:  # noqa: BLE001 - last resort: still one line, never a traceback
                status.finish("error")
                first = (str(e).strip().splitlines() or [""])[0][:300]
                st.error(literal(f"unexpected {type(e).__name__}: {first}"))
                if "live_result" in st.session_state:
                    st.caption("The previous run's result:")
            except (StopException, RerunException):  # run_group's finally has stopped the ranks already;
                # the page can only say so
                flight["stopped"] = PHASES.get(status.phase, "Start")
                raise                                                                 # on its next run
            finally:
                flight["running"] = False  # first: the st call below raises once stopped
                stop.empty()
        if "live_result" in st.session_state:
            last = st.session_state["live_result"]
            if st.session_state.get("live_result_for") != chosen:  # never read as a verdict on the new choice
                st.info(f"This is the last run's result, for {literal(last.model)} at "
                        f"{last.layout}; the choices have changed since: press Run to check them.")
            show_result(last)
        elif not run:  # after a failed first run the error above is the whole answer
            st.info("Pick a model and tp size, then press Run.")


if __name__ == "__main__":
    main()

"""The Run-live page's widgets (app_pages/1_Run_live.py runs them; the result view is
explorer/live_result.py); the checking is in tpviz.live."""
import time
from pathlib import Path

import streamlit as st

from tpviz.config.sources import REPO_ID, find_preset, repo_from_url
from tpviz.config.sources import WEB_LOCAL_HINT, presets, web_local_root
from tpviz.live.check.inject import INJECTIONS, describe_injections
from tpviz.live.load.source import live_config, local_tokenizer, read_model
from explorer.state import HUB_SOURCES
from explorer.text import literal
from tpviz.errors import TpvizError
from tpviz.live.load.download import human_size
from tpviz.live.check.generate import MAX_NEW_TOKENS
from tpviz.live.load.inputs import parse_ids_text
from tpviz.live.check.memory import MemoryEstimate, input_shape, plan_memory
from tpviz.live.check.verify import carved_layout
from tpviz.rules import RULE_SETS, RULES, ruleset

UPLOAD_MB = 1  # a config.json is a few KB; as in the explorer
PHASES = {"download": "Download the checkpoint", "spawn": "Spawn ranks and join the process group",
          "load": "Load each rank's weight slices",
          "forward": "Forward pass on every rank", "compare": "Compare against tp=1"}
SOURCES = ("Preset", "Hub repo id", "Local folder", "Upload config.json")
DEFAULT_PRESET = "Qwen/Qwen3-0.6B"
DEFAULT_PROMPT = "Tensor parallelism splits every weight matrix"


def layout_input(tp: int) -> tuple[str, bool, str, dict]:
    """The rule set the ranks split by and its layout inside tp: vLLM's EP (and placement), or SGLang's
    attention DP, --ep and switches carved out of tp. Returns (rules, ep, placement, carve)."""
    rules = st.radio("Rules", RULES, key="live_rules", horizontal=True,
                     format_func=lambda r: RULE_SETS[r].label,
                     help="The engine whose split the ranks run; SGLang's --tp is the stage width, attention "
                          "DP and --ep are carved out of it")
    if not ruleset(rules).carves:
        ep = st.checkbox("Expert parallelism", key="live_ep",
                         help="MoE models: each routed expert lives whole on one of the tp ranks")
        placement = st.radio("Expert placement", ["linear", "round_robin"], horizontal=True,
                             key="live_placement", disabled=not ep)
        return rules, ep, placement, {}
    divisors = [n for n in range(1, tp + 1) if tp % n == 0]
    for key in ("live_attn_dp", "live_ep_size"):  # a size kept from another tp: back to 1, not an error
        if st.session_state.get(key, 1) not in divisors:
            st.session_state[key] = 1
    left, right = st.columns(2)
    attn_dp = left.selectbox("--attn-dp-size", divisors, key="live_attn_dp",
                             help="Attention-DP groups of tp / N ranks, each running its own rows of the "
                                  "batch")
    ep_size = right.selectbox("--ep", divisors, key="live_ep_size",
                              help="The experts in N contiguous blocks, each cut tp / N ways (N = tp: whole)")
    dense = st.checkbox("--moe-dense-tp-size 1", key="live_dense_tp1",
                        help="DeepSeek's dense MLPs whole on every rank")
    head = st.checkbox("--enable-dp-lm-head", key="live_dp_lm_head",
                       help="The lm_head cut over each attention group, on its own rows")
    return rules, False, "linear", {"attn_dp": int(attn_dp), "ep_size": int(ep_size), "dense_tp1": dense,
                                    "dp_lm_head": head}


class PhaseStatus:
    """One st.status per phase: the previous one completes (with its time) when the next begins."""

    def __init__(self):
        self.box, self.phase, self.started, self.shown, self.bar = None, None, 0.0, 0.0, None

    def __call__(self, phase: str) -> None:
        self.finish()
        if phase in PHASES:
            self.box, self.phase, self.started = st.status(f"{PHASES[phase]}…",
                                                           state="running"), phase, time.time()

    def tick(self) -> None:
        """Every 0.1 s of a run: the elapsed time in the running box, twice a second. Each update is also a
        point where Streamlit can end the script, so Stop (or a changed control) ends the run at once."""
        now = time.time()
        if self.box is not None and now - self.shown >= 0.5:
            self.box.update(label=f"{PHASES[self.phase]}… {now - self.started:.0f} s")
            self.shown = now

    def download(self, message: str, done: int, total: int) -> None:
        """Checkpoint download progress (called on the script's thread while the download runs): a bar in its
        box, updated twice a second; like tick, each update is a point where Stop ends the run and the
        download."""
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
    """The model widget(s) (the explorer's presets, a hub id, a local checkpoint folder, or an uploaded
    config) and whether to run random weights instead of the checkpoint's."""
    root = web_local_root()
    kind = st.radio("Model source", [s for s in SOURCES if root or s != "Local folder"],
                    horizontal=True, key="live_source")
    if root is None:
        st.caption(f"Local folders are off in the web app; {WEB_LOCAL_HINT}.")
    # the box is drawn below
    random = kind == "Upload config.json" or bool(st.session_state.get("live_random"))
    weights = ("random weights from the seed" if random
               else "its checkpoint is downloaded from the Hugging Face hub")
    if kind == "Preset":
        names = list(presets())
        model = st.selectbox(f"Preset ({weights})", names, key="live_preset",
                             index=names.index(DEFAULT_PRESET) if DEFAULT_PRESET in names else 0)
    elif kind == "Hub repo id":
        model = hub_id(st.text_input(f"Hugging Face repo id ({weights})", key="live_hub",
                                     placeholder="Qwen/Qwen3-0.6B"), root)
    elif kind == "Local folder":
        model = st.text_input("Checkpoint folder (config.json, *.safetensors; "
                              + ("its weights are not read: random weights)" if random
                                 else "random weights if none)"),
                              key="live_folder", placeholder="/models/Qwen3-0.6B")
        st.caption(literal(f"Limited to {root}."))
    else:
        upload = st.file_uploader("config.json (random weights)", type=["json"], key="live_upload",
                                  max_upload_size=UPLOAD_MB)
        st.caption("A config alone has no weights: it runs with random weights from the seed.")
        return (upload.getvalue() if upload is not None else ""), True
    random = st.checkbox("Random weights", key="live_random",
                         help="Seeded random weights of the model's shapes instead of its "
                              "checkpoint: nothing is downloaded or read, and the result says random weights")
    if kind in HUB_SOURCES:
        st.caption("Random weights from the seed (Advanced): nothing is downloaded." if random else
                   "Real weights: the safetensors checkpoint is downloaded once into the "
                   "Hugging Face cache and reused, also offline; pickle-only repos are refused.")
    return model, random


def hub_id(text: str, root: str | None) -> str:
    """A hub id or preset from the hub box, never a server path (unless local folders are allowed);
    an error line and no model otherwise."""
    text = repo_from_url(text.strip())
    if not text or find_preset(text) or root:  # with a root set, the library confines local paths
        return text
    if REPO_ID.match(text) and not {".", ".."} & set(text.split("/")) and not Path(text).exists():
        return text
    st.error(f"{literal(text)} is not a Hugging Face repo id (owner/name); pick Preset "
             "for the built-in models")
    return ""


def text_input(model, random: bool) -> tuple[str, bool, int]:
    """The input box, whether it holds a prompt, and the number of new tokens: a prompt when the model has a
    tokenizer (a local folder's, or a hub repo's, which comes with its real weights), else token ids, saying
    why there is no tokenizer."""
    kind = st.session_state.get("live_source")
    local = local_tokenizer(model) is not None
    is_prompt = local or kind in HUB_SOURCES and not random
    if local:
        text = st.text_area("Prompt (tokenized with the folder's tokenizer)",
                            DEFAULT_PROMPT, key="live_prompt")
    elif kind in HUB_SOURCES and not random:
        text = st.text_area("Prompt (tokenized with the repo's own tokenizer, downloaded with "
                            "its weights; a repo without one takes token ids; empty = random ids)",
                            key="live_prompt", placeholder=DEFAULT_PROMPT)
    else:
        why = {"Upload config.json": "a config.json alone has no tokenizer",
               "Local folder": "this folder has no tokenizer.json or tokenizer.model"}.get(
            kind, "random weights download nothing, so there is no tokenizer")
        text = st.text_input("Token ids (e.g. 1 2 3, or [[1, 2], [3, 4]]; empty = random)", key="live_ids")
        st.caption(f"Token ids, not text: {why}.")
    # a typed prompt continues by 8 tokens unless changed; token ids, or an empty box (random ids, as in a
    # first run with the defaults), by none unless asked: random ids have nothing to continue
    typed = is_prompt and bool(text.strip())
    n = int(st.number_input("New tokens to generate (0 = none)", 0, MAX_NEW_TOKENS, 8 if typed else 0,
                            key="live_generate" if typed else "live_generate_ids",
                            help="Greedy continuation of the prompt on TP and on tp=1, "
                                 "each following its own picks, shown side by side with "
                                 "where they part and why"))
    return text, is_prompt, n


@st.cache_data(show_spinner=False, max_entries=64, ttl=600)
def injection_reach(model: str | bytes, tp: int, layers: int, rules: str = "vllm",
                    attn_dp: int = 1) -> dict[str, tuple[bool, str]]:
    """Before a run: for each injectable bug, whether it can change this model's output at this tp (and
    SGLang's attention DP), and why ({} when the config cannot be read yet: the run itself will say why)."""
    try:
        cfg = live_config(read_model(model).spec, layers or None, rules)
        return {i.name: (i.has_effect, i.reason)
                for i in describe_injections(list(INJECTIONS), cfg, tp, attn_dp)}
    except Exception:  # noqa: BLE001 - a bad or unreachable source is reported by the run, in one line
        return {}


def injection_hint(reach: dict[str, tuple[bool, str]], chosen: list[str]) -> str | None:
    """One caption: the chosen bugs that cannot bite here and why, with one that can."""
    idle = [f"{n} has no effect here ({reach[n][1]})" for n in chosen if n in reach and not reach[n][0]]
    biting = [n for n, (effect, _) in reach.items() if effect and n not in chosen]
    if not idle:
        return None
    return "; ".join(idle) + (f". Try {biting[0]}: {reach[biting[0]][1]}." if biting else ".")


def typed_shape(text: str, is_prompt: bool, generate: int, attn_dp: int = 1) -> tuple[int, int]:
    """The [batch, seq] the typed input makes (random ids: 2 x 32, or a row per attention-DP group), for the
    estimate; ids that do not parse are left to the run, which says why."""
    try:
        ids = parse_ids_text(text, None) if text.strip() and not is_prompt else None
    except TpvizError:
        ids = None
    return input_shape(ids, max(2, attn_dp), 32, text if is_prompt and text.strip() else None,
                       generate if attn_dp == 1 else 0)


@st.cache_data(show_spinner=False, max_entries=64, ttl=600)
def memory_estimate(model: str | bytes, tp: int, pp: int, ep: bool, placement: str, layers: int, dtype: str,
                    random: bool, device: str, gpus: int, shape: tuple[int, int] = (0, 0),
                    rules: str = "vllm", carve: tuple = ()) -> MemoryEstimate | str | None:
    """Before a run: the weights each rank and the tp=1 reference will hold, from the shard map, and the
    activations for an input of `shape` (typed_shape: cached by shape, so typing a prompt recomputes nothing);
    or the one line saying why this model cannot run as chosen (None when even that is unknown: the run will
    say). `carve`: SGLang's layout fields inside tp, as (name, value) pairs."""
    try:
        layout = carved_layout(rules, tp, pp, ep, dict(carve))
        return plan_memory(model, tp, pp=pp, ep=ep, placement=placement, layers=layers or None, dtype=dtype,
                           device=device, gpus=gpus, random_weights=random, input_shape=shape, rules=rules,
                           layout=layout)
    except TpvizError as e:  # unsupported, too big, an invalid split: said before Run is pressed
        return str(e)
    except Exception:  # noqa: BLE001 - anything else is reported by the run, in one line
        return None

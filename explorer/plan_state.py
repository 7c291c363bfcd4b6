"""The Plan page's shareable question: ?model=&gpus=&rules=&gpu=&util=&ctx= (and with a GPU type
&hw=&in=&out=&conc=&goal=&tpot=&node=) <-> its controls (no Streamlit import). A name the explorer's link uses
too means the same there (gpu: GiB of GPU memory; util, ctx, hw, out), so an explorer link opened here keeps
those."""
from urllib.parse import urlencode

from explorer.state import read_number
from tpviz.config.sources import find_preset, repo_from_url
from tpviz.deploy.hardware import catalog
from tpviz.deploy.perf import GOALS
from tpviz.rules import BOTH, RULES

PLAN_MODEL = "deepseek-ai/DeepSeek-V3"
ENGINES = (*RULES, BOTH)
MAX_GPUS = 1024
# control key -> (its name in the link, its default); a value at its default stays out of the link
PLAN_FIELDS = {"plan_model": ("model", PLAN_MODEL), "plan_gpus": ("gpus", 8),
               "plan_rules": ("rules", RULES[0]), "plan_gib": ("gpu", 141.0), "plan_util": ("util", 0.9),
               "plan_context": ("ctx", 8192),
               "plan_gpu": ("hw", ""), "plan_in": ("in", 1024), "plan_out": ("out", 1024),
               "plan_conc": ("conc", 0), "plan_goal": ("goal", GOALS[0]), "plan_tpot": ("tpot", 0.0),
               "plan_per_node": ("node", 8)}
PLAN_NUMBERS = {"plan_gpus": (int, 1, MAX_GPUS), "plan_gib": (float, 1.0, 10_000.0),
                "plan_util": (float, 0.5, 0.98), "plan_context": (int, 1, 10_000_000),
                "plan_in": (int, 1, 1 << 24), "plan_out": (int, 1, 1 << 24), "plan_conc": (int, 0, 1_000_000),
                "plan_tpot": (float, 0.0, 10_000.0), "plan_per_node": (int, 1, 72)}
SPEED_KEYS = ("plan_in", "plan_out", "plan_conc", "plan_goal", "plan_tpot", "plan_per_node")  # with hw= only


def plan_from_query(params: dict[str, str]) -> tuple[dict, list[str]]:
    """The controls a Plan link sets (the rest keep their defaults), and one line per value it had to
    ignore; names the page does not use (an explorer link's tp=) are left alone."""
    values, problems = {}, []
    for key, (name, default) in PLAN_FIELDS.items():
        if name not in params:
            continue
        text = str(params[name]).strip()
        value, want = _read(key, text)
        if value is None:
            shown = "no GPU type" if key == "plan_gpu" else default
            problems.append(f"{name}={text[:20]!r} in the link is not {want}; showing {shown}")
        else:
            values[key] = value
    return values, problems


def _read(key: str, text: str) -> tuple:
    """(one control's value read from the link, or None; what it must be)."""
    if key in PLAN_NUMBERS:
        return read_number(text, *PLAN_NUMBERS[key])
    if key == "plan_model":  # a preset (any case), a hub id or a pasted hub URL
        model = repo_from_url(text)
        ok = 0 < len(model) <= 200 and model.isascii() and model.isprintable() and " " not in model
        return (find_preset(model) or model if ok else None), "a preset or a hub repo id"
    choices = {"plan_rules": ENGINES, "plan_goal": GOALS, "plan_gpu": tuple(catalog())}[key]
    if key == "plan_rules":  # a '+' typed into an address reads back as a space
        text = text.replace(" ", "+")
    return (text.lower() if text.lower() in choices else None), f"one of {', '.join(choices)}"


def plan_query(values: dict) -> dict[str, str]:
    """The link of a Plan question: the model and GPU count always, the rest where they differ from their
    defaults; the workload only with a GPU type (it ranks nothing without one), the context only without
    (a workload's context is its input plus output)."""
    speed = bool(values.get("plan_gpu"))
    out = {}
    for key, (name, default) in PLAN_FIELDS.items():
        value = values.get(key, default)
        if key in SPEED_KEYS and not speed or key == "plan_context" and speed:
            continue
        if value != default or key in ("plan_model", "plan_gpus"):
            out[name] = _number(value) if isinstance(value, float) else str(value)
    return out


def plan_of_view(model: str, gpus: int, rules: str, fit: dict) -> dict[str, str]:
    """The Plan question of an explorer view: its model, GPU count, engine and fit inputs (explorer/state.py
    FIT_KEYS); with a GPU type, its workload too (the context less its output tokens is the input)."""
    values = {"plan_model": model, "plan_gpus": gpus, "plan_rules": rules, "plan_gib": float(fit["gpu_mem"]),
              "plan_util": float(fit["gpu_util"]), "plan_context": int(fit["context"]),
              "plan_gpu": fit.get("gpu_type") or ""}
    if values["plan_gpu"]:
        output = int(fit["output_len"])
        values |= {"plan_in": max(int(fit["context"]) - output, 1), "plan_out": output,
                   "plan_conc": int(fit["concurrency"])}
    return plan_query(values)


def _number(value: float) -> str:
    """A float as short as it reads back exactly: 141, 79.6."""
    short = f"{value:g}"
    return short if float(short) == value else repr(value)


def plan_link(query: dict[str, str], text: str = "Link to this plan", page: str = "") -> str:
    """A markdown link to the Plan question `query` describes (page "/Plan" from another page)."""
    return f"[{text}]({page}?{urlencode(query, safe='/')})"

"""The explorer's shareable view state: ?model=...&tp=...&rules=...(&pp=&dp=&ep=, SGLang's
&attn_dp=&ep_size=&dense_tp1=&dp_lm_head=&shared_tp1=, and the rest of the view: &dtype=&kv=&mm=&gpu=&util=
&ctx=&conc=&hw=&out=&group=&tab=) <-> the controls (no Streamlit import)."""
from urllib.parse import urlencode

from tpviz.config.spec import KV_DTYPES, SERVE_DTYPES
from tpviz.config.tower import MODES
from tpviz.deploy.fit import GPU_UTILIZATION
from tpviz.deploy.hardware import catalog
from tpviz.rules import RULES
from tpviz.rules.layout import CARVED
from tpviz.config.sources import repo_from_url
from tpviz.render.summary import MAX_TP

SOURCES = ("Preset", "Hub repo id", "Local path", "Upload config.json")
HUB_SOURCES = SOURCES[:2]  # what a link to another page (Plan, Run live) can carry: a preset or a hub id
DEFAULT_VIEW = {"source": "Preset", "preset": "Qwen/Qwen3-8B", "hub": "", "path": "",
                "tp": 4, "rules": "vllm", "pp": 1, "dp": 1, "ep": False, **CARVED}
MAX_PP_DP = 64
# the rest of a view: control key -> (its name in the link, its default, left out of the link): serving
# choices, the fit inputs, the layer group (-1: all layers; None: the largest) and the open figure tab
EXTRAS = {"serve_dtype": ("dtype", "auto"), "kv_dtype": ("kv", "auto"), "mm_encoder": ("mm", "weights"),
          "gpu_mem": ("gpu", 80.0),
          "gpu_util": ("util", GPU_UTILIZATION), "context": ("ctx", 8192), "concurrency": ("conc", 16),
          "gpu_type": ("hw", ""), "output_len": ("out", 1024), "layer_group": ("group", None),
          "tab": ("tab", None)}
FIT_KEYS = ("gpu_mem", "gpu_util", "context", "concurrency", "gpu_type", "output_len")
NUMBERS = {"gpu_mem": (float, 1.0, 10_000.0), "gpu_util": (float, 0.5, 0.98), "context": (int, 1, 10_000_000),
           "concurrency": (int, 1, 100_000), "output_len": (int, 1, 10_000_000)}
FLAGS = {"1": True, "true": True, "on": True, "0": False, "false": False, "off": False}


def controls_from_query(params: dict[str, str], preset_keys: list[str]) -> tuple[dict, list[str]]:
    """Control values restored from query parameters, and one line per parameter that had to be ignored."""
    values, problems = dict(DEFAULT_VIEW), []
    model = repo_from_url(str(params.get("model", "")).strip())
    if model:
        key = next((k for k in preset_keys if k.lower() == model.lower()), None)
        if key:
            values["preset"] = key
        elif model.startswith((".", "/", "~")) or "\\" in model:
            values.update(source="Local path", path=model)
        else:
            values.update(source="Hub repo id", hub=model)
    if "tp" in params:
        text = str(params["tp"]).strip()
        # not '²' or '①'
        if text.isascii() and text.isdigit() and len(text) <= 3 and 1 <= int(text) <= MAX_TP:
            values["tp"] = int(text)
        else:
            problems.append(f"tp={text[:20]!r} in the link is not a whole number from 1 to {MAX_TP}; "
                            f"showing tp={values['tp']}")
    for key in ("pp", "dp"):
        if key in params:
            text = str(params[key]).strip()
            if text.isascii() and text.isdigit() and len(text) <= 3 and 1 <= int(text) <= MAX_PP_DP:
                values[key] = int(text)
            else:
                problems.append(f"{key}={text[:20]!r} in the link is not a whole number "
                                f"from 1 to {MAX_PP_DP}; showing {key}={values[key]}")
    if "ep" in params:
        text = str(params["ep"]).strip().lower()
        if text in FLAGS:
            values["ep"] = FLAGS[text]
        else:
            problems.append(f"ep={text[:20]!r} in the link is not 1 or 0; showing expert parallelism off")
    for key, default in CARVED.items():  # SGLang's attention DP and EP inside tp
        if key not in params:
            continue
        text = str(params[key]).strip().lower()
        if isinstance(default, bool) and text in FLAGS:
            values[key] = FLAGS[text]
        elif not isinstance(default, bool) and text.isascii() and text.isdigit() and 1 <= int(text) <= MAX_TP:
            values[key] = int(text)
        else:
            want = "1 or 0" if isinstance(default, bool) else f"a whole number from 1 to {MAX_TP}"
            problems.append(f"{key}={text[:20]!r} in the link is not {want}; showing {key}={default}")
    for key, (name, default) in EXTRAS.items():
        if name in params:
            value, want = _extra(key, str(params[name]).strip())
            if value is None:
                problems.append(f"{name}={str(params[name])[:20]!r} in the link is not {want}; showing "
                                f"{'the default' if default is None else default}")
            else:
                values[key] = value
    if "rules" in params:
        rules = str(params["rules"]).strip().lower()
        if rules in RULES:
            values["rules"] = rules
        else:
            problems.append(f"rules={rules[:20]!r} in the link is unknown; use one of {', '.join(RULES)}")
    return values, problems


def _extra(key: str, text: str):
    """(the value of one of EXTRAS read from the link, or None; what it must be)."""
    if key in NUMBERS:
        return read_number(text, *NUMBERS[key])
    if key == "layer_group":  # the picker's own numbering, 1 for the first group; 'all' for all layers
        value = -1 if text.lower() == "all" else int(text) - 1 if text.isdigit() and len(text) <= 3 else None
        return (value if value is None or value >= -1 else None), "a group number (1, 2, ...) or all"
    if key == "tab":  # a figure's key ('experts', 'qkv'); one the view lacks opens the first tab
        ok = 0 < len(text) <= 40 and text.replace("_", "").isalnum() and text.isascii()
        return (text if ok else None), "a figure name"
    if key == "gpu_type":  # a catalog GPU's name (tpviz.deploy.hardware)
        return (text.lower() if text.lower() in catalog() else None), f"one of {', '.join(catalog())}"
    choices = {"serve_dtype": SERVE_DTYPES, "mm_encoder": MODES}.get(key, tuple(KV_DTYPES))
    return (text if text in choices else None), f"one of {', '.join(choices)}"


def read_number(text: str, kind: type, low: float, high: float) -> tuple:
    """(a link's number within [low, high], or None; what it must be)."""
    try:
        value = kind(text) if text.isascii() and len(text) <= 12 else None
    except ValueError:
        value = None
    ok = value is not None and low <= value <= high and value == value  # NaN is not a number here
    word = (lambda n: f"{n:,}") if kind is int else (lambda n: f"{n:,g}")  # 1,000,000, not 1e+06
    return (value if ok else None), f"a number from {word(low)} to {word(high)}"


def extra_query(values: dict) -> dict[str, str]:
    """The EXTRAS of a view that differ from their defaults, under their link names."""
    out = {}
    for key, (name, default) in EXTRAS.items():
        value = values.get(key, default)
        if value is None or value == default:
            continue
        out[name] = ("all" if value < 0 else str(value + 1)) if key == "layer_group" else (
            f"{value:g}" if isinstance(value, float) else str(value))
    return out


def with_fit(query: dict[str, str], values: dict) -> dict[str, str]:
    """A link's query with the fit inputs of `values` in place of its own (the fit section reruns alone)."""
    names = {EXTRAS[k][0] for k in FIT_KEYS}
    return {**{k: v for k, v in query.items() if k not in names},
            **extra_query({k: values[k] for k in FIT_KEYS if k in values})}


def query_from_controls(values: dict) -> dict[str, str]:
    """The query parameters that reproduce a view (an uploaded config cannot travel in a link)."""
    model = {"Preset": values.get("preset"), "Hub repo id": values.get("hub"),
             "Local path": values.get("path")}.get(values.get("source"))
    query = {"model": str(model).strip()} if model and str(model).strip() else {}
    extra = {k: str(values[k]) for k in ("pp", "dp") if values.get(k, 1) != 1}  # plain TP links stay short
    carved = {k: str(int(values[k])) for k, v in CARVED.items() if values.get(k, v) != v}
    return {**query, "tp": str(values["tp"]), "rules": values["rules"], **extra,
            **({"ep": "1"} if values.get("ep") else {}), **carved, **extra_query(values)}


def link_markdown(query: dict[str, str]) -> str:
    """The sidebar's share link to the view `query` describes."""
    return f"[Link to this view](?{urlencode(query, safe='/')})"

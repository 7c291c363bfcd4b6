"""The explorer's shareable view state: ?model=...&tp=...&rules=...(&pp=&dp=&ep=, and SGLang's
&attn_dp=&ep_size=&dense_tp1=&dp_lm_head=&shared_tp1=) <-> the controls (no Streamlit import)."""
from tpviz.rules import RULES
from tpviz.rules.layout import CARVED
from tpviz.config.sources import repo_from_url
from tpviz.render.summary import MAX_TP

SOURCES = ("Preset", "Hub repo id", "Local path", "Upload config.json")
DEFAULT_VIEW = {"source": "Preset", "preset": "Qwen/Qwen3-8B", "hub": "", "path": "",
                "tp": 4, "rules": "vllm", "pp": 1, "dp": 1, "ep": False, **CARVED}
MAX_PP_DP = 64
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
    if "rules" in params:
        rules = str(params["rules"]).strip().lower()
        if rules in RULES:
            values["rules"] = rules
        else:
            problems.append(f"rules={rules[:20]!r} in the link is unknown; use one of {', '.join(RULES)}")
    return values, problems


def query_from_controls(values: dict) -> dict[str, str]:
    """The query parameters that reproduce a view (an uploaded config cannot travel in a link)."""
    model = {"Preset": values.get("preset"), "Hub repo id": values.get("hub"),
             "Local path": values.get("path")}.get(values.get("source"))
    query = {"model": str(model).strip()} if model and str(model).strip() else {}
    extra = {k: str(values[k]) for k in ("pp", "dp") if values.get(k, 1) != 1}  # plain TP links stay short
    carved = {k: str(int(values[k])) for k, v in CARVED.items() if values.get(k, v) != v}
    return {**query, "tp": str(values["tp"]), "rules": values["rules"], **extra,
            **({"ep": "1"} if values.get("ep") else {}), **carved}

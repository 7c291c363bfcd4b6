"""AppTest helpers for the explorer: run app.py in-process, read its errors, heading and charts."""
import json
import re

from streamlit.testing.v1 import AppTest
from tests.paths import ROOT

APP = str(ROOT / "app.py")


def run_app(query: dict | None = None, timeout: float = 90) -> AppTest:
    """A fresh session of the explorer, optionally opened with query parameters."""
    at = AppTest.from_file(APP, default_timeout=timeout)
    for key, value in (query or {}).items():
        at.query_params[key] = value
    return at.run()


def errors(at: AppTest) -> list[str]:
    """st.error lines of the page (PNG-export notices excluded), after checking there is no traceback."""
    assert not at.exception, [e.value for e in at.exception]
    return [shown(e.value) for e in at.error if "Chromium" not in e.value]


def shown(markdown: str) -> str:
    """What a reader sees of escaped text (explorer/text.literal): the backslash escapes removed."""
    return re.sub(r"\\(.)", r"\1", markdown)


def heading(at: AppTest) -> str:
    """The view's title, e.g. 'Qwen/Qwen3-8B on 4 GPUs'."""
    return shown(next(m.value for m in at.markdown if m.value.startswith("## ") and " on " in m.value)[3:])


def charts(at: AppTest) -> list[dict]:
    """The page's Plotly figures as JSON."""
    return [json.loads(c.proto.spec) for c in at.get("plotly_chart")]


def payload_bytes(at: AppTest) -> int:
    """Bytes of Plotly JSON the page sends."""
    return sum(len(c.proto.spec) for c in at.get("plotly_chart"))


def figure_tabs(at: AppTest) -> list[str]:
    """The labels of the figure tabs (one per matrix family, then memory)."""
    return [t.label for t in at.get("tab")]


def tab_charts(at: AppTest, section: str = "figtabs_0_") -> list[dict]:
    """Every figure of a tab set, opening each tab in turn (only the open tab's figure is drawn), then the
    first tab again; charts drawn outside the tabs (layer strip, deployment) are left out."""
    labels, out = figure_tabs(at), []
    for label in labels:
        at.session_state[section] = label
        at.run()
        out.append(charts(at)[-1])
    at.session_state[section] = labels[0]
    at.run()
    return out

"""Start the explorer with `streamlit run` on a free port and drive it with headless system Chromium."""
from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING
from tests.paths import ROOT

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Page, Playwright

CHROMIUM = "/usr/bin/chromium"
SCREENSHOTS = ROOT / "tests" / "screenshots"  # gitignored
# without the background-networking flags Chromium keeps hammering the closed network
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


class AppURL(str):
    """The app's base URL, with the pid of the server behind it (for its memory)."""
    pid: int


def server_rss_mib(url: AppURL) -> float:
    """The server process's resident memory, in MiB (Linux)."""
    status = Path(f"/proc/{url.pid}/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS:"))) / 1024


def free_port() -> int:
    """A TCP port nobody listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def streamlit_app(env: dict | None = None, timeout: float = 60.0, script: str = "app.py") -> Iterator[AppURL]:
    """Run a Streamlit script (app.py) with `python -m streamlit run`; yield its base URL once /_stcore/health
    answers."""
    port = free_port()
    cmd = [sys.executable, "-m", "streamlit", "run", script, "--server.headless", "true", "--server.port",
           str(port), "--server.address", "127.0.0.1", "--browser.gatherUsageStats", "false"]
    full_env = {**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})}  # tests never touch the network
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    log = open(SCREENSHOTS / "streamlit.log", "w")  # the server's output, kept for debugging a failed run
    proc = subprocess.Popen(cmd, cwd=ROOT, env=full_env, stdout=log, stderr=subprocess.STDOUT)
    url = AppURL(f"http://127.0.0.1:{port}")
    url.pid = proc.pid
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                with urllib.request.urlopen(f"{url}/_stcore/health", timeout=1) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"streamlit did not become healthy (exit code {proc.poll()})")
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def launch(playwright: Playwright) -> Browser:
    """Headless Debian Chromium through Playwright (playwright install cannot download here)."""
    return playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)


def wait_for_charts(page: Page, count: int, timeout_ms: int = 60_000) -> None:
    """Wait until at least `count` Plotly charts have drawn and Streamlit has stopped running."""
    # a drawn chart has several .main-svg layers: count charts, not layers
    page.wait_for_function(f"[...document.querySelectorAll('div.stPlotlyChart')]"
                           f".filter(d => d.querySelector('.js-plotly-plot .main-svg')).length >= {count}",
                           timeout=timeout_ms, polling=250)
    wait_idle(page, timeout_ms)


def wait_idle(page: Page, timeout_ms: int = 60_000) -> None:
    """Wait for Streamlit's run indicator ('Running…', or a 'Stop' button in newer releases) to go away."""
    page.wait_for_function(
        "(() => { const w = document.querySelector('[data-testid=\"stStatusWidget\"]');"
        " return !w || !/Running|Stop/.test(w.innerText); })()",
        timeout=timeout_ms, polling=250)


def wait_settled(page: Page, quiet_s: float = 1.0, timeout_ms: int = 60_000) -> None:
    """Idle for `quiet_s` on end: the run indicator shows only after a delay, so one idle look can come before
    a rerun that is already under way."""
    deadline = time.monotonic() + timeout_ms / 1000
    while time.monotonic() < deadline:
        wait_idle(page, timeout_ms)
        time.sleep(quiet_s)
        if page.evaluate("!/Running|Stop/.test(document.querySelector('[data-testid=\"stStatusWidget\"]')"
                         "?.innerText || '')"):
            return
    raise TimeoutError(f"the app did not settle within {timeout_ms} ms")


HEADING = "[data-testid=stMain] h2"


def heading(page: Page) -> str:
    """The view's title, e.g. 'Qwen/Qwen3-8B on 4 GPUs'."""
    return page.locator(HEADING).first.inner_text()


def wait_heading(page: Page, text: str, timeout_ms: int = 60_000) -> None:
    """Wait until the view's title contains text."""
    page.wait_for_function(f"(document.querySelector({HEADING!r}) || {{innerText: "
                           f"''}}).innerText.includes({text!r})", timeout=timeout_ms, polling=250)


def choose(page: Page, label: str, option: str) -> None:
    """Pick an option of a Streamlit selectbox by its label, typing to filter the list."""
    box = page.locator("div.stSelectbox").filter(has_text=label).first
    box.locator("input").first.click()
    box.locator("input").first.fill(option)
    page.locator("[role=option]").filter(has_text=option).first.click()


README_VIEW = "/?model=meta-llama/Llama-3.1-8B&tp=16&rules=vllm"  # shows replicated KV heads at a glance


def shoot_explorer(browser: Browser, base_url: str, path: Path) -> Path:
    """The README screenshot: header, metrics, the KV-head note and the q/k/v figure of a shared URL."""
    context = browser.new_context(viewport={"width": 1400, "height": 1180}, device_scale_factor=1)
    page = context.new_page()
    page.goto(base_url + README_VIEW)
    wait_for_charts(page, 1)  # the open tab's figure
    page.mouse.move(5, 5)  # no hover label in the picture
    page.wait_for_timeout(800)  # let Plotly finish its transitions
    path.parent.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=path)
    context.close()
    return path


def main() -> None:
    """`python tests/browser/harness.py`: write docs/explorer.png from a fresh `streamlit run`."""
    from playwright.sync_api import sync_playwright
    with streamlit_app() as url, sync_playwright() as p:
        browser = launch(p)
        print(f"wrote {shoot_explorer(browser, url, ROOT / 'docs' / 'explorer.png')}")
        browser.close()


if __name__ == "__main__":
    main()


FIGURES = 1  # one tab per matrix family: only the open tab's figure is drawn
VIEWPORT = {"width": 1400, "height": 1000}


def no_errors(pg: Page) -> None:
    """No Python traceback and no st.error on the page."""
    assert pg.locator("[data-testid=stException]").count() == 0
    alerts = pg.locator("[data-testid=stAlertContentError]").all_inner_texts()
    assert [a for a in alerts if "Chromium" not in a] == [], alerts

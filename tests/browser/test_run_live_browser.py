"""Real browser: the Run live page spawns its ranks from inside `streamlit run app.py` and shows the verdict.

This is the path AppTest cannot cover: Streamlit makes the page script __main__, and every spawned rank
re-imports it, so only a real server shows that the page is spawn-safe.
"""
from pathlib import Path

import pytest

from harness import CHROMIUM, SCREENSHOTS, launch, streamlit_app, wait_for_charts

pytestmark = [pytest.mark.browser, pytest.mark.slow,
              pytest.mark.skipif(not Path(CHROMIUM).exists(),
                                 reason=f"{CHROMIUM} not found: install it with `apt-get install "
                                        "chromium` (root, Debian)")]
playwright_api = pytest.importorskip("playwright.sync_api", reason="python playwright is not installed")


def test_navigation_and_a_tp2_run_from_the_page():
    with streamlit_app() as url, playwright_api.sync_playwright() as p:
        browser = launch(p)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1100})
            page.goto(url)
            wait_for_charts(page, 1)
            nav = page.locator("[data-testid=stSidebarNav]").inner_text()
            assert "Explorer" in nav and "Run live" in nav
            page.goto(f"{url}/Run_live")
            # the preset's shapes; nothing is downloaded
            page.get_by_text("Random weights", exact=True).click()
            page.wait_for_selector("text=Preset (random weights from the seed)")
            page.get_by_role("button", name="Run").click()
            page.wait_for_selector("text=vs tp=1 float32", timeout=120_000)  # the verdict banner
            verdict = page.locator("[data-testid=stAlert]").filter(has_text="vs tp=1").first.inner_text()
            assert verdict.startswith("PASS: tp=2 vs tp=1") and "random weights (seed 0)" in verdict, verdict
            assert page.locator("text=Traceback").count() == 0
            SCREENSHOTS.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(SCREENSHOTS / "06_run_live_tp2.png"), full_page=True)
            # Stop while the ranks work: the page reruns and says where the run ended
            tp = page.get_by_role("spinbutton", name="tp size")
            tp.fill("4")
            tp.press("Enter")
            page.get_by_role("button", name="Run").click()
            # the page's own Stop, not the header's (Streamlit shows one there while a run is slow)
            main = page.get_by_test_id("stMainBlockContainer")
            main.get_by_role("button", name="Stop").click(timeout=60_000)
            page.wait_for_selector("text=The last run was stopped during", timeout=120_000)
            # the rerun drops the stopped run's Stop button once it is drawn
            page.wait_for_function("() => ![...document.querySelectorAll('button')]"
                                   ".some(b => b.innerText.trim() === 'Stop')", timeout=30_000)
            assert page.locator("text=Traceback").count() == 0
        finally:
            browser.close()

"""Real browser, a fresh server whose first visitor opens a page's own link (/Plan, /Run_live): the page comes
with the app's navigation (Explorer first) and its styles, as it does after the explorer. A folder Streamlit
finds by itself (pages/) was served alone to that visitor, its navigation reading 'app'. This module starts
its own server so that its first request is such a link."""
from pathlib import Path
from urllib.parse import unquote

import pytest

from harness import CHROMIUM, no_errors, wait_idle

pytestmark = [pytest.mark.browser,
              pytest.mark.skipif(not Path(CHROMIUM).exists(),
                                 reason=f"{CHROMIUM} not found: install it with `apt-get install "
                                        "chromium` (root, Debian)")]


def test_a_first_visit_by_a_page_link_gets_the_apps_navigation(page, app_url):
    for path, title in (("/Plan", "Plan a deployment"), ("/Run_live", "Run live")):
        page.goto(app_url + path)
        page.get_by_role("heading", name=title).first.wait_for(timeout=60_000)
        nav = page.locator("[data-testid=stSidebarNav]")
        nav.wait_for(timeout=30_000)
        entries = nav.inner_text().split()
        assert "Explorer" in entries and "app" not in entries, entries


def table_for_the_link(page) -> None:
    """The Plan table drawn for a link's context (its header is in the grid's hidden accessible table)."""
    page.get_by_text("sequences of 32,768").first.wait_for(state="attached", timeout=60_000)


def test_a_plan_link_opens_its_question_and_the_address_follows(page, app_url):
    page.goto(f"{app_url}/Plan?model=Qwen/Qwen3-8B&gpus=4&gpu=24&ctx=32768")
    table_for_the_link(page)
    wait_idle(page)
    no_errors(page)
    assert page.get_by_role("spinbutton", name="GPUs").input_value() == "4"
    gpus = page.get_by_role("spinbutton", name="GPUs")
    gpus.fill("2")
    gpus.press("Enter")
    page.wait_for_function("() => location.search.includes('gpus=2')", timeout=30_000)
    wait_idle(page)
    assert all(part in unquote(page.url) for part in ("model=Qwen/Qwen3-8B", "ctx=32768", "gpu=24"))
    page.reload()  # the address reproduces the page
    table_for_the_link(page)
    wait_idle(page)
    assert page.get_by_role("spinbutton", name="GPUs").input_value() == "2"


def test_the_explorers_plan_link_opens_the_plan_page_on_its_model(page, app_url):
    page.goto(f"{app_url}/?model=meta-llama/Llama-3.1-8B&tp=2&gpu=48")
    link = page.get_by_role("link", name="Plan a deployment")
    link.wait_for(timeout=60_000)
    with page.context.expect_page() as opened:  # Streamlit opens a page's links in a new tab
        link.click()
    plan = opened.value
    plan.get_by_role("heading", name="Plan a deployment").first.wait_for(timeout=60_000)
    plan.get_by_text("TP 2 × PP 1 × DP 1").first.wait_for(state="attached", timeout=60_000)
    wait_idle(plan)
    no_errors(plan)
    asked = ("/Plan?", "model=meta-llama/Llama-3.1-8B", "gpus=2", "gpu=48")
    assert all(part in unquote(plan.url) for part in asked)
    assert plan.get_by_role("spinbutton", name="GPU memory (GiB)").input_value() == "48.00"

"""Real browser, a fresh server whose first visitor opens a page's own link (/Plan, /Run_live): the page comes
with the app's navigation (Explorer first) and its styles, as it does after the explorer. A folder Streamlit
finds by itself (pages/) was served alone to that visitor, its navigation reading 'app'. This module starts
its own server so that its first request is such a link."""
from pathlib import Path

import pytest

from harness import CHROMIUM

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

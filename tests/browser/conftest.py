"""The explorer's browser tests share one app and one Chromium per test module, and a fresh page per test that
fails on any JavaScript error."""
import pytest

from harness import VIEWPORT, launch, streamlit_app


@pytest.fixture(scope="module")
def app_url():
    with streamlit_app() as url:
        yield url


@pytest.fixture(scope="module")
def browser():
    playwright_api = pytest.importorskip("playwright.sync_api", reason="python playwright is not installed")
    with playwright_api.sync_playwright() as p:
        b = launch(p)
        yield b
        b.close()


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport=VIEWPORT, accept_downloads=True)
    pg = context.new_page()
    problems = []
    pg.on("pageerror", lambda e: problems.append(str(e)))
    yield pg
    context.close()
    assert problems == [], problems  # no JavaScript errors while the test ran

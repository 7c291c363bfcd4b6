"""Real browser, the explorer on screens of every size and over a tp change and a reload: figures keep their
proportions and scroll on a phone or beside an open sidebar, a tab draws its figure when opened and a tp
change draws it once, and a full link restores every number. Skipped, with the reason, when /usr/bin/chromium
is absent."""
from pathlib import Path

import pytest

from harness import (CHROMIUM, FIGURES, SCREENSHOTS, choose, no_errors, wait_for_charts, wait_idle,
                     wait_settled)

pytestmark = [pytest.mark.browser,
              pytest.mark.skipif(not Path(CHROMIUM).exists(),
                                 reason=f"{CHROMIUM} not found: install it with `apt-get install "
                                        "chromium` (root, Debian)")]


def test_a_phone_scrolls_the_figures_instead_of_squeezing_them(browser, app_url):
    """390 px wide: each figure keeps its desktop proportions (source and rank panels side by side, titles
    apart) and scrolls sideways; Plotly's toolbar, which would cover the titles, is hidden."""
    context = browser.new_context(viewport={"width": 390, "height": 844}, is_mobile=True, has_touch=True)
    pg = context.new_page()
    pg.goto(app_url + "/?model=meta-llama/Llama-3.1-8B&tp=16")
    wait_for_charts(pg, FIGURES)
    sizes = pg.evaluate("""(() => { const c = document.querySelector('div.stPlotlyChart');
        const box = c.closest('[data-testid=stElementContainer]');
        const bar = c.querySelector('.modebar-container');
        return [c.querySelector('.svg-container').getBoundingClientRect().width, box.clientWidth,
                box.scrollWidth, bar ? getComputedStyle(bar).display : 'none']; })()""")
    pg.screenshot(path=SCREENSHOTS / "06_phone.png")
    context.close()
    drawn, visible, scrollable, toolbar = sizes
    assert drawn >= 980 and visible < 390 and scrollable >= 980 and toolbar == "none", sizes


@pytest.mark.parametrize("width", [1024, 1280])
def test_a_laptop_with_the_sidebar_open_shows_whole_numbers_and_scrolls_the_figures(browser, app_url, width):
    """1024 px: the header's values, labels and notes wrap rather than end in an ellipsis, and the figures
    keep their desktop width and scroll, as on a phone; 1280 px (an 820 px column): the matrix figures, whose
    labels are placed for 980 px or more, keep that width too."""
    context = browser.new_context(viewport={"width": width, "height": 900})
    pg = context.new_page()
    pg.goto(app_url + "/?model=deepseek-ai/DeepSeek-V3&tp=16")
    wait_for_charts(pg, FIGURES)
    cut, drawn, family = pg.evaluate("""(() => [[...document.querySelectorAll(
        '[data-testid=stMetric] [data-testid=stMarkdownContainer], [data-testid=stMetricValue] > div')]
        .filter(e => e.scrollWidth > e.clientWidth + 1).map(e => e.innerText),
        document.querySelector('div.stPlotlyChart .svg-container').getBoundingClientRect().width,
        document.querySelector('[class*=st-key-fig_] .svg-container').getBoundingClientRect().width])()""")
    context.close()
    assert cut == [] and family >= 980 and (drawn >= 980 or width > 1100), (cut, drawn, family)


def test_a_tab_draws_its_figure_when_opened(page, app_url):
    page.goto(app_url + "/?model=Qwen/Qwen3-8B&tp=4")
    wait_for_charts(page, FIGURES)
    page.get_by_role("tab", name="down_proj").click()
    page.wait_for_function("[...document.querySelectorAll('div.stPlotlyChart .gtitle')].some("
                           "t => t.textContent.startsWith('down_proj'))", timeout=60_000)
    wait_idle(page)  # the other families are not drawn meanwhile (a stale chart may linger a moment)
    page.wait_for_function("document.querySelectorAll('div.stPlotlyChart').length === 1", timeout=10_000)
    no_errors(page)


def test_a_tp_change_draws_the_chart_once_and_closed_sections_draw_when_opened(page, app_url):
    page.goto(app_url + "/?model=meta-llama/Llama-3.1-8B&tp=8")
    wait_for_charts(page, FIGURES)
    # count Plotly's full redraws of each chart mounted from now on (its first draw starts before the hook is
    # on)
    page.evaluate("""() => { window.redraws = 0; const hooked = new WeakSet();
        new MutationObserver(() => document.querySelectorAll('.js-plotly-plot').forEach(g => {
            if (!hooked.has(g) && g.on) {
                hooked.add(g); g.on('plotly_beforeplot', () => window.redraws++); } }))
            .observe(document.body, {subtree: true, childList: true, attributes: true}); }""")
    choose(page, "tp size", "16")
    page.wait_for_function("(document.querySelector('div.stPlotlyChart .main-svg') || "
                           "{parentNode: {textContent: ''}}).parentNode.textContent.includes('GPU 15')")
    wait_idle(page)
    page.wait_for_timeout(500)
    assert page.evaluate("window.redraws") == 0  # Streamlit's second hand-over of the chart drew nothing
    assert page.locator("[data-testid=stDataFrame]").count() == 0  # every table is drawn when opened
    page.get_by_text("Serving choices").click()
    page.locator("div.stSelectbox").filter(has_text="KV-cache dtype").wait_for()
    page.get_by_text("At common GPU sizes").click()
    page.locator("[data-testid=stDataFrame]").wait_for()
    no_errors(page)


def view_numbers(pg) -> dict:
    """What a reader reads off the view: the metrics, every alert (fit verdict included), the open tabs."""
    return {"metrics": pg.locator("[data-testid=stMetricValue]").all_inner_texts(),
            "alerts": pg.locator("[data-testid=stAlert]").all_inner_texts(),
            "tabs": pg.locator("[role=tab][aria-selected=true]").all_inner_texts()}


def test_a_full_link_survives_a_reload_with_every_number(page, app_url):
    query = ("model=deepseek-ai/DeepSeek-V3&tp=8&rules=vllm&pp=2&dtype=float16&kv=fp8&gpu=141&util=0.95"
             "&ctx=32768&conc=4&hw=h200&out=2048&group=2&tab=experts")
    page.goto(f"{app_url}/?{query}")
    wait_for_charts(page, 2)
    wait_settled(page)
    no_errors(page)
    seen = view_numbers(page)
    assert "MoE experts" in seen["tabs"] and any("32,768 tokens" in a for a in seen["alerts"])
    assert len(seen["metrics"]) >= 8, seen  # the speed bound's four on H200 too
    assert any(m.endswith(" ms") for m in seen["metrics"]), seen
    assert all(part in page.url for part in query.split("&"))
    page.reload()
    wait_for_charts(page, 2)
    # the charts can draw before the metrics below them, and the run indicator shows only after a delay
    page.wait_for_function(f"document.querySelectorAll('[data-testid=stMetricValue]').length >= "
                           f"{len(seen['metrics'])}", timeout=60_000, polling=250)
    wait_settled(page)
    assert view_numbers(page) == seen
    memory = page.get_by_role("spinbutton", name="GPU memory (GiB)")
    memory.fill("94")
    memory.press("Enter")
    page.wait_for_function("() => location.search.includes('gpu=94')", timeout=30_000)
    wait_idle(page)
    assert view_numbers(page)["alerts"] != seen["alerts"]  # the verdict follows the new GPU size
    # the fit section reran alone: the sidebar's link follows the address, not the last full run
    link = page.locator("[data-testid=stSidebar] a", has_text="Link to this view")
    no_errors(page)  # a fragment writes outside itself only where it wrote at the last full run
    assert link.count() == 1 and "gpu=94" in link.get_attribute("href")
    assert all(part in link.get_attribute("href") for part in ("tab=experts", "group=2", "kv=fp8"))

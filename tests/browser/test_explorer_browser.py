"""Real browser: `streamlit run app.py` driven by headless Debian Chromium through Python Playwright.

Screenshots go to tests/screenshots/ (gitignored). Skipped, with the reason, when /usr/bin/chromium is absent.
"""
import json
import struct
import time
from pathlib import Path

import pytest

from harness import (CHROMIUM, HEADING, SCREENSHOTS, choose, heading, launch, shoot_explorer, streamlit_app,
                     wait_for_charts, wait_heading, wait_idle, wait_settled)

pytestmark = [pytest.mark.browser,
              pytest.mark.skipif(not Path(CHROMIUM).exists(),
                                 reason=f"{CHROMIUM} not found: install it with `apt-get install "
                                        "chromium` (root, Debian)")]
playwright_api = pytest.importorskip("playwright.sync_api", reason="python playwright is not installed")
FIGURES = 1  # one tab per matrix family: only the open tab's figure is drawn
VIEWPORT = {"width": 1400, "height": 1000}


@pytest.fixture(scope="module")
def app_url():
    with streamlit_app() as url:
        yield url


@pytest.fixture(scope="module")
def browser():
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


def no_errors(pg) -> None:
    """No Python traceback and no st.error on the page."""
    assert pg.locator("[data-testid=stException]").count() == 0
    alerts = pg.locator("[data-testid=stAlertContentError]").all_inner_texts()
    assert [a for a in alerts if "Chromium" not in a] == [], alerts


def png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


def test_change_model_and_tp_download_json_and_png(page, app_url):
    from tpviz import shard_map
    page.goto(app_url)
    wait_for_charts(page, FIGURES)
    assert heading(page) == "Qwen/Qwen3-8B on 4 GPUs"
    page.screenshot(path=SCREENSHOTS / "01_default.png")

    choose(page, "Preset", "meta-llama/Llama-3.1-8B")
    wait_heading(page, "meta-llama/Llama-3.1-8B on 4 GPUs")
    choose(page, "tp size", "16")
    wait_heading(page, "on 16 GPUs")
    wait_for_charts(page, FIGURES)
    # the charts were redrawn for 16 GPUs: the rank view now has a strip for GPU 15
    page.wait_for_function("(document.querySelector('div.stPlotlyChart "
                           ".main-svg')?.parentNode.textContent || '').includes('GPU 15')")
    # the URL follows the controls (written as the run ends: on a loaded machine after the charts)
    page.wait_for_function("location.search.includes('tp=16')")
    assert "model=meta-llama%2FLlama-3.1-8B&tp=16&rules=vllm" in page.url
    assert page.locator("[data-testid=stTab]").all_inner_texts()[:3] == ["q/k/v", "o_proj", "gate/up"]
    no_errors(page)
    # hover a band of the first source view: Plotly shows GPU, range and local offset
    box = page.locator("div.stPlotlyChart").first.locator("g.point path").first.bounding_box()
    page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    hover = page.locator("div.stPlotlyChart").first.locator(".hoverlayer")
    page.wait_for_function("(document.querySelector('div.stPlotlyChart .hoverlayer')?.textContent "
                           "|| '').includes('GPU')")
    assert "local rows" in hover.text_content()
    page.screenshot(path=SCREENSHOTS / "02_llama_tp16.png")

    with page.expect_download() as download:
        page.get_by_role("button", name="Shard map (JSON)").click()
    assert download.value.suggested_filename == "Llama-3.1-8B_tp16_vllm.json"
    data = json.loads(Path(download.value.path()).read_text())
    assert data == shard_map("meta-llama/Llama-3.1-8B", 16).to_dict()

    with page.expect_download(timeout=60_000) as download:
        page.locator(".st-key-png_qkv button").click()
    assert download.value.suggested_filename == "Llama-3.1-8B_tp16_vllm_01_qkv.png"
    width, height = png_size(Path(download.value.path()).read_bytes())
    assert width == 2600 and height > 1000


def test_invalid_tp_shows_one_error_and_keeps_the_view(page, app_url):
    page.goto(app_url + "/?model=Qwen/Qwen3-8B&tp=8")
    wait_for_charts(page, FIGURES)
    page.get_by_text("Show invalid tp sizes").click()
    page.wait_for_selector("text=tp=12")  # every invalid size's reason, written out
    box = page.locator("div.stSelectbox").filter(has_text="tp size").first
    box.locator("input").first.click()
    box.locator("input").first.fill("3")  # a prefix filter: 3 first, then 30-39 (not 13, 23, ...)
    listed = page.locator("[role=option]").all_inner_texts()
    assert [x.split()[0] for x in listed] == ["3", *map(str, range(30, 40))], listed
    box.locator("input").first.fill("")
    page.keyboard.press("Escape")
    choose(page, "tp size", "12")
    page.wait_for_selector("[data-testid=stAlertContentError]")
    alert = page.locator("[data-testid=stAlertContentError]").first.inner_text()
    assert "num_attention_heads=32 is not divisible by tp_size=12" in alert and "1, 2, 4, 8, 16, 32" in alert
    assert heading(page) == "Qwen/Qwen3-8B on 8 GPUs"
    assert page.locator("[data-testid=stException]").count() == 0
    page.screenshot(path=SCREENSHOTS / "03_invalid_tp.png")


def test_a_rule_set_that_refuses_the_tp_and_back_keeps_working(page, app_url):
    """nano-vllm refuses Qwen3-8B at tp=16 (8 KV heads); back on vLLM 0.33 the view returns. The browser sent
    tp back as the option's text once the list had changed, which crashed the sidebar until a reload."""
    page.goto(app_url + "/?model=Qwen/Qwen3-8B&tp=16")
    wait_for_charts(page, FIGURES)
    page.locator("label").filter(has_text="nano-vllm").first.click()
    page.wait_for_selector("[data-testid=stAlertContentError]")
    assert ("nano-vllm rules "
            "never replicate KV "
            "heads") in page.locator("[data-testid=stAlertContentError]").first.inner_text()
    page.locator("label").filter(has_text="vLLM 0.33").first.click()
    page.wait_for_selector("[data-testid=stAlertContentError]", state="detached")
    wait_for_charts(page, FIGURES)
    assert (heading(page) == "Qwen/Qwen3-8B on 16 GPUs"
            and page.locator("[data-testid=stException]").count() == 0)


def test_unticking_ep_keeps_the_parallelism_section_open(page, app_url):
    page.goto(app_url + "/?model=Qwen/Qwen3-30B-A3B&tp=4")
    wait_for_charts(page, FIGURES)
    page.get_by_text("Pipeline, data and expert parallelism").click()
    ep = page.locator("label").filter(has_text="Expert parallelism (EP)").first
    wait_settled(page)
    ep.click()
    wait_heading(page, "+ EP")
    # a click while a rerun still runs can be lost: the flake this test had on a loaded machine
    wait_settled(page)
    ep.click()
    box = ep.locator("input")
    playwright_api.expect(box).not_to_be_checked()
    # polled on a timer: rAF polling stalled here for the whole timeout while the page was already redrawn
    page.wait_for_function(f"!(document.querySelector({HEADING!r}) || {{innerText: '+ "
                           "EP'}).innerText.includes('+ EP')", timeout=60_000, polling=250)
    wait_idle(page)
    assert ep.is_visible()  # the section the user works in stays open


def test_readme_screenshot(browser, app_url):
    """The screenshot used in the README (python tests/browser/harness.py copies it to docs/explorer.png)."""
    path = shoot_explorer(browser, app_url, SCREENSHOTS / "explorer.png")
    assert path.stat().st_size > 50_000


def test_shared_url_restores_the_view(page, app_url):
    page.goto(app_url + "/?model=microsoft/Phi-3-mini-128k-instruct&tp=2&rules=nano-vllm")
    wait_for_charts(page, FIGURES)
    assert heading(page) == "microsoft/Phi-3-mini-128k-instruct on 2 GPUs"
    assert "nano-vllm rules" in page.locator("[data-testid=stMain] "
                                             "[data-testid=stCaptionContainer]").first.inner_text()
    no_errors(page)
    page.screenshot(path=SCREENSHOTS / "04_shared_url.png")


LOAD_VIEWS = ["?model=Qwen/Qwen3-8B&tp=4", "?model=meta-llama/Llama-3.1-8B&tp=16",
              "?model=Qwen/Qwen3-30B-A3B&tp=8",
              "?model=deepseek-ai/DeepSeek-V3&tp=8", "?model=microsoft/Phi-3-mini-128k-instruct&tp=2",
              "?model=openai/gpt-oss-20b&tp=8", "?model=meta-llama/Llama-3.1-405B&tp=64",
              "?model=google/gemma-2-9b-it&tp=4"]


def test_eight_sessions_at_once_all_render(browser, app_url):
    contexts = [browser.new_context(viewport=VIEWPORT) for _ in LOAD_VIEWS]
    pages = [c.new_page() for c in contexts]
    problems = []
    for pg in pages:
        pg.on("pageerror", lambda e: problems.append(str(e)))
    start = time.perf_counter()
    for pg, view in zip(pages, LOAD_VIEWS):  # all eight sessions load concurrently
        pg.goto(app_url + "/" + view, wait_until="commit")
    for pg, view in zip(pages, LOAD_VIEWS):
        wait_for_charts(pg, FIGURES, timeout_ms=120_000)
        no_errors(pg)
        assert view.split("=")[1].split("&")[0] in heading(pg)
    elapsed = time.perf_counter() - start
    pages[-2].screenshot(path=SCREENSHOTS / "05_load_405b_tp64.png")
    for c in contexts:
        c.close()
    assert problems == []
    assert elapsed < 120


def test_layer_strip_click_selects_a_group(page, app_url):
    """A hybrid model: the strip draws every layer; clicking a full-attention layer shows that group's
    figures."""
    page.goto(app_url + "/?model=Qwen/Qwen3-Next-80B-A3B-Thinking&tp=4&rules=vllm")
    wait_for_charts(page, 2)  # the layer strip and the open tab's figure
    no_errors(page)
    strip = page.locator("div.stPlotlyChart").first
    cells = strip.locator("g.trace.bars g.point path")
    assert cells.count() == 48
    assert page.locator("h4").filter(has_text="Gated DeltaNet").count() == 1  # group 1 by default
    box = cells.nth(36).bounding_box()  # cells are in group order (36 GDN, then 12): layer 3 is the 37th
    # as a user clicks: on the plot
    page.mouse.click(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    page.wait_for_function("[...document.querySelectorAll('h4')].some(h => "
                           "h.innerText.startsWith('Layers 3, 7, 11'))", timeout=60_000)
    wait_for_charts(page, 2)
    no_errors(page)
    page.screenshot(path=SCREENSHOTS / "hybrid_group.png", full_page=False)


def test_an_oversized_upload_is_one_red_line_and_dropped(page, app_url, tmp_path):
    big = tmp_path / "big.json"
    big.write_bytes(b'{"pad": "' + b"x" * 1_200_000 + b'"}')
    page.goto(app_url)
    wait_for_charts(page, FIGURES)
    page.get_by_text("Upload config.json").click()
    page.locator("[data-testid=stFileUploaderDropzoneInput]").set_input_files(str(big))
    page.wait_for_selector("[data-testid=stAlertContentError]")
    alert = page.locator("[data-testid=stAlertContentError]").first.inner_text()
    assert alert == "uploaded big.json is 1.2 MB; a config.json is a few KB (limit 1 MB)"
    assert page.locator("[data-testid=stFileUploaderFile]").count() == 0  # the file is dropped
    assert heading(page) == "Qwen/Qwen3-8B on 4 GPUs"  # the last good view stays


def test_nothing_is_loaded_from_the_internet(browser, app_url):
    """Offline use: no font, icon or script is fetched from anywhere but the app's own server."""
    for path in ("/", "/Run_live", "/Plan"):
        context = browser.new_context(viewport=VIEWPORT)
        pg = context.new_page()
        outside = []
        pg.on("request",
              lambda r: outside.append(r.url) if not r.url.startswith((app_url, "data:", "blob:")) else None)
        pg.goto(app_url + path)
        pg.wait_for_selector("[data-testid=stMain] h1, [data-testid=stMain] h2", timeout=60_000)
        pg.wait_for_timeout(1500)
        context.close()
        assert outside == [], (path, outside)


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

"""Real browser: `streamlit run app.py` driven by headless Debian Chromium through Python Playwright.

Screenshots go to tests/screenshots/ (gitignored). Skipped, with the reason, when /usr/bin/chromium is absent.
"""
import json
import struct
import time
from pathlib import Path

import pytest

from harness import (CHROMIUM, FIGURES, HEADING, SCREENSHOTS, VIEWPORT, choose, heading, no_errors,
                     shoot_explorer, wait_for_charts, wait_heading, wait_idle, wait_settled)

pytestmark = [pytest.mark.browser,
              pytest.mark.skipif(not Path(CHROMIUM).exists(),
                                 reason=f"{CHROMIUM} not found: install it with `apt-get install "
                                        "chromium` (root, Debian)")]
playwright_api = pytest.importorskip("playwright.sync_api", reason="python playwright is not installed")


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

"""AppTest: download payloads (JSON equal to the shard map, PNG, ZIP), no-Chromium notice, speed and payload
size."""
import io
import json
import zipfile
from unittest import mock

import pytest
from app_harness import charts, errors, heading, payload_bytes, run_app, tab_charts
from streamlit.runtime.media_file_manager import MediaFileManager
from streamlit.runtime.memory_media_file_storage import MemoryMediaFileStorage

from explorer.cache import page_for, png_renderer, screen_figure
from tpviz import shard_map
from tpviz.render.export import NO_CHROMIUM, chromium_path

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def downloads():
    """Capture what the download buttons serve: bytes given up front, and deferred (on-click) callables."""
    served, deferred = {}, {}
    store, add_deferred = MemoryMediaFileStorage.load_and_get_id, MediaFileManager.add_deferred

    def capture(self, data, mimetype, kind, filename=None):
        served[filename] = (data, mimetype)
        return store(self, data, mimetype, kind, filename)

    def capture_deferred(self, fn, mimetype, coordinates, file_name=None, **kw):
        deferred[file_name] = (fn, mimetype)
        return add_deferred(self, fn, mimetype, coordinates, file_name=file_name, **kw)
    with mock.patch.object(MemoryMediaFileStorage, "load_and_get_id", capture), \
            mock.patch.object(MediaFileManager, "add_deferred", capture_deferred):
        yield served, deferred


def test_json_download_is_the_shard_map(downloads):
    _, deferred = downloads
    at = run_app({"model": "meta-llama/Llama-3.1-8B", "tp": "16"})
    assert errors(at) == []
    make, mime = deferred["Llama-3.1-8B_tp16_vllm.json"]  # made on click, not stored on every rerun
    data = make()
    assert mime == "application/json"
    assert json.loads(data) == shard_map("meta-llama/Llama-3.1-8B", 16).to_dict()


def test_png_buttons_one_per_figure(downloads):
    _, deferred = downloads
    at = run_app()
    assert sum(name.endswith(".png") for name in deferred) == 1  # only the open tab's figure and button
    tab_charts(at)  # open every tab in turn
    pngs = sorted(name for name in deferred if name.endswith(".png"))
    assert pngs == [f"Qwen3-8B_tp4_vllm_{i:02d}_{k}.png" for i, k in enumerate(
        ["qkv", "o_proj", "gate_up", "down_proj", "embed", "lm_head", "replicated", "memory"], 1)]
    assert all(deferred[n][1] == "image/png" for n in pngs) and "Qwen3-8B_tp4_vllm_figures.zip" in deferred
    keys = [b.key for b in at.get("download_button")]
    assert sorted(keys) == ["dl_json", "dl_zip", "dl_zip_svg", "png_qkv"]


@pytest.mark.skipif(chromium_path() is None, reason="PNG export needs Chromium (apt-get install chromium)")
def test_png_and_zip_downloads_are_valid(downloads):
    _, deferred = downloads
    tab_charts(run_app({"model": "Qwen/Qwen3-0.6B", "tp": "2"}))
    png = deferred["Qwen3-0.6B_tp2_vllm_01_qkv.png"][0]()
    assert png[:8] == PNG_MAGIC
    browser = png_renderer()._kaleido  # opened by the first PNG, kept by st.cache_resource
    assert deferred["Qwen3-0.6B_tp2_vllm_07_memory.png"][0]()[:8] == PNG_MAGIC  # tied: no lm_head figure
    assert browser is not None and png_renderer()._kaleido is browser
    with zipfile.ZipFile(io.BytesIO(deferred["Qwen3-0.6B_tp2_vllm_figures.zip"][0]())) as z:
        names = z.namelist()
        assert len(names) == 8 and all(z.read(n)[:8] == PNG_MAGIC for n in names[:-1])
        assert names[-1] == "Qwen3-0.6B_tp2_vllm.json"


def test_no_chromium_is_one_error_line_and_disabled_buttons(monkeypatch):
    monkeypatch.setenv("BROWSER_PATH", "/nonexistent/chromium")
    at = run_app()
    assert [e.value for e in at.error] == [NO_CHROMIUM]
    assert errors(at) == []  # the view itself is fine
    buttons = {b.key: b for b in at.sidebar.get("download_button")}
    assert buttons["dl_zip"].proto.disabled and not buttons["dl_json"].proto.disabled
    assert all(b.proto.disabled for b in at.get("download_button") if b.key.startswith("png_"))


def test_tp_change_on_405b_traces_and_draws_each_tp_once(monkeypatch):
    """A revisited tp reuses the cached map and figures (the rerun times are bench/bench_explorer.py's)."""
    import tpviz.render.plots
    drawn = []
    all_figures = tpviz.render.plots.all_figures
    monkeypatch.setattr(tpviz.render.plots, "all_figures",
                        lambda m, *a, **k: drawn.append(m.tp_size) or all_figures(m, *a, **k))
    at = run_app({"model": "meta-llama/Llama-3.1-405B", "tp": "8"})
    for tp in (64, 8, 32, 64):  # 8 and the second 64 are revisits
        before = len(drawn)
        at.selectbox(key="tp").select(tp).run()
        assert errors(at) == [] and heading(at) == f"meta-llama/Llama-3.1-405B on {tp} GPUs"
        assert set(drawn[before:]) <= {tp}, drawn
    assert drawn.count(32) <= 1 and drawn.count(64) <= 1 and drawn[-1:] != [8], drawn


@pytest.mark.parametrize("model, tp", [("meta-llama/Llama-3.1-405B", "64"),
                                       ("deepseek-ai/DeepSeek-V3", "16")])
def test_page_payload_under_2mb_at_tp64(model, tp):  # DeepSeek-V3's FP8 blocks allow tp <= 16
    at = run_app({"model": model, "tp": tp})
    assert errors(at) == []
    assert payload_bytes(at) < 2_000_000


def test_the_page_sends_charts_without_the_template_and_exports_keep_the_figure():
    at = run_app({"model": "Qwen/Qwen3-0.6B", "tp": "2"})
    (sent,) = charts(at)
    # Plotly's second pass draws nothing
    assert "template" not in sent["layout"] and sent["layout"]["datarevision"]
    page = page_for(*at.session_state["good"])
    fig = page.figs["qkv"]  # what the PNG button and the ZIP render: unchanged
    # plotly.py's "none"
    assert fig.to_dict()["layout"]["template"] == {"data": {"scatter": [{"type": "scatter"}]}}
    screen = screen_figure((page.key, None, "qkv"), fig).to_dict()
    layout = fig.to_dict()["layout"]
    assert ({k: v for k, v in screen["layout"].items() if k != "datarevision"}
            == {k: v for k, v in layout.items() if k != "template"})
    assert screen["data"] == fig.to_dict()["data"]

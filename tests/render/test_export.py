"""tpviz.render.export: the JSON download, PNGs from a persistent kaleido browser, the ZIP, and the CLI's
--png."""
import io
import json
import struct
import time
import zipfile
from pathlib import Path

import pytest

from tpviz import load_spec, shard_map
from tpviz.cli.main import main as cli_main
from tpviz.render.export import (NO_CHROMIUM, ExportError, PngRenderer, chromium_path, figure_png,
                                 figures_zip, file_stem,
                          png_names, shard_map_json, write_pngs)
from tpviz.render.plots import all_figures, family_figure
from tpviz.trace.shardmap import ShardMap

needs_chromium = pytest.mark.skipif(chromium_path() is None,
                                    reason="PNG export needs Chromium (apt-get install chromium)")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def png_size(data: bytes) -> tuple[int, int]:
    """(width, height) from a PNG's IHDR chunk."""
    assert data[:8] == PNG_MAGIC
    return struct.unpack(">II", data[16:24])


@pytest.fixture(scope="module")
def renderer():
    r = PngRenderer()
    yield r
    r.close()


@pytest.fixture(scope="module")
def qwen():
    return shard_map("Qwen/Qwen3-8B", 4)


def test_json_is_the_shard_map(qwen):
    data = shard_map_json(qwen)
    assert json.loads(data) == qwen.to_dict()
    assert ShardMap.from_dict(json.loads(data)).to_dict() == qwen.to_dict()


def test_file_names(qwen):
    assert file_stem(qwen) == "Qwen3-8B_tp4_vllm"
    names = png_names(qwen, ["qkv", "memory"])
    assert names == {"qkv": "Qwen3-8B_tp4_vllm_01_qkv.png", "memory": "Qwen3-8B_tp4_vllm_02_memory.png"}
    from tpviz.config.sources import presets
    odd = shard_map(load_spec(presets()["Qwen/Qwen3-0.6B"], name="my org/odd name: v2!"), 1)
    assert file_stem(odd) == "odd-name-v2_tp1_vllm"


def test_no_chromium_is_one_clear_line(monkeypatch, qwen):
    monkeypatch.setenv("BROWSER_PATH", "/nonexistent/chromium")
    assert chromium_path() is None
    with pytest.raises(ExportError) as info:
        PngRenderer().render(family_figure(qwen, "qkv"))
    assert (str(info.value) == NO_CHROMIUM and "\n" not in NO_CHROMIUM
            and "apt-get install chromium" in NO_CHROMIUM)
    assert cli_main(["map", "Qwen/Qwen3-0.6B", "--tp", "2", "--png", "/tmp/tpviz-never-written"]) == 2


@needs_chromium
def test_png_is_valid_and_one_browser_draws_every_image(renderer, qwen):
    """The browser opened for the first image draws the next ones (per-image time: bench_explorer.py)."""
    fig = family_figure(qwen, "qkv")
    first = renderer.render(fig)
    assert png_size(first) == (1300 * 2, int(fig.layout.height) * 2)
    browser = renderer._kaleido
    for _ in range(3):
        assert renderer.render(fig)[:8] == PNG_MAGIC and renderer._kaleido is browser


@needs_chromium
def test_a_batch_renders_in_the_browsers_tabs_and_keeps_its_order(renderer, qwen):
    """render_many draws a ZIP's figures in the browser's tabs at once and returns them in their order."""
    figs = [family_figure(qwen, "qkv"), family_figure(qwen, "o_proj"), family_figure(qwen, "qkv")]
    batch = renderer.render_many(figs)
    assert [png_size(p) for p in batch] == [(2600, int(f.layout.height) * 2) for f in figs]
    assert batch[0] == batch[2] != batch[1] and batch[1] == renderer.render(figs[1])


@needs_chromium
def test_renderer_is_thread_safe(renderer, qwen):
    from concurrent.futures import ThreadPoolExecutor
    figs = all_figures(qwen)
    keys = ["qkv", "embed", "memory", "replicated"]
    with ThreadPoolExecutor(4) as pool:
        pngs = list(pool.map(lambda k: renderer.render(figs[k]), keys))
    for key, png in zip(keys, pngs):  # each caller gets its own figure back, not a neighbour's
        assert png_size(png)[1] == int(figs[key].layout.height) * 2


@needs_chromium
def test_zip_holds_every_figure(renderer, qwen):
    figs = all_figures(qwen)
    with zipfile.ZipFile(io.BytesIO(figures_zip(qwen, figs, renderer))) as z:
        names = z.namelist()
        assert names == list(png_names(qwen, list(figs)).values()) + [f"{file_stem(qwen)}.json"]
        assert all(z.read(name)[:8] == PNG_MAGIC for name in names[:-1])
        assert json.loads(z.read(names[-1]))["tp_size"] == qwen.tp_size


@needs_chromium
def test_svg_zip_is_titled_with_model_tp_and_rules(renderer, qwen):
    figs = {"embed": family_figure(qwen, "embed")}
    with zipfile.ZipFile(io.BytesIO(figures_zip(qwen, figs, renderer, fmt="svg"))) as z:
        svg = z.read(f"{file_stem(qwen)}_01_embed.svg").decode()
    assert svg.lstrip().startswith("<svg") and "tp 4" in svg and "Qwen3-8B" in svg


@needs_chromium
def test_write_pngs_and_cli(tmp_path):
    m = shard_map("Qwen/Qwen3-0.6B", 2)
    paths = write_pngs(m, tmp_path / "a")
    assert [p.name for p in paths] == list(png_names(m, list(all_figures(m))).values())
    assert all(p.read_bytes()[:8] == PNG_MAGIC for p in paths)
    assert cli_main(["map", "Qwen/Qwen3-0.6B", "--tp", "2", "--png", str(tmp_path / "b")]) == 0
    assert sorted(p.name for p in (tmp_path / "b").iterdir()) == sorted(p.name for p in paths)


@needs_chromium
def test_default_renderer_png(qwen):
    assert figure_png(family_figure(qwen, "embed"))[:8] == PNG_MAGIC


def test_renderer_recovers_after_a_failure(monkeypatch, qwen):
    r = PngRenderer()

    def broken():
        raise RuntimeError("browser crashed\ndetails")
    monkeypatch.setattr(r, "_start", broken)
    with pytest.raises(ExportError, match="PNG export failed .RuntimeError: browser crashed.; try again"):
        r.render(family_figure(qwen, "qkv"))
    assert r._kaleido is None  # the next call starts a fresh browser
    r.close()


def test_output_dir_is_created(tmp_path, monkeypatch, qwen):
    monkeypatch.setattr("tpviz.render.export.figure_png",
                        lambda fig, renderer=None, m=None, fmt="png": PNG_MAGIC)
    paths = write_pngs(qwen, tmp_path / "deep" / "dir")
    assert all(Path(p).exists() for p in paths) and len(paths) == 8


def test_a_timed_out_browser_start_is_cancelled_and_closed(monkeypatch, qwen):
    import asyncio

    import kaleido
    made = []

    class SlowKaleido:
        def __init__(self, **kwargs):
            self.closed, self.cancelled = False, False
            made.append(self)

        async def open(self):
            try:
                await asyncio.sleep(30)  # the browser started but never answered
            except asyncio.CancelledError:
                self.cancelled = True
                raise

        async def close(self):
            self.closed = True
    monkeypatch.setattr(kaleido, "Kaleido", SlowKaleido)
    monkeypatch.setattr("tpviz.render.export.chromium_path", lambda: "/usr/bin/chromium")
    r = PngRenderer(timeout=0.3)
    start = time.monotonic()
    with pytest.raises(ExportError, match="PNG export failed .TimeoutError"):
        r.render(family_figure(qwen, "qkv"))
    assert time.monotonic() - start < 5
    assert len(made) == 1 and made[0].cancelled and made[0].closed
    assert r._kaleido is None and r._opening is None
    r.close()


def test_ep_exports_name_the_whole_layout_and_draw_whole_experts():
    from dataclasses import replace

    from tpviz.deploy.deployment import deploy
    from tpviz.render.export import titled
    from tpviz.render.plots import export_figures
    from tpviz.rules import Layout
    from tpviz.trace.model_map import map_model
    spec, layout = load_spec("deepseek-ai/DeepSeek-V3"), Layout(8, 2, 1, True)
    m = replace(map_model(spec, 8, "vllm"), deployment=deploy(spec, layout, "vllm"))
    figs = export_figures(m)
    assert not [k for k in figs if k.endswith("experts")]  # no tp slice of experts that EP keeps whole
    placement = figs["expert_placement"]
    assert all(sum(row) == 32 for row in placement.data[0].z)  # 256 experts, 32 whole ones per GPU
    assert titled(m, placement).layout.title.text.startswith(
        f"{spec.name} · TP 8 × PP 2 × DP 1 + EP · vLLM 0.33 — Expert placement · linear · 256 experts on 8 "
        "GPUs per stage, each expert whole on one")
    assert all(titled(m, f).layout.title.text.startswith(f"{spec.name} · TP 8 × PP 2 × DP 1 + EP ·")
               for f in figs.values())
    # the memory figure is the TP map's (every layer on 8 GPUs, 79 GiB on the fullest), not the layout's
    # GPUs (41 GiB, a stage's layers): it says so instead of passing for the layout in its title
    memory = figs["memory"].layout.title
    assert memory.text == "Memory per GPU · the TP 8 map alone"
    assert memory.subtitle.text.startswith("Every layer on 8 GPUs, before TP 8 × PP 2 × DP 1 + EP places "
                                           "them: the device grid has each GPU's weights.")
    assert export_figures(map_model(spec, 8, "vllm"))["memory"].layout.title.text == "Memory per GPU"
    # SGLang's --ep below tp: each expert cut over its block, and the figure says so
    spec, layout = load_spec("Qwen/Qwen3-30B-A3B"), Layout(8, ep_size=2)
    m = replace(map_model(spec, 8, "sglang", layout=layout), deployment=deploy(spec, layout, "sglang"))
    figs = export_figures(m)
    assert "cut over the 4 GPUs of its EP block" in figs["experts"].layout.title.subtitle.text
    assert "slice of all experts" not in figs["experts"].layout.title.subtitle.text
    placement = figs["expert_placement"]
    assert "128 experts in 2 EP blocks of 4 GPUs per stage" in placement.layout.title.text
    assert list(placement.layout.yaxis.ticktext) == ["block 0 · GPUs 0–3", "block 1 · GPUs 4–7"]
    assert titled(m, placement).layout.title.text.startswith(f"{spec.name} · TP 8 × PP 1 × DP 1 · EP 2 ·")

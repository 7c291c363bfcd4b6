"""Exports of a ShardMap: the JSON shard map, and PNGs of the same figures the app shows.

PNGs are rendered by kaleido in one persistent headless Chromium: starting a browser costs ~2 s,
an image from a running one ~0.2 s. PngRenderer keeps that browser on its own event-loop thread,
serialises requests from any thread (Streamlit sessions, download callbacks), and restarts after a failure.
"""
import asyncio
import atexit
import concurrent.futures
import io
import logging
import os
import re
import shutil
import threading
import zipfile
from pathlib import Path

import plotly.graph_objects as go

from tpviz.errors import TpvizError
from tpviz.render.plots import export_figures
from tpviz.trace.shardmap import ShardMap

PNG_WIDTH, PNG_SCALE = 1300, 2
TIMEOUT_S = 60.0
TABS = 2  # browser tabs rendering at once (2 cores: 1.2x faster than one for a 13-figure ZIP)
NO_CHROMIUM = ("PNG export needs Chromium, and none was found: install it (`apt-get install chromium`) "
               "or set BROWSER_PATH to a Chrome/Chromium binary")


class ExportError(TpvizError):
    """A PNG could not be rendered (no Chromium, or the browser failed)."""


def chromium_path() -> str | None:
    """The Chrome/Chromium kaleido would use (BROWSER_PATH, else PATH), or None."""
    env = os.environ.get("BROWSER_PATH")
    if env:
        return env if os.access(env, os.X_OK) else None
    try:  # the same search kaleido does; start-up: kaleido's browser driver loads only for an export
        from choreographer.browsers.chromium import Chromium
        found = Chromium.find_browser(skip_local=False)
    except Exception:  # noqa: BLE001 - an older/newer choreographer: fall back to PATH
        found = None
    return found or next((p for n in ("chromium", "chromium-browser", "google-chrome", "chrome")
                          if (p := shutil.which(n))), None)


# kaleido's browser driver skips a malformed message from Chromium's pipe but logs it with a traceback on
# stderr, which reads like a failure of an export that succeeded: keep only its critical messages
logging.getLogger("choreographer").setLevel(logging.CRITICAL)


class PngRenderer:
    """A persistent kaleido browser, safe to call from any thread; works with or without Streamlit."""

    def __init__(self, timeout: float = TIMEOUT_S):
        self.timeout = timeout
        self._lock = threading.Lock()  # one batch at a time: its figures share the browser's tabs
        self._loop: asyncio.AbstractEventLoop | None = None
        self._kaleido = None
        self._opening = None  # the browser being opened, so a timed-out open can still close it

    def _start(self) -> None:
        if chromium_path() is None:
            raise ExportError(NO_CHROMIUM)
        import kaleido  # start-up: the PNG renderer loads on the first export
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
            threading.Thread(target=self._loop.run_forever, name="tpviz-kaleido", daemon=True).start()

        async def open_browser():
            # two tabs: a ZIP's figures render two at a time (render_many); no MathJax CDN fetch
            k = self._opening = kaleido.Kaleido(n=TABS, timeout=self.timeout, mathjax=False)
            await k.open()
            return k
        try:
            self._kaleido = self._run(open_browser())
        finally:
            k, self._opening = self._opening, None
            if self._kaleido is None and k is not None:  # timed out or failed: it may be running anyway
                try:
                    self._run(k.close())
                except Exception:  # noqa: BLE001 - best effort; a dead browser cannot be closed more cleanly
                    pass

    def _run(self, coro, figures: int = 1):
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:  # each figure may take the timeout, TABS at a time
            return future.result(self.timeout * -(-figures // TABS))
        except concurrent.futures.TimeoutError:
            future.cancel()  # don't leave the coroutine running on the loop after we gave up on it
            raise

    def render(self, fig: go.Figure, width: int = PNG_WIDTH, height: int | None = None,
               scale: float = PNG_SCALE, fmt: str = "png") -> bytes:
        """PNG (or SVG) bytes of a figure (height defaults to the figure's own)."""
        return self.render_many([fig], width, height, scale, fmt)[0]

    def render_many(self, figs: list[go.Figure], width: int = PNG_WIDTH, height: int | None = None,
                    scale: float = PNG_SCALE, fmt: str = "png") -> list[bytes]:
        """PNG (or SVG) bytes of several figures, drawn in the browser's tabs at once, in their order."""
        def opts(fig):
            return dict(format=fmt, width=width, height=height or fig.layout.height or 500, scale=scale)

        async def all_of(k):
            return await asyncio.gather(*(k.calc_fig(fig, opts=opts(fig)) for fig in figs))
        with self._lock:
            try:
                if self._kaleido is None:
                    self._start()
                return list(self._run(all_of(self._kaleido), len(figs)))
            except ExportError:
                raise
            except Exception as e:  # noqa: BLE001 - any browser failure becomes one line; restart next time
                self._close_browser()
                if type(e).__name__ == "ChromeNotFoundError":
                    raise ExportError(NO_CHROMIUM) from None
                first = (str(e).strip().splitlines() or [""])[0][:200]
                raise ExportError(f"PNG export failed ({type(e).__name__}: {first}); try again") from None

    def _close_browser(self) -> None:
        k, self._kaleido = self._kaleido, None
        if k is not None and self._loop is not None:
            try:
                self._run(k.close())
            except Exception:  # noqa: BLE001 - a dead browser cannot be closed more cleanly
                pass

    def close(self) -> None:
        """Stop the browser and its thread."""
        with self._lock:
            self._close_browser()
            if self._loop is not None:
                self._loop.call_soon_threadsafe(self._loop.stop)
                self._loop = None


_default: PngRenderer | None = None
_default_lock = threading.Lock()


def default_renderer() -> PngRenderer:
    """The process-wide renderer (for the CLI and notebooks; the app keeps its own in st.cache_resource)."""
    global _default
    with _default_lock:
        if _default is None:
            _default = PngRenderer()
            atexit.register(_default.close)
        return _default


def titled(m: ShardMap, fig: go.Figure) -> go.Figure:
    """A copy of a figure whose title names the model, the whole layout (tp, or TP × PP × DP + EP and
    SGLang's carved fields) and the rules, so an exported image stands alone."""
    out = go.Figure(fig)
    title = out.layout.title.text or ""
    layout = m.deployment.label if m.deployment else f"tp {m.tp_size}"
    out.update_layout(title_text=f"{m.model.name} · {layout} · {m.rules.label} — {title}")
    return out


def figure_pngs(figs: list[go.Figure], renderer: PngRenderer | None = None, m: ShardMap | None = None,
                fmt: str = "png") -> list[bytes]:
    """Several figures as PNG (or SVG) bytes, rendered together; with the map, titled as figure_png does."""
    return (renderer or default_renderer()).render_many([titled(m, f) if m is not None else f for f in figs],
                                                        fmt=fmt)


def figure_png(fig: go.Figure, renderer: PngRenderer | None = None, m: ShardMap | None = None,
               fmt: str = "png") -> bytes:
    """One figure as PNG (or SVG) bytes; with the map, its title names the model, tp and rules."""
    return figure_pngs([fig], renderer, m, fmt)[0]


def file_stem(m: ShardMap) -> str:
    """'Qwen3-8B_tp4_vllm': a file-safe name for this view."""
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", str(m.model.name).split("/")[-1]).strip("-.")
    lay = m.deployment.layout if m.deployment else None
    wide = "".join(f"_{k}{getattr(lay, k)}" for k in ("pp", "dp") if lay and getattr(lay, k) > 1) + (
        "_ep" if lay and lay.ep else "")
    return f"{name or 'model'}_tp{m.tp_size}{wide}_{m.rules.name}"


def png_names(m: ShardMap, keys: list[str]) -> dict[str, str]:
    """Figure key -> PNG file name, numbered in page order."""
    return {key: f"{file_stem(m)}_{i:02d}_{key}.png" for i, key in enumerate(keys, 1)}


def figures_zip(m: ShardMap, figs: dict[str, go.Figure], renderer: PngRenderer | None = None,
                fmt: str = "png") -> bytes:
    """Every figure as a PNG (or SVG) titled with the model, tp and rules, and the shard map JSON, in one
    ZIP."""
    buf = io.BytesIO()
    names = png_names(m, list(figs))
    images = figure_pngs([figs[key] for key in names], renderer, m, fmt)
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for name, image in zip(names.values(), images):
            z.writestr(name.removesuffix(".png") + f".{fmt}", image)
        z.writestr(f"{file_stem(m)}.json", shard_map_json(m))
    return buf.getvalue()


def shard_map_json(m: ShardMap) -> bytes:
    """The shard map as JSON bytes (schema tpviz.shardmap/4), as the download button serves it."""
    return m.to_json(indent=1).encode()


def write_pngs(m: ShardMap, out_dir: str | Path) -> list[Path]:
    """Write one PNG per figure (the app's figures) into out_dir; returns the paths written."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    figs = export_figures(m)
    names = png_names(m, list(figs))
    paths = [out / name for name in names.values()]
    for path, image in zip(paths, figure_pngs([figs[key] for key in names], m=m)):
        path.write_bytes(image)
    return paths

"""Benchmark of the explorer (a script, not a timed test). Prints:

  - the rerun time after changing tp on the Llama-3.1-405B preset (first visit of a tp, and a revisit);
  - the Plotly payload of the page (JSON bytes of every chart) for the largest presets;
  - the time per PNG with a warm kaleido browser (and the one-off browser start);
  - the sidebar's ZIP of every PNG for DeepSeek-V3 at tp 8 (13 figures, drawn in the browser's two tabs).

Targets: rerun <= 1 s, payload <= 2 MB, PNG < 1 s, ZIP <= 5 s.  python bench/bench_explorer.py [--strict]
"""
import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from streamlit.testing.v1 import AppTest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
TARGET_RERUN_S, TARGET_PAYLOAD, TARGET_PNG_S, TARGET_ZIP_S = 1.0, 2_000_000, 1.0, 5.0


def app(query: dict) -> "AppTest":
    """A fresh AppTest session of app.py opened with these query parameters."""
    from streamlit.testing.v1 import AppTest
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=120)
    for key, value in query.items():
        at.query_params[key] = value
    return at.run()


def bench_rerun() -> float:
    """Seconds for the rerun after a tp change on the 405B preset; returns the worst first visit."""
    at = app({"model": "meta-llama/Llama-3.1-405B", "tp": "8"})
    print("rerun after a tp change, meta-llama/Llama-3.1-405B (AppTest, whole script):")
    worst = 0.0
    for tp, kind in ((16, "first visit"), (32, "first visit"), (64, "first visit"),
                     (8, "revisit"), (64, "revisit")):
        start = time.perf_counter()
        at.selectbox(key="tp").select(tp).run()
        took = time.perf_counter() - start
        assert not at.exception and not [e for e in at.error
                                         if "Chromium" not in e.value], [e.value for e in at.error]
        worst = max(worst, took)
        print(f"  tp 8/..→{tp:<3} {kind:<12} {took * 1000:7.0f} ms")
    return worst


def bench_payload() -> int:
    """Plotly JSON bytes per page; returns the largest."""
    print("Plotly payload of the page (all charts):")
    largest = 0
    for model, tp in (("Qwen/Qwen3-8B", 4), ("meta-llama/Llama-3.1-405B", 8),
                      ("meta-llama/Llama-3.1-405B", 64),
                      ("deepseek-ai/DeepSeek-V3", 64), ("Qwen/Qwen3-30B-A3B", 32)):
        at = app({"model": model, "tp": str(tp)})
        size = sum(len(c.proto.spec) for c in at.get("plotly_chart"))
        largest = max(largest, size)
        print(f"  {model:<28} tp={tp:<3} {len(at.get('plotly_chart'))} charts  {size / 1e6:6.3f} MB")
    return largest


def bench_zip() -> float:
    """Seconds for the sidebar's ZIP of every PNG of DeepSeek-V3 at tp 8 from a warm browser (0 without
    Chromium)."""
    from tpviz import shard_map
    from tpviz.render.export import ExportError, PngRenderer, figures_zip
    from tpviz.render.plots import export_figures
    m = shard_map("deepseek-ai/DeepSeek-V3", 8)
    figs, renderer = export_figures(m), PngRenderer()
    try:
        renderer.render(figs["memory"])  # the browser starts once per server
    except ExportError:
        return 0.0
    start = time.perf_counter()
    figures_zip(m, figs, renderer)
    took = time.perf_counter() - start
    renderer.close()
    print(f"ZIP of {len(figs)} PNGs (deepseek-ai/DeepSeek-V3 tp 8, warm browser, two tabs): {took:.2f} s")
    return took


def bench_png() -> float:
    """Median seconds per PNG from a warm browser; None without Chromium."""
    from tpviz import shard_map
    from tpviz.render.export import ExportError, PngRenderer
    from tpviz.render.plots import all_figures
    figs = all_figures(shard_map("meta-llama/Llama-3.1-405B", 64))
    renderer = PngRenderer()
    try:
        start = time.perf_counter()
        renderer.render(figs["memory"])
    except ExportError as e:
        print(f"PNG: skipped ({e})")
        return 0.0
    print("PNG (kaleido, system Chromium, 2600 px wide): browser start + first image "
          f"{time.perf_counter() - start:.2f} s")
    times = {}
    for key, fig in figs.items():
        start = time.perf_counter()
        renderer.render(fig)
        times[key] = time.perf_counter() - start
    renderer.close()
    print("  per image, warm: " + ", ".join(f"{k} {v:.2f}s" for k, v in times.items()))
    median = statistics.median(times.values())
    print(f"  median {median:.2f} s, max {max(times.values()):.2f} s")
    return max(times.values())


def main() -> int:
    """Run the four benchmarks and print the targets."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--strict", action="store_true", help="exit 1 when a target is missed")
    args = parser.parse_args()
    import logging
    logging.getLogger("streamlit").setLevel(logging.ERROR)
    rerun, payload, png, zip_s = bench_rerun(), bench_payload(), bench_png(), bench_zip()
    missed = [name for name, bad in (("rerun", rerun > TARGET_RERUN_S), ("payload", payload > TARGET_PAYLOAD),
                                     ("png", png > TARGET_PNG_S), ("zip", zip_s > TARGET_ZIP_S)) if bad]
    print(f"targets: rerun <= {TARGET_RERUN_S} s (worst {rerun:.2f} s), payload <= 2 MB (largest "
          f"{payload / 1e6:.2f} MB), PNG < {TARGET_PNG_S} s (worst warm {png:.2f} s), ZIP <= "
          f"{TARGET_ZIP_S} s ({zip_s:.2f} s): "
          + ("all met" if not missed else "missed " + ", ".join(missed)))
    return 1 if args.strict and missed else 0


if __name__ == "__main__":
    sys.exit(main())

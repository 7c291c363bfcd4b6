"""Real browser: no label of any figure covers another or leaves the figure. Every preset's figures are drawn
by plotly.js in headless Chromium at the explorer's figure width (980 px: the least they keep, scrolling, in a
1024 px, 1280 px or phone window, and their width in a 1440 px one) and at the PNG export's (wider than a
figure in most windows: the source view keeps its scale there), and each annotation's box is measured
(getBoundingClientRect): Plotly itself never moves a label out of another's way."""
import contextlib
import json
from pathlib import Path

import plotly
import pytest

from explorer.style import MIN_FIGURE_PX
from harness import CHROMIUM, launch
from tpviz.render.export import PNG_WIDTH

pytestmark = [pytest.mark.browser, pytest.mark.slow,
              pytest.mark.skipif(not Path(CHROMIUM).exists(), reason=f"{CHROMIUM} not found")]
playwright_api = pytest.importorskip("playwright.sync_api", reason="python playwright is not installed")

PLOTLY_JS = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
# the explorer's figures keep 980 px and scroll in narrower columns; the PNG export draws them wider
WIDTHS = (MIN_FIGURE_PX, PNG_WIDTH)
# (a, b): the labels a and b intersect; ("clipped", a): a leaves the figure
MEASURE = """async (spec) => {
  await Plotly.react('f', spec.data, spec.layout);
  const svg = document.querySelector('#f .main-svg').getBoundingClientRect();
  const boxes = [...document.querySelectorAll('#f g.annotation')].filter(g => g.querySelector('text'))
    .map(g => { const r = g.querySelector('text').getBoundingClientRect();
                return {text: g.textContent, l: r.left, r: r.right, t: r.top, b: r.bottom}; })
    .filter(b => b.r > b.l);
  const hits = [];
  boxes.forEach((a, i) => {
    if (a.l < svg.left - 1 || a.r > svg.right + 1 || a.t < svg.top - 1 || a.b > svg.bottom + 1)
      hits.push(['clipped', a.text]);
    boxes.slice(i + 1).forEach(b => {
      if (a.l < b.r - 1 && b.l < a.r - 1 && a.t < b.b - 1 && b.t < a.b - 1) hits.push([a.text, b.text]);
    });
  });
  return hits;
}"""


@contextlib.contextmanager
def plotly_page():
    """A headless Chromium page holding plotly.js and one empty figure div (#f)."""
    with playwright_api.sync_playwright() as p:
        browser = launch(p)
        try:
            page = browser.new_page(viewport={"width": 1500, "height": 1400})
            page.set_content(f"<html><body style='margin:0'><div id=f></div><script>{PLOTLY_JS.read_text()}"
                             "</script></body></html>")
            page.wait_for_function("() => window.Plotly !== undefined")
            yield page
        finally:
            browser.close()


def presets_at_8():
    """Every preset at tp 8 (or its largest valid tp below), each figure of its export, and DeepSeek-V3 at
    tp 16 (the most tensors side by side)."""
    from tpviz import shard_map
    from tpviz.config.sources import presets
    from tpviz.errors import TpvizError
    yield "deepseek-ai/DeepSeek-V3", 16, shard_map("deepseek-ai/DeepSeek-V3", 16)
    for name in presets():
        for tp in (8, 4, 2, 1):
            try:
                yield name, tp, shard_map(name, tp)
                break
            except TpvizError:
                continue


def test_no_label_covers_another_in_any_preset_figure():
    from tpviz.render.plots import export_figures
    found = []
    with plotly_page() as page:
        for name, tp, m in presets_at_8():
            for key, fig in export_figures(m).items():
                spec = json.loads(fig.to_json())
                for width in WIDTHS:
                    spec["layout"]["width"] = width
                    hits = page.evaluate(MEASURE, {"data": spec["data"], "layout": spec["layout"]})
                    found += [f"{name} tp={tp} {key} at {width} px: {hit}" for hit in hits]
    assert not found, f"{len(found)} label collisions:\n" + "\n".join(found[:30])


# every legend entry inside the figure and below both plots: the explorer keeps figures 980 px wide or
# more (scrolling in a 1024-px or phone window), where the 16 entries the legend can hold fit in the rows
# it reserves (a legend that wraps into more rows grows upward, over the rank view's axis)
LEGEND = """async (spec) => {
  await Plotly.react('f', spec.data, spec.layout);
  const svg = document.querySelector('#f .main-svg').getBoundingClientRect();
  const plots = Math.max(...[...document.querySelectorAll('#f .xtitle, #f .x2title')]
    .map(t => t.getBoundingClientRect().bottom));
  return [...document.querySelectorAll('#f g.legend g.traces')].map(g => g.getBoundingClientRect())
    .filter(r => r.bottom > svg.bottom + 1 || r.right > svg.right + 1 || r.top < plots - 1).length;
}"""


# 16 shared KV heads at tp 32
MHA16 = {"model_type": "llama", "hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 16,
         "intermediate_size": 8192, "vocab_size": 32000, "num_hidden_layers": 2}


@pytest.mark.parametrize("model, tp, shared", [("meta-llama/Llama-3.1-8B", 16, 8),
                                               ("meta-llama/Llama-3.1-405B", 64, 8), (MHA16, 32, 16)])
def test_every_shared_kv_head_is_in_the_legend_below_the_plots(model, tp, shared):
    from tpviz import shard_map
    from tpviz.render.plots import family_figure
    fig = family_figure(shard_map(model, tp), "qkv")
    assert sum(1 for t in fig.data if t.showlegend is not False and t.name) == shared
    with plotly_page() as page:
        for width in (980, 1400):  # the explorer's narrowest figure, and a wide window's
            spec = json.loads(fig.to_json())
            spec["layout"]["width"] = width
            assert page.evaluate(LEGEND, {"data": spec["data"], "layout": spec["layout"]}) == 0, width

"""The replicated family: every GPU holds a full copy; row-parallel biases are added on GPU 0 only."""
import plotly.graph_objects as go

from tpviz.render.plots.geometry import Bars, plural, tensor_label
from tpviz.render.plots.rank import gpu_label
from tpviz.render.plots.style import INK, MUTED, axis, base_layout, rank_color
from tpviz.trace.shardmap import ShardMap, in_group
from tpviz.render.summary import row_bias_params, short_name, whole_towers

SOURCE_DOMAIN, RANK_DOMAIN = (0.0, 0.40), (0.55, 1.0)


def _label(name: str, shape: list[int]) -> str:
    return f"{short_name(name)} [{'×'.join(map(str, shape))}]"


def replicated_figure(m: ShardMap, info: tuple[str, str], group=None, tower: str = "") -> go.Figure:
    """Source view: each replicated tensor striped with every GPU's colour (a full copy each).
    Rank view: GPU × tensor grid; a row-parallel bias is hatched on GPUs other than 0 (held, not added).
    tower: that whole tower's tensors alone (its own tab), which the replicated figure leaves out."""
    whole = whole_towers(m, group)
    tensors = [t for t in m.tensors if in_group(t, group) and (
        t.family == tower if tower else t.split_dim is None and t.family not in whole)]
    biases = set(row_bias_params(m))
    tp, n = m.tp_size, len(tensors)
    src, grid = Bars("h"), Bars("h")
    faded = []
    for i, t in enumerate(tensors):
        label = _label(t.name, t.shape)
        copies = (plural(t.blocks, "block") if t.blocks else plural(len(t.layers or []) or 1, "layer")) + (
            f" × {len(t.experts)} experts" if t.experts else "")
        for r in range(tp):  # one stripe per GPU, all the same full length
            hover = f"<b>GPU {r}</b> holds all of {label}<br>({copies})"
            src.add(1.0, i - 0.4 + 0.8 * (r + 0.5) / tp, 0, 0.8 / tp, rank_color(r), hover)
        for r in range(tp):
            bias_idle = t.param in biases and r != 0
            hover = (f"<b>GPU {r}</b> · {label}<br>" + (
                "held but not added: only GPU 0 adds a row-parallel bias,<br>so the all-reduce counts it once"
                if bias_idle else ("full copy; added here (GPU 0)" if t.param in biases else "full copy")))
            grid.add(0.8, gpu_label(r), i - 0.4, 0.8, rank_color(r), hover, pattern="x" if bias_idle else "")
            faded.append(0.35 if bias_idle else 1.0)
    title, line = info
    layout = base_layout(title, 150 + min(max(tp * 24, 40 * n, 300), 800))
    layout["title"]["subtitle"] = dict(text=line, font=dict(size=11, color=MUTED))
    layout["margin"].update(t=120, l=60)
    ticks = [_label(t.name, t.shape)
             + (" · added on GPU 0 only" if t.param in biases else "") for t in tensors]
    layout["xaxis"] = axis("whole tensor (every GPU's copy)", domain=SOURCE_DOMAIN, range=[0, 1],
                           showticklabels=False)
    layout["yaxis"] = axis(range=[n - 0.5, -0.5], tickvals=list(range(n)), ticktext=ticks,
                           tickfont=dict(size=10, color=INK))
    layout["xaxis2"] = axis(domain=RANK_DOMAIN, anchor="y2", range=[-0.5, n - 0.5], tickvals=list(range(n)),
                            ticktext=[tensor_label(t) for t in tensors], tickangle=-35)
    labels = [gpu_label(r) for r in range(tp)]
    layout["yaxis2"] = axis(anchor="x2", type="category", categoryorder="array", categoryarray=labels,
                            range=[tp - 0.5, -0.5], tickfont=dict(size=10, color=INK))
    layout["annotations"] = [
        dict(text="<b>Source view</b> · every GPU holds a full copy", x=SOURCE_DOMAIN[0], y=1, xref="paper",
             yref="paper", xanchor="left", yanchor="bottom", yshift=8, showarrow=False,
             font=dict(size=12, color=MUTED)),
        # the note on its own line: never clipped
        dict(text="<b>Rank view</b> · which GPU holds (and uses) what"
             + ("<br><span style='font-size:10px'>hatched: held, not added</span>" if biases else ""),
             x=RANK_DOMAIN[0], y=1, xref="paper", yref="paper", xanchor="left", yanchor="bottom", yshift=8,
             showarrow=False, font=dict(size=12, color=MUTED))]
    grid_trace = grid.trace("x2", "y2", line_width=1)
    grid_trace.marker.opacity = faded
    return go.Figure(data=[src.trace("x", "y", line_width=0), grid_trace], layout=layout)

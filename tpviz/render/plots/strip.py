"""The layer strip: every decoder layer as one cell, coloured by its layer group, so a hybrid model reads at a
glance."""
import plotly.graph_objects as go

from tpviz.render.plots.geometry import plural
from tpviz.render.plots.style import FAMILY_COLORS, INK, MUTED, base_layout
from tpviz.trace.shardmap import ShardMap

# group colours: muted, and none of them a GPU colour (GPUs own the saturated palette)
GROUP_COLORS = ("#8da0cb", "#e5c494", "#a6d854", "#b3b3b3", "#fc8d62", "#66c2a5", "#e78ac3", "#ffd92f")


def group_color(index: int) -> str:
    return GROUP_COLORS[index % len(GROUP_COLORS)]


def layer_strip(m: ShardMap, selected: int | None = None) -> go.Figure:
    """One cell per layer, coloured by group; clicking a cell selects its group (customdata = group index)."""
    n = sum(len(g.layers) for g in m.groups)
    x, colors, hover, groups, opacity = [], [], [], [], []
    for gi, g in enumerate(m.groups):
        for i in g.layers:
            x.append(i)
            colors.append(group_color(gi))
            hover.append(f"<b>layer {i}</b><br>{g.label}<br>group {gi + 1}: {plural(len(g.layers), 'layer')}")
            groups.append(gi)
            opacity.append(1.0 if selected is None or selected == gi else 0.35)
    layout = base_layout(f"Layers · {n} layers in {len(m.groups)} kind{'s' if len(m.groups) != 1 else ''}",
                         190)
    layout["title"]["subtitle"] = dict(text="Click a layer to show its group's matrices. "
                                       + " · ".join(f"group {gi + 1}: {g.label} ×{len(g.layers)}"
                                                    for gi, g in enumerate(m.groups))[:400],
                                       font=dict(size=11, color=MUTED))
    layout["margin"] = dict(l=20, r=20, t=80, b=30)
    layout["xaxis"] = dict(range=[-0.5, n - 0.5], title=dict(text="layer", font=dict(size=11, color=INK)),
                           showgrid=False, zeroline=False, tickfont=dict(size=10))
    layout["yaxis"] = dict(visible=False, range=[0, 1])
    layout["showlegend"] = False
    bar = go.Bar(x=x, y=[1] * len(x), marker=dict(color=colors, opacity=opacity,
                                                  line=dict(color="white", width=1)),
                 customdata=groups, hovertext=hover, hovertemplate="%{hovertext}<extra></extra>", width=0.9)
    bars = [bar]
    towers = [t for t in (m.model.tower, m.model.audio) if t]
    if towers:  # before layer 0, as a tower's output enters it; not a group, so no click
        wide = max(2.0, n / 12)
        at = [-(k + 0.5) * wide - 0.5 for k in range(len(towers))]
        layout["xaxis"]["range"] = [at[-1] - wide / 2 - 0.5, n - 0.5]
        ticks = list(range(0, n, max(1, n // 8)))
        layout["xaxis"]["tickvals"] = at + ticks
        layout["xaxis"]["ticktext"] = [t.medium for t in towers] + [str(i) for i in ticks]
    for x0, t in zip(at if towers else [], towers):
        cut = any(x.tower == t.medium and x.split_dim is not None  # a GPU holds less than all of it
                  and sum(p.stop - p.start for p in x.rank_pieces(0)) < x.shape[x.split_dim]
                  for x in m.tensors)
        whole = ("split over tp" if cut else "whole on every GPU"
                 if t.medium == "audio" or not t.data_parallel else "whole on every GPU (data mode)")
        bars.append(go.Bar(x=[x0], y=[1], width=wide * 0.95, marker=dict(color=FAMILY_COLORS[t.medium]),
                           hovertext=[f"<b>{t.medium} tower</b><br>{t.depth} blocks of {t.heads} heads, "
                                      f"{whole}"
                                      "<br>held by the first pipeline stage; its matrices are in the "
                                      f"{t.medium} tab"],
                           hovertemplate="%{hovertext}<extra></extra>"))
    return go.Figure(data=bars, layout=layout)

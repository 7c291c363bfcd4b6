"""Memory per GPU: weights stacked by family next to the naive total/tp, and KV-cache bytes per token."""
import plotly.graph_objects as go

from tpviz.render.plots.rank import gpu_label
from tpviz.render.plots.style import FAMILY_COLORS, INK, MUTED, axis, base_layout, rank_color
from tpviz.render.text import fmt_bytes
from tpviz.trace.shardmap import ShardMap
from tpviz.render.summary import FAMILY_LABELS, families_present, memory_rows

GIB, KIB = 2 ** 30, 2 ** 10
WEIGHT_DOMAIN, KV_DOMAIN = (0.0, 0.60), (0.70, 1.0)


def _naive_line(value: float, xref: str, yref: str, text: str) -> tuple[dict, dict]:
    shape = dict(type="line", xref=f"{xref} domain", yref=yref, x0=0, x1=1, y0=value, y1=value,
                 line=dict(color=INK, width=1.5, dash="dash"))
    note = dict(text=text, xref=f"{xref} domain", yref=yref, x=1, y=value, xanchor="right", yanchor="bottom",
                showarrow=False, font=dict(size=10, color=INK), bgcolor="rgba(255,255,255,0.8)")
    return shape, note


def memory_figure(m: ShardMap) -> go.Figure:
    """Weights per GPU by family (GiB) against total/tp, and KV cache per token per GPU (KiB) against
    total/tp."""
    rows = memory_rows(m)
    # long GPU names collide beyond 8 ranks: keep the colour swatch and the number
    labels = [gpu_label(r["rank"]) if len(rows) <= 8
              else gpu_label(r["rank"]).replace(" GPU ", " ") for r in rows]
    traces = []
    # hovers name the GPU and format bytes as the header does (fmt_bytes), never Plotly's own rounding
    for family in families_present(m):
        values = [r[family] / GIB for r in rows]
        traces.append(go.Bar(x=labels, y=values, name=FAMILY_LABELS[family],
                             marker_color=FAMILY_COLORS[family],
                             customdata=[[f"GPU {r['rank']}", fmt_bytes(r[family])] for r in rows],
                             hovertemplate=f"%{{customdata[0]}}<br>{FAMILY_LABELS[family]}: "
                                           "%{customdata[1]}<extra></extra>",
                             xaxis="x", yaxis="y", showlegend=True))
    traces.append(go.Bar(x=labels, y=[r["kv_per_token"] / KIB for r in rows], xaxis="x2", yaxis="y2",
                         marker_color=[rank_color(r["rank"]) for r in rows], showlegend=False,
                         customdata=[[f"GPU {r['rank']}", fmt_bytes(r["kv_per_token"])] for r in rows],
                         hovertemplate="%{customdata[0]}<br>KV cache: %{customdata[1]} per "
                                       "token<extra></extra>"))
    naive, kv_naive = rows[0]["naive"] / GIB, rows[0]["kv_naive_per_token"] / KIB
    worst = max(r["weights"] for r in rows)
    # a pp / dp / ep layout's GPUs hold other bytes (a stage's layers, whole experts): this figure is the
    # tensor-parallel map's, and says so rather than pass for the layout a title names
    alone = f" · the TP {m.tp_size} map alone" if m.deployment else ""
    layout = base_layout(f"Memory per GPU{alone}", 460)
    over = (worst / rows[0]["naive"] - 1) * 100 if naive else 0.0
    before = (f"Every layer on {m.tp_size} GPUs, before {m.deployment.label} places them: the device grid "
              "has each GPU's weights.<br>" if m.deployment else "")
    layout["title"]["subtitle"] = dict(
        text=(f"{before}Weights: {fmt_bytes(worst)} on the fullest GPU vs. {fmt_bytes(rows[0]['naive'])} "
              f"naive total/tp ({over:+.1f}%): replicated tensors, copied KV heads and padding are counted."),
        font=dict(size=11, color=MUTED))
    layout.update(barmode="stack", showlegend=True, bargap=0.18,
                  legend=dict(orientation="h", traceorder="normal", x=0, y=-0.16, xanchor="left",
                              yanchor="top", font=dict(size=11)))
    layout["margin"].update(t=125 if m.deployment else 110, b=110)
    layout["xaxis"] = axis("" if len(rows) <= 8 else "GPU", domain=WEIGHT_DOMAIN, type="category",
                           tickfont=dict(size=10, color=INK))
    layout["yaxis"] = axis("weights (GiB)", showgrid=True, gridcolor="#eef1f4", rangemode="tozero")
    layout["xaxis2"] = axis("" if len(rows) <= 8 else "GPU", domain=KV_DOMAIN, anchor="y2", type="category",
                            tickfont=dict(size=10, color=INK))
    layout["yaxis2"] = axis("KV cache (KiB per token)", anchor="x2", showgrid=True, gridcolor="#eef1f4",
                            rangemode="tozero")
    s1, a1 = _naive_line(naive, "x", "y", f"naive total/tp = {fmt_bytes(rows[0]['naive'])}")
    s2, a2 = _naive_line(kv_naive, "x2", "y2", f"total/tp = {fmt_bytes(rows[0]['kv_naive_per_token'])}")
    layout["shapes"] = [s1, s2]
    layout["annotations"] = [a1, a2] + [
        dict(text=f"<b>{text}</b>", x=dom[0], y=1, xref="paper", yref="paper",
             xanchor="left", yanchor="bottom", yshift=6, showarrow=False, font=dict(size=12, color=MUTED))
        for text, dom in (("Weights by family", WEIGHT_DOMAIN), ("KV cache per token", KV_DOMAIN))]
    return go.Figure(data=traces, layout=layout)

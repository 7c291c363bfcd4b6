"""Figures of a pp / dp / ep deployment: the device grid (stages x GPUs) and the expert placement."""
import plotly.graph_objects as go

from tpviz.render.plots.style import INK, MUTED, base_layout
from tpviz.trace.shardmap import Deployment


def device_grid(d: Deployment, step_ms: list[float] | None = None) -> go.Figure:
    """One cell per GPU: rows are pipeline stages, columns the dp x tp GPUs of a stage; weights per GPU, and
    with step_ms each stage's decode step bound (deploy.perf: its fullest GPU's)."""
    lay = d.layout
    cols = lay.dp * lay.tp
    z = [[0.0] * cols for _ in range(lay.pp)]
    text = [[""] * cols for _ in range(lay.pp)]
    for g in d.gpus:
        c = g.dp * lay.tp + g.tp
        z[g.pp][c] = g.weight_bytes / 2**30
        experts = "" if g.experts is None else f"<br>{len(g.experts)} experts"
        step = f"<br>step ≥ {step_ms[g.pp]:.2f} ms" if step_ms else ""
        text[g.pp][c] = (f"GPU {g.rank}<br>layers "
                         f"{g.layers[0]}–{g.layers[1] - 1}{experts}<br>{z[g.pp][c]:.1f} GiB{step}")
    layout = base_layout(f"Device grid · {lay.label}", 160 + 90 * lay.pp)
    layout["title"]["subtitle"] = dict(text="Rows: pipeline stages · columns: data-parallel "
                                            "replicas × tensor-parallel ranks · colour: "
                                            "weights per GPU (GiB)",
                                       font=dict(size=11, color=MUTED))
    layout["xaxis"] = dict(title=dict(text="replica · tp rank", font=dict(size=11, color=INK)),
                           tickvals=list(range(cols)),
                           ticktext=[f"dp {c // lay.tp} · tp {c % lay.tp}" for c in range(cols)])
    layout["yaxis"] = dict(title=dict(text="stage", font=dict(size=11, color=INK)), autorange="reversed",
                           tickvals=list(range(lay.pp)), ticktext=[f"stage {s}" for s in range(lay.pp)])
    # the scale starts at 0 GiB: GPUs a few KiB apart (one stage's final norm) look alike, not light and dark
    heat = go.Heatmap(z=z, text=text, texttemplate="%{text}", colorscale="Blues", showscale=True, zmin=0,
                      zmax=max(max(row) for row in z) or 1, hovertemplate="%{text}<extra></extra>",
                      colorbar=dict(title="GiB"), xgap=3, ygap=3)
    return go.Figure(data=[heat], layout=layout)


def expert_figure(d: Deployment) -> go.Figure | None:
    """Experts x EP ranks: which GPU of a stage holds each whole expert (None without expert parallelism)."""
    placement = d.expert_placement
    if not placement:
        return None
    experts = max((e for ranks in placement for e in ranks), default=-1) + 1
    z = [[1 if e in set(ranks) else 0 for e in range(experts)] for ranks in placement]
    cut, n = d.layout.expert_cut or 1, len(placement)
    if cut > 1:  # SGLang's --ep below tp: blocks of consecutive GPUs, each expert cut over its block
        where = (f"{experts} experts in {n} EP blocks of {cut} GPUs per stage, each expert cut {cut} ways "
                 "over its block")
        rows, hover = [f"block {b} · GPUs {b * cut}–{(b + 1) * cut - 1}" for b in range(n)], "EP block"
    else:
        where = f"{experts} experts on {n} GPUs per stage, each expert whole on one"
        rows, hover = [f"GPU {r}" for r in range(n)], "EP rank"
    layout = base_layout(f"Expert placement · {d.placement} · {where}", 140 + min(24 * n, 600))
    layout["xaxis"] = dict(title=dict(text="expert", font=dict(size=11, color=INK)))
    layout["yaxis"] = dict(title=dict(text=f"{hover} ({'dp × tp' if d.layout.ep else 'in the stage'})",
                                      font=dict(size=11, color=INK)), autorange="reversed",
                           tickvals=list(range(n)), ticktext=rows)
    heat = go.Heatmap(z=z, colorscale=[[0, "#f4f6f8"], [1, "#c9892b"]], showscale=False, xgap=1, ygap=1,
                      hovertemplate=f"{hover} %{{y}} · expert %{{x}}<extra></extra>")
    return go.Figure(data=[heat], layout=layout)

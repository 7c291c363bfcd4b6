"""Figures and tables of a VerifyResult, shared by the page and anything else that draws one."""
import plotly.graph_objects as go

from tpviz.live.check.compare import FP32_TOL, NOISE_MULTIPLE
from tpviz.live.load.dtypes import ITEMSIZE
from tpviz.live.check.results import LayerDiff, VerifyResult
from tpviz.render.plots.style import INK, MUTED, axis, base_layout, rank_color

PASS_COLOR, FAIL_COLOR, LIMIT_COLOR = "#59a14f", "#e15759", "#9c755f"
EXACT = 1e-12  # a log axis cannot show 0: exact stages are drawn here and labelled "exact"


def stage_figure(result: VerifyResult, layers: list[LayerDiff] | None = None,
                 title: str | None = None) -> go.Figure:
    """Max |TP - tp=1| after each stage (log scale) against that stage's limit: where the runs part ways.
    `layers` (default: the check's) may be another forward pass's, e.g. the step where generation diverged."""
    layers = result.layers if layers is None else layers
    names = [d.name for d in layers]
    gaps = [max(d.max_abs, EXACT) for d in layers]
    colors = [FAIL_COLOR if d.exceeds else PASS_COLOR for d in layers]
    hover = [f"{d.name}<br>max |Δ| {'exact (0)' if d.max_abs == 0 else f'{d.max_abs:.3g}'}"
             f"<br>relative {d.max_rel:.3g}<br>tolerance {d.limit:.3g}"
             + (f"<br>noise floor {d.floor:.3g}" if d.floor is not None else "")
             + ("<br><b>beyond tolerance</b>" if d.exceeds else "") for d in layers]
    exact = ["exact (0)" if d.max_abs == 0 else "" for d in layers]  # drawn at EXACT: say what it is
    fig = go.Figure(go.Scatter(x=names, y=gaps, mode="lines+markers+text", name="TP vs tp=1",
                               line=dict(color=INK, width=1.5), marker=dict(color=colors, size=10),
                               text=exact, textposition="middle right", textfont=dict(size=10, color=MUTED),
                               hovertext=hover, hoverinfo="text"))
    label = "tolerance: " + (f"{NOISE_MULTIPLE:g}x this stage's noise floor" if result.noise_floor is not None
                             else f"{FP32_TOL:g} x max(1, max|value|)")
    fig.add_trace(go.Scatter(x=names, y=[max(d.limit, EXACT) for d in layers], mode="lines", name=label,
                             hoverinfo="skip", line=dict(color=LIMIT_COLOR, dash="dash", width=1.5)))
    first = next((d.name for d in layers if d.exceeds), None)
    # where it parts goes on a line of its own: a long title is clipped in a narrow column (Plotly never
    # wraps)
    where = result.diverges_at if title is None else first
    title = (title or f"Where TP and tp=1 part ways: {result.verdict}") + (
        f"<br><span style='font-size:12px'>first beyond tolerance at {where}</span>" if where else "")
    flip = result.routing if layers is result.layers else None  # routing is the check's own forward pass
    if flip and f"layer {flip.layer}" in names:  # where the runs start computing different experts
        why = "float noise at a near tie" if flip.noise_explained else "a real mismatch"
        fig.add_vline(x=names.index(f"layer {flip.layer}"), line=dict(color=MUTED, dash="dot", width=1),
                      annotation=dict(text=f"routing flip ({why})", font=dict(size=10, color=MUTED)))
    fig.update_layout(**base_layout(title, 380 + (18 if where else 0)))
    if where:
        fig.layout.margin.t += 18
    fig.update_layout(showlegend=True, legend=dict(orientation="h", x=0, y=1.02, yanchor="bottom",
                                                   font=dict(size=11, color=MUTED)),
                      xaxis=axis("stage (hidden state after it)"),
                      yaxis=axis("max |Δ| (log)", type="log", showgrid=True, gridcolor="#e8ecf0",
                                 exponentformat="e", minor=dict(showgrid=False)))
    return fig


def rank_figure(result: VerifyResult) -> go.Figure:
    """What each rank read from the checkpoint and holds, in the checkpoint's own dtype, against the whole
    checkpoint (so a bf16 checkpoint at tp=2 shows about half on each rank), and what it holds in the run's
    dtype."""
    ranks = [f"rank {r.rank}" for r in result.ranks]
    colors = [rank_color(r.rank) for r in result.ranks]
    mib = 2 ** 20
    stored = result.checkpoint_dtype or (result.ranks[0].stored_dtype if result.ranks else "")
    disk = stored or "dtype on disk"
    bars = [go.Bar(x=ranks, y=[r.bytes_read / mib for r in result.ranks],
                   name=f"read from checkpoint ({disk})",
                   marker=dict(color=colors), hovertemplate="%{x}: read %{y:.3f} MiB<extra></extra>")]
    if stored and all(r.stored_bytes for r in result.ranks):
        bars.append(go.Bar(x=ranks, y=[r.stored_bytes / mib for r in result.ranks], name=f"held, in {stored}",
                           marker=dict(color=colors, pattern=dict(shape=".")), opacity=0.8,
                           hovertemplate=f"%{{x}}: holds %{{y:.3f}} MiB in {stored}<extra></extra>"))
    if not stored or stored != result.dtype or len(bars) == 1:
        bars.append(go.Bar(x=ranks, y=[r.param_bytes / mib for r in result.ranks],
                           name=f"held, in the run's {result.dtype}", opacity=0.55,
                           marker=dict(color=colors, pattern=dict(shape="/")),
                           hovertemplate=f"%{{x}}: holds %{{y:.3f}} MiB in {result.dtype}<extra></extra>"))
    fig = go.Figure(bars)
    total = result.ranks[0].checkpoint_bytes / mib if result.ranks else 0
    fig.add_hline(y=total, line=dict(color=MUTED, dash="dot"), annotation_font=dict(color=MUTED, size=11),
                  annotation_text=f"whole checkpoint {total:.2f} MiB ({disk})")
    layout = base_layout("Checkpoint bytes read and parameters held per rank", 340)
    same = stored == result.dtype
    upcast = "" if same or not stored else (
        f"<br>The run computes in {result.dtype}, so it holds those parameters in "
        f"{ITEMSIZE.get(result.dtype, 0) / max(1, ITEMSIZE.get(stored, 1)):.3g}x the bytes.")
    layout["title"]["subtitle"] = dict(
        text="Each rank reads and holds only its own slices (replicated norms and padded vocabulary rows "
             f"aside){', counted in the checkpoint’s ' + stored if stored else ''}.{upcast}",
        font=dict(size=11, color=MUTED))
    layout["margin"]["t"] = 120
    fig.update_layout(**layout)
    fig.update_layout(barmode="group", bargap=0.3, showlegend=True,
                      legend=dict(orientation="h", x=0, y=1.02, yanchor="bottom",
                                  font=dict(size=11, color=MUTED)),
                      xaxis=axis(), yaxis=axis("MiB", showgrid=True, gridcolor="#e8ecf0"))
    return fig


def environment_rows(result: VerifyResult) -> list[dict]:
    """The environment as (what, value) rows: GPUs found, launcher, backend and why."""
    env = result.environment
    return [{"what": k, "value": v} for k, v in (
        ("GPUs found", ", ".join(env.gpus) if env.gpus else "none"), ("launcher", env.launcher),
        ("device", env.device), ("backend", env.backend), ("why", env.reason), ("torch", env.torch))]

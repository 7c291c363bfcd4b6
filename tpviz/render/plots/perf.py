"""The speed bound's terms for one layout: a bar per term for each pipeline stage's fullest GPU, so the term
that bounds a decode step shows (tpviz.deploy.perf)."""
import plotly.graph_objects as go

from tpviz.deploy.perf import BOUND_NOTE, EFFICIENCY, TERM_LABELS
from tpviz.render.plots.style import MUTED, RANK_COLORS, base_layout


def terms_figure(stage_terms: list[dict[str, float]], label: str, tpot_ms: float,
                 note: str = BOUND_NOTE.format(EFFICIENCY)) -> go.Figure:
    """Per stage, the ms of one decode step spent per term (memory terms overlap FLOPs: a step takes the
    larger of the two, then its collectives)."""
    kinds = [k for k in TERM_LABELS if any(t.get(k) for t in stage_terms)]
    names = [TERM_LABELS[k] for k in kinds]
    bars = [go.Bar(y=names, x=[t.get(k, 0.0) for k in kinds], orientation="h", name=f"stage {i}",
                   marker_color=RANK_COLORS[i % len(RANK_COLORS)],
                   text=[f"{t.get(k, 0.0):.3g} ms" for k in kinds], textposition="outside", cliponaxis=False,
                   hovertemplate=f"stage {i}: %{{y}} %{{x:.3f}} ms<extra></extra>")
            for i, t in enumerate(stage_terms)]
    layout = base_layout(f"Speed bound · {label} · TPOT ≥ {tpot_ms:.2f} ms", 150 + 34 * len(kinds)
                         * max(1, min(len(stage_terms), 4)))
    layout["title"]["subtitle"] = dict(text=f"ms per decode step on each stage's fullest GPU · {note}",
                                       font=dict(size=11, color=MUTED))
    layout.update(barmode="group", bargap=0.25, showlegend=len(stage_terms) > 1,
                  margin=dict(l=230, r=80, t=86, b=48))
    layout["xaxis"] = dict(title=dict(text="ms per step"), rangemode="tozero")
    layout["yaxis"] = dict(autorange="reversed")
    return go.Figure(data=bars, layout=layout)

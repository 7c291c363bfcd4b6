"""Colours and the shared Plotly layout: one fixed colour per rank, used by every figure, table and export."""
import colorsys

# Tableau 10 for the first ranks (most deployments), then golden-angle hues so neighbours always differ
_BASE = ["#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7", "#9c755f",
         "#bab0ac"]


def _extra(i: int) -> str:
    hue = (0.07 + i * 0.618034) % 1.0
    light = (0.42, 0.58, 0.50)[i % 3]
    r, g, b = colorsys.hls_to_rgb(hue, light, 0.55)
    return f"#{int(r * 255):02x}{int(g * 255):02x}{int(b * 255):02x}"


RANK_COLORS = _BASE + [_extra(i) for i in range(64 - len(_BASE))]
PADDING_COLOR = "#d0d4da"
INK = "#1f2933"
MUTED = "#66788a"
FONT = "Inter, 'Segoe UI', Helvetica, Arial, sans-serif"
# families get their own muted palette, so a family is never mistaken for a rank
FAMILY_COLORS = {"qkv": "#3b5b92", "o_proj": "#8aa6d6", "gate_up": "#2f7f6f", "down_proj": "#8fcdbf",
                 "linear_attn": "#6a4c93", "mamba": "#a58cc4", "conv": "#8c6d46", "experts": "#8e7cc3",
                 "kda": "#7b5ea7", "mamba1": "#c3a6d9",
                 "vision": "#b5651d", "audio": "#c98a3d", "embed": "#6b6f76", "lm_head": "#a3a8b0",
                 "replicated": "#d9cfc1"}
# q|k|v and gate|up segments are told apart by pattern; the fill stays the rank colour
SECTION_PATTERNS = {"q": "", "k": "/", "v": "\\", "gate": "", "up": "/", "shared gate": ".", "shared up": "x"}


def _luminance(hex_color: str) -> float:
    """WCAG relative luminance of '#rrggbb'."""
    rgb = [int(hex_color.lstrip("#")[i:i + 2], 16) / 255 for i in (0, 2, 4)]
    r, g, b = (c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4 for c in rgb)
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


def text_color(fill: str) -> str:
    """White or ink, whichever contrasts more with a '#rrggbb' fill (labels on yellow or teal bars stay
    legible)."""
    if not (isinstance(fill, str) and fill.startswith("#") and len(fill) == 7):
        return "white"
    lum = _luminance(fill)
    return "white" if 1.05 / (lum + 0.05) >= (lum + 0.05) / (_luminance(INK) + 0.05) else INK


def rank_color(rank: int) -> str:
    """The colour of GPU `rank` everywhere in tpviz."""
    return RANK_COLORS[rank % len(RANK_COLORS)]


def base_layout(title: str, height: int) -> dict:
    """Layout shared by every figure: white, compact, readable in the app and in PNGs."""
    return dict(
        title=dict(text=title, x=0.01, xanchor="left", yref="container", y=1, yanchor="top", pad=dict(t=14),
                   font=dict(size=16, color=INK)),
        height=height, template="none", font=dict(family=FONT, size=12, color=INK),
        paper_bgcolor="white", plot_bgcolor="white", margin=dict(l=70, r=40, t=86, b=48),
        hoverlabel=dict(bgcolor="white", font=dict(family=FONT, size=12, color=INK), bordercolor="#c5ccd3"),
        showlegend=False, barmode="overlay", bargap=0,
        uniformtext=dict(minsize=9, mode="hide"),
    )


def axis(title: str = "", **kw) -> dict:
    """An axis with the shared look."""
    base = dict(title=dict(text=title, font=dict(size=11, color=MUTED)), showgrid=False, zeroline=False,
                showline=False, ticks="", tickfont=dict(size=10, color=MUTED), automargin=True)
    return {**base, **kw}

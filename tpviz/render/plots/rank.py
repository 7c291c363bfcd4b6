"""Rank view: each GPU's local parameter as a strip, showing which source segments it holds and where.

This is the "double cut" of merged layers: qkv_proj holds [q | k | v] and gate_up_proj [gate | up],
each already cut to this rank's share. Rows never loaded (vocab padding) show as grey hatching.
"""
from dataclasses import dataclass, field

from tpviz.render.plots.geometry import (Bars, counted, head_short, head_text, label_px, sections, span,
                                        split_piece, tensor_label, tower_label)
from tpviz.render.plots.style import INK, PADDING_COLOR, SECTION_PATTERNS, rank_color
from tpviz.trace.shardmap import ParamMap, ShardMap, TensorMap
from tpviz.render.summary import short_name

GAP = 0.08  # gap between parameters, as a fraction of the total local length
MIN_PAD = 0.012  # padding drawn at least this fraction of the strip, so a few rows stay visible
BAR = 0.8  # strip thickness, in GPU rows
RANK_PANEL_PX = 340  # the rank view's width in px at the explorer's laptop width (plots.VIEW_WIDTH)


@dataclass
class RankView:
    """The rank subplot: one bar trace's columns, parameter labels, and the x extent."""
    bars: Bars
    annotations: list = field(default_factory=list)
    header_note: str = ""  # the strips whose headers are numbered marks (too narrow for their names)
    width: float = 1.0
    axis_word: str = "rows"
    ticks: list = field(default_factory=list)  # (x, text): local offsets restart at 0 for each parameter


def gpu_label(rank: int) -> str:
    """A y tick: the rank's colour swatch and its name."""
    return f"<span style='color:{rank_color(rank)}'>■</span> GPU {rank}"


def _holes(covered: list[tuple[int, int]], length: int) -> list[tuple[int, int]]:
    """The ranges of [0, length) that no piece covers (padding)."""
    holes, at = [], 0
    for a, b in sorted(covered):
        if a > at:
            holes.append((at, a))
        at = max(at, b)
    if at < length:
        holes.append((at, length))
    return holes


def rank_view(m: ShardMap, tensors: list[TensorMap]) -> RankView:
    """The rank-view geometry of one family's split tensors."""
    # a name can repeat per group
    keys = list(dict.fromkeys((t.param, tuple(t.layers or ())) for t in tensors))
    params: list[ParamMap] = [next(p for p in m.params if (p.name, tuple(p.layers or ())) == k) for k in keys]
    total = sum(p.local_shapes[0][p.split_dim] for p in params)
    view = RankView(Bars("h"))
    words = {"rows" if p.split_dim == 0 else "columns" for p in params}
    view.axis_word = words.pop() if len(words) == 1 else "rows / columns"
    x0, headers = 0.0, []
    for p in params:
        feeders = [t for t in tensors if t.param == p.name and t.layers == p.layers]
        word = "rows" if p.split_dim == 0 else "columns"
        length = p.local_shapes[0][p.split_dim]
        pname = short_name(p.name).replace(".weight", "")
        for r in range(m.tp_size):
            label, covered = gpu_label(r), []
            for t in feeders:
                secs = sections(t, m.model)
                for piece in t.rank_pieces(r):
                    for a, b, sec in split_piece(piece, secs, by_heads=False):
                        la = piece.param_start + a - piece.start
                        covered.append((la, la + b - a))
                        heads = head_text(a, b, sec)
                        hover = (f"<b>GPU {r}</b> · {pname} local {counted(word, la, la + b - a)} of {length}"
                                 f"<br>← {tensor_label(t)} {counted(word, a, b)}"
                                 + (f" ({heads})" if heads else "")
                                 + (f" · {sec.label}" if sec.label != tensor_label(t) else ""))
                        bars_pattern = SECTION_PATTERNS.get(sec.label.replace(" bias", "").split(" (")[0], "")
                        short = head_short(a, b, sec)  # k and v name their heads: "k h0 (0–127)"
                        text = " ".join(filter(None, [sec.label, short])) + (
                            f" ({span(a, b)})" if short or (b - a) >= 0.3 * total else "")
                        view.bars.add(b - a, label, x0 + la, BAR, rank_color(r), hover, text=text,
                                      pattern=bars_pattern)
            for a, b in _holes(covered, length):
                shown = max(b - a, total * MIN_PAD)
                hover = (f"<b>GPU {r}</b> · {pname} local {counted(word, a, b)}: padding<br>"
                         f"{b - a} zero rows, never loaded from the checkpoint")
                view.bars.add(shown, label,
                              x0 + length - shown if b == length else x0 + a, BAR, PADDING_COLOR,
                              hover, text="pad", pattern="/")
        # short names when strips sit side by side
        label = (tower_label(p.name) if p.tower else param_label(p.name)) if len(params) > 1 else pname
        headers.append((x0, x0 + length, f"<b>{label}</b><br>{length:,} {word}/GPU"))
        share = length / total
        marks = (0, 0.25, 0.5, 0.75, 1) if len(params) == 1 else (0, 0.5, 1) if share > 0.25 else (1,)
        view.ticks += [(x0 + length * f, f"{round(length * f):,}") for f in marks]
        x0 += length + GAP * total
    view.width = max(x0 - GAP * total, 1.0)
    _place_headers(view, headers)
    return view


def _place_headers(view: RankView, headers: list[tuple[float, float, str]]) -> None:
    """One header above each strip, centred, or held inside the panel at its edges. The widest strips claim
    their room first; a header that would cover one already placed becomes a number, with its name and size
    on hover and in view.header_note."""
    px = RANK_PANEL_PX / (view.width * 1.01)
    placed, marked = [], set()
    for i in sorted(range(len(headers)), key=lambda i: headers[i][0] - headers[i][1]):
        a, b, text = headers[i]
        width = label_px(text)
        left = min(max((a + b) / 2 * px - width / 2, -8), RANK_PANEL_PX + 30 - width)  # the figure's margins
        if any(left < r + 8 and l < left + width + 8 for l, r in placed):
            marked.add(i)
        else:
            placed.append((left, left + width))
            headers[i] = (a, b, text, (left + width / 2) / px)
    notes, hidden = [], []
    for i, header in enumerate(headers):
        hover = None
        if i in marked:  # a number if even that has room, else the name only in the note and the bars' hover
            a, b, text = header
            plain = text.replace("<b>", "").replace("</b>", "").replace("<br>", ", ")
            mark = f"({len(notes) + 1})"
            centre = (a + b) / 2 * px
            if any(centre - 12 < r + 4 and l < centre + 12 + 4 for l, r in placed):
                hidden.append(plain)
                continue
            placed.append((centre - 12, centre + 12))
            notes.append(f"{mark} {plain}")
            x, text, hover = (a + b) / 2, f"<b>{mark}</b>", plain
        else:
            _, _, text, x = header
        view.annotations.append(dict(x=x, y=-0.5, yanchor="bottom", showarrow=False, text=text,
                                     hovertext=hover, font=dict(size=11, color=INK)))
    view.header_note = "; ".join(notes + ([f"too narrow to name, on hover: {'; '.join(hidden)}"] if hidden
                                          else []))


def param_label(name: str) -> str:
    """A local parameter's short name: 'model.layers.*.mlp.shared_experts.gate_up_proj.weight' -> 'shared
    gate_up_proj'."""
    parts = [q for q in short_name(name).split(".") if q not in ("weight", "*", "mlp",
                                                                 "self_attn", "experts")]
    shared = "shared " if "shared_expert" in name else ""
    return shared + (parts[-1] if parts else name)

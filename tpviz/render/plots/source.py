"""Source view: each checkpoint tensor drawn in proportion, with a band per rank along its split dim.

Column-parallel tensors get horizontal bands (rows), row-parallel ones vertical bands (columns).
A range held by several ranks (replicated KV heads) is one cross-hatched band with a legend entry naming them.
"""
import math
from dataclasses import dataclass, field

from tpviz.render.plots.geometry import (MAX_HEAD_BARS, QUANT_PARTS, Bars, counted, head_text, label_px,
                                         sections,
                                         split_piece, tensor_label)
from tpviz.render.plots.style import INK, MUTED, PADDING_COLOR, rank_color
from tpviz.trace.shardmap import ShardMap, TensorMap
from tpviz.render.summary import short_name

GAP = 0.18  # gap between tensors, as a fraction of the widest one
VECTOR_WIDTH = 0.06  # 1-D tensors (biases, sinks) are drawn this wide, relative to the widest matrix
MIN_ASPECT, MAX_ASPECT = 0.45, 2.2
# more sections than this (one per head) are summarised in one label  # displayed height / width; beyond this
# the long side is compressed
MAX_SECTION_LABELS = 8


@dataclass
class SourceView:
    """What the source subplot needs: one bar trace's columns, labels, separator lines and axis setup."""
    bars: Bars
    annotations: list = field(default_factory=list)
    lines: list = field(default_factory=list)  # (x0, y0, x1, y1) in data units
    width: float = 1.0
    height: float = 1.0
    y_scale: float = 1.0  # y units drawn per x unit (1 = true proportion)
    dense: bool = False  # many thin bars: drop outlines
    stacked: bool = False  # tensors drawn top to bottom (labels on the left) instead of side by side
    # (annotation index, x centre, y bottom, half width, text px) each
    labels: list = field(default_factory=list)
    # stacked tensors: (y, text), rows restarting at 0 for each tensor
    ticks: list = field(default_factory=list)
    shared: dict = field(default_factory=dict)  # legend: "KV head shared by GPUs 0–1" -> that band's colour


def _dims(t: TensorMap, widest: int) -> tuple[int, float]:
    """(rows, drawn columns) of a tensor; vectors get a fixed drawn width."""
    if len(t.shape) == 1:
        return t.shape[0], max(1.0, widest * VECTOR_WIDTH)
    cols = 1
    for n in t.shape[1:]:  # a conv weight [channels, 1, kernel] is drawn as channels x kernel
        cols *= n
    # a conv weight stays visible beside its matrices
    return t.shape[0], max(float(cols), widest * VECTOR_WIDTH)


def _rank_list(ranks: list[int], run: str = "") -> str:
    """'0, 1, 2' (or '0–2' with run='–' for consecutive ranks); long lists as first–last."""
    if run and len(ranks) > 1 and ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"{ranks[0]}{run}{ranks[-1]}"
    return ", ".join(map(str, ranks)) if len(ranks) <= 6 else f"{ranks[0]}–{ranks[-1]}"


def _param_name(m: ShardMap, t: TensorMap) -> str:
    return short_name(t.param).replace(".weight", "")


def stacked_layout(tensors: list[TensorMap], widest: int) -> bool:
    """Stack row-split tensors top to bottom ([q; k; v]) when that is closer to square than side by side."""
    if len(tensors) < 2 or any(t.split_dim != 0 for t in tensors):
        return False
    dims = [_dims(t, widest) for t in tensors]
    side = max(r for r, _ in dims) / (sum(c for _, c in dims) + GAP * widest * (len(dims) - 1))
    stack = (sum(r for r, _ in dims) * (1 + GAP)) / max(c for _, c in dims)
    return abs(math.log(stack)) < abs(math.log(side))


def _label(t: TensorMap, x: float, y: float, stacked: bool) -> dict:
    """Name and shape, above a tensor (side by side) or left of it (stacked)."""
    name, shape = tensor_label(t), " × ".join(map(str, t.shape))
    matrix, _, part = name.rpartition(".")
    if part in QUANT_PARTS:  # a scale under its matrix's name: 'q_proj' over 'weight_scale_inv 32 × 16'
        name, shape = matrix, f"{part} {shape}"
    text = f"<b>{name}</b><br>{shape}"
    if stacked:
        return dict(x=x, y=y, xanchor="right", yanchor="middle", xshift=-6, text=text, showarrow=False,
                    font=dict(size=11, color=INK), align="right")
    return dict(x=x, y=y, yanchor="bottom", text=text, showarrow=False,
                font=dict(size=11, color=INK), yshift=2)


def source_view(m: ShardMap, tensors: list[TensorMap]) -> SourceView:
    """The source-view geometry of one family's split tensors."""
    widest = max((_dims(t, 1)[1] for t in tensors if len(t.shape) >= 2), default=1)
    view = SourceView(Bars("v"))
    view.stacked = stacked_layout(tensors, widest)
    tallest = max(t.shape[0] for t in tensors)
    x0 = y0 = 0.0
    pad_params = {p.name: p for p in m.params if any(p.padding)}
    heads_total = 0
    for t in tensors:
        rows, cols = _dims(t, widest)
        secs = sections(t, m.model)
        n_heads = sum((s.stop - s.start) // s.head_size for s in secs if s.head_size)
        heads_total = max(heads_total, n_heads)
        _bands(view, m, t, secs, x0, y0, rows, cols, by_heads=0 < n_heads <= MAX_HEAD_BARS)
        # per-head q/k/v (BLOOM, NeoX, Falcon): the bands show it
        interleaved = len(secs) > MAX_SECTION_LABELS
        for s in secs[1:] if not interleaved else []:  # section separators (q|k|v, gate|up) and names
            view.lines.append((x0, y0 + s.start, x0 + cols, y0 + s.start) if t.split_dim == 0
                              else (x0 + s.start, y0, x0 + s.start, y0 + rows))
        if interleaved:
            first = secs[0].label.split(" (")[-1].rstrip(")").split(" ")[0]  # "head" or "KV"
            banded = len(t.rank_pieces(0)) > 1  # reordered by load_weights (BLOOM) or split as stored (NeoX)
            how = ("every GPU's rows<br>come in thin bands" if banded else
                   "each GPU takes one block<br>of whole heads, still<br>interleaved in its parameter")
            view.annotations.append(dict(
                x=x0 + cols, y=y0 + rows / 2, xshift=4, xanchor="left", yanchor="middle", showarrow=False,
                text=f"<b>{'q / k / v of each head' if first == 'head' else 'q… / k / v of each KV group'}"
                     f"</b><br>interleaved on disk:<br>{how}", font=dict(size=11, color=INK)))
        elif len(secs) > 1:
            for s in secs:
                mid = (s.start + s.stop) / 2
                view.annotations.append(dict(  # right of a row section (the y ticks are on the left)
                    x=x0 + cols if t.split_dim == 0 else x0 + mid,
                    y=y0 + mid if t.split_dim == 0 else y0 + rows,
                    text=f"<b>{s.label}</b>", showarrow=False, font=dict(size=11, color=INK), xshift=4,
                    xanchor="left" if t.split_dim == 0 else "center",
                    yanchor="middle" if t.split_dim == 0 else "top",
                    name="section" if t.split_dim == 0 else None))
        if view.stacked:
            view.ticks += [(y0 + rows * f, f"{round(rows * f):,}") for f in (0, 0.5, 1)]
        label = _label(t, x0, y0 + rows / 2, True) if view.stacked else _label(t, x0 + cols / 2, 0, False)
        pad = pad_params.get(t.param)
        # a name placed under its tensor goes under its padding band too
        bottom = _padding_band(view, t, pad, x0, cols, rows) if pad is not None and t.split_dim == 0 else rows
        view.labels.append((len(view.annotations), x0 + cols / 2, y0 + bottom, cols / 2,
                            label_px(label["text"])))
        view.annotations.append(label)
        if view.stacked:
            y0 += rows + GAP * tallest
        else:
            x0 += cols + GAP * widest
    view.width = max(x0 - GAP * widest, 1.0) if not view.stacked else float(widest)
    view.height = (y0 - GAP * tallest) if view.stacked else tallest * (1.06 if pad_params else 1.0)
    aspect = view.height / view.width
    view.y_scale = min(max(aspect, MIN_ASPECT), MAX_ASPECT) / aspect
    # ~420 px tall: outlines would swamp heads or pieces thinner than ~3 px
    view.dense = heads_total > 96 or m.tp_size > 24
    return view


def _bands(view: SourceView, m: ShardMap, t: TensorMap, secs, x0: float, y0: float, rows: int, cols: float,
           by_heads: bool) -> None:
    """One bar per (piece, head): rows for column-parallel, columns for row-parallel; shared ranges
    striped."""
    axis_word = "rows" if t.split_dim == 0 else "columns"
    groups: dict[tuple[int, int], list] = {}
    for p in t.pieces:
        groups.setdefault((p.start, p.stop), []).append(p)
    for same in groups.values():
        p, holders = same[0], [q.rank for q in same]
        color, pattern = rank_color(p.rank), ""
        # one band for every holder, hatched, named in the legend (never a fake column split)
        if len(same) > 1:
            pattern = "x"
            view.shared.setdefault(f"{'KV head' if t.family == 'qkv' else 'range'} shared by GPUs "
                                   f"{_rank_list(holders, '–')}", color)
        for a, b, sec in split_piece(p, secs, by_heads):
            heads = head_text(a, b, sec)
            where = "<br>".join(f"local {counted(axis_word, la, la + b - a)} of "
                                f"{_param_name(m, t)} on GPU {q.rank}"
                                for q in same[:8] for la in [q.param_start + a - q.start])
            hover = (f"<b>GPU {_rank_list(holders)}</b> · {tensor_label(t)} {counted(axis_word, a, b)} of "
                     f"{t.shape[t.split_dim]}" + (f"<br>{heads}" if heads else "") + f"<br>{where}"
                     + (f"<br>replicated: GPUs {_rank_list(holders)} each hold a full copy"
                        if len(same) > 1 else ""))
            if t.split_dim == 0:  # a band of rows
                view.bars.add(x0 + cols / 2, b - a, y0 + a, cols, color, hover, pattern=pattern)
            else:  # a band of columns
                view.bars.add(x0 + a + (b - a) / 2, rows, y0, b - a, color, hover, pattern=pattern)


def _padding_band(view: SourceView, t: TensorMap, pad, x0: float, cols: float, rows: int) -> float:
    """Padding rows (vocab, MXFP4 blocks): not in the checkpoint, so drawn just below it, hatched, at a
    visible minimum height; side-by-side tensors padded alike share one label, after the last. Returns the
    band's bottom."""
    total = sum(pad.padding)
    shown = max(total, rows * 0.035)
    holders = [r for r, n in enumerate(pad.padding) if n]
    hover = (f"<b>{total} padding rows</b> on GPU {_rank_list(holders)}<br>vocab {t.shape[0]} padded to "
             f"{pad.local_shapes[0][0] * len(pad.padding)} (a multiple of 64)<br>zeros, never loaded; "
             "their logits are dropped")
    view.bars.add(x0 + cols / 2, shown, rows + rows * 0.012, cols, PADDING_COLOR, hover, pattern="/")
    text = f"+{total} padding rows (GPU {_rank_list(holders)})"
    for earlier in view.annotations:
        if earlier.get("text") == text and earlier.get("visible", True):
            earlier["visible"] = False
    view.annotations.append(dict(x=x0 + cols, y=rows + rows * 0.012 + shown / 2, xanchor="left",
                                 showarrow=False, text=text, font=dict(size=10, color=MUTED), xshift=4))
    return rows * 1.012 + shown

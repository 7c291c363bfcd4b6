"""Plotly figures of a ShardMap: one per matrix family (source view + rank view) and the memory summary.

Every figure is built from the shard map alone; the app, the PNG export and the CLI share these functions.
"""
import textwrap

import plotly.graph_objects as go

from tpviz.config.tower import HF_KINDS
from tpviz.render.plots.geometry import label_px, plural, row_ticks, tensor_label
from tpviz.render.plots.rank import gpu_label, rank_view
from tpviz.render.plots.replicated import replicated_figure
from tpviz.render.plots.source import SourceView, source_view
from tpviz.render.plots.style import INK, MUTED, axis, base_layout
from tpviz.render.plots.deployment import device_grid, expert_figure
from tpviz.render.plots.memory import memory_figure
from tpviz.render.plots.strip import layer_strip
from tpviz.trace.shardmap import LayerGroup, ShardMap
from tpviz.render.summary import families_present, whole_towers
from tpviz.render.plots.info import FAMILY_INFO, GATHERED_INFO, MLA_LINE

SOURCE_DOMAIN, RANK_DOMAIN = (0.0, 0.40), (0.50, 1.0)
# px: a figure's width in the explorer on a laptop screen (PNGs are wider), for placing labels
VIEW_WIDTH = 860


def figure_height(tp: int) -> int:
    """Taller figures for more GPUs, so every rank strip stays readable."""
    return 150 + min(max(tp * 26, 330), 800)


def _panel_title(text: str, domain: tuple[float, float]) -> dict:
    return dict(text=f"<b>{text}</b>", x=domain[0], y=1, xref="paper", yref="paper", xanchor="left",
                yanchor="bottom", yshift=42, showarrow=False, font=dict(size=12, color=MUTED))


def _notes(m: ShardMap, family: str, group=None) -> str:
    """How many copies the figure stands for (layers, experts), and the plan's note on the layout."""
    tensors = [t for t in m.family(family, group) if t.split_dim is not None]
    extra, groups = [], {}
    # a tower's copies are its blocks (or its mergers)
    unit = "block" if family in ("vision", "audio") else "layer"
    for t in tensors:
        groups.setdefault((len(t.layers or []) or t.blocks or 1, len(t.experts or [])), []).append(
            tensor_label(t))
    if len(groups) == 1:
        (layers, experts), = groups
        if experts:
            extra.append(f"one expert shown: all {experts} experts in {plural(layers, 'layer')} are split "
                         "the same way")
        elif layers > 1:
            extra.append(f"the same in each of {layers} {unit}s")
    else:
        extra.append("; ".join(f"{', '.join(names)}: {plural(layers, unit) if layers > 1 else 'once'}"
                               for (layers, _), names in groups.items()))
    # each distinct note once, two at most (Zamba2's gate_up: the shared block's, then its adapters')
    extra += list(dict.fromkeys(t.note for t in tensors if t.note and t.note != "shared expert"))[:2]
    return " · ".join(extra)


def _panel_px(layout: dict) -> tuple[float, float]:
    """Approximate (width, height) in px of the source panel at VIEW_WIDTH."""
    margin = layout["margin"]
    # 40: y ticks
    width = (VIEW_WIDTH - margin["l"] - margin["r"] - 40) * (SOURCE_DOMAIN[1] - SOURCE_DOMAIN[0])
    return width, layout["height"] - margin["t"] - margin["b"]


def _px_per_unit(src: SourceView, layout: dict, x_range: list[float]) -> float:
    """Pixels per source-view x unit once Plotly fits the drawing (y is tied to x by scaleanchor)."""
    width, height = _panel_px(layout)
    return min(width / (x_range[1] - x_range[0]), height / (src.height * 1.01 * src.y_scale))


def _source_x_range(src: SourceView, layout: dict, pad_x: float) -> list[float]:
    """The source x range; stacked tensors get room on the left for their labels, so none is cut off."""
    right = src.width + pad_x * (4 if src.lines else 1)
    if not src.stacked or not src.labels:
        return [-pad_x, right]
    need = max(w for *_, w in src.labels) + 12  # px left of the tensors
    width, height = _panel_px(layout)
    by_height = need * src.height * 1.01 * src.y_scale / height  # room when the height limits the drawing
    by_width = need * (right + pad_x) / max(width - need, 1.0)  # room when the width does
    return [-pad_x - max(by_height, by_width), right]


LABEL_PX, LINE_PX = 30, 33  # a two-line 11 px label as the browser draws it, and one step down
SECTION_PX = 15  # a one-line 11 px section name


def _space_sections(src: SourceView, py: float) -> None:
    """Row-section names (q | k | v, Mamba's z | x | B | C | dt) beside one tensor, at least a line apart:
    thin sections would put them on top of each other; each moves down from where the last one ended."""
    last = {}  # x (a tensor's right edge) -> the px where its last name ends
    sections = (a for a in src.annotations if a.get("name") == "section")
    for a in sorted(sections, key=lambda a: (a["x"], a["y"])):
        y = a["y"] * py
        shift = max(0.0, last.get(a["x"], -1e9) + SECTION_PX - y)
        a["yshift"] = -shift
        last[a["x"]] = y + shift


def _spread_stacked(src: SourceView, py: float) -> float:
    """Names left of stacked tensors, top to bottom, at least a label apart (thin tensors such as FP8 scales
    would stack their names on each other); returns how far in px the lowest reaches below the drawing."""
    bottom = -1e9
    for index, *_ in sorted(src.labels, key=lambda label: src.annotations[label[0]]["y"]):
        a = src.annotations[index]
        centre = a["y"] * py
        shift = max(0.0, bottom + 3 - (centre - LABEL_PX / 2))
        a["yshift"] = -shift
        bottom = centre + shift + LABEL_PX / 2
    return bottom - src.height * 1.01 * py


def _section_box(a: dict, px: float, py: float) -> tuple[float, float, float, float]:
    """The px box (left, right, top, bottom) of a row-section name: bold 11 px, left-aligned beside its
    tensor, moved down by _space_sections."""
    centre = a["y"] * py - a.get("yshift", 0.0)
    left = a["x"] * px + a.get("xshift", 0)
    return left, left + label_px(a["text"]) + 2, centre - SECTION_PX / 2, centre + SECTION_PX / 2


def _place_labels(src: SourceView, px: float) -> float:
    """Side-by-side tensors narrower than their names: a label stays above its tensor when no other label is
    in the way, else goes below it, one line further down while it would cover another label or tensor (MLA's
    narrow scale tensors beside q_b_proj and kv_b_proj end up under the drawing). Returns how far in px the
    lowest label reaches below the drawing."""
    py = px * src.y_scale
    tensors = [((c - h) * px, (c + h) * px, 0.0, b * py) for _, c, b, h, _ in src.labels]
    # a tensor's row-section names (Mamba's B | C | dt, spaced below the drawing) are in the way too
    placed = [_section_box(a, px, py) for a in src.annotations if a.get("name") == "section"]

    def free(box) -> bool:
        return not any(box[0] < o[1] + 6 and o[0] < box[1] + 6 and box[2] < o[3] and o[2] < box[3]
                       for o in tensors + placed)
    lowest = max([box[3] - src.height * py for box in placed], default=0.0)
    for index, centre, bottom, _, width in src.labels:
        left, right = centre * px - width / 2, centre * px + width / 2
        box, step = (left, right, -LABEL_PX - 2, -2.0), None
        while not free(box):
            step = 0 if step is None else step + 1
            top = bottom * py + 2 + step * LINE_PX
            box = (left, right, top, top + LABEL_PX)
        if step:  # a line down from its tensor: several lines below, the name could belong to another
            src.annotations[index].update(y=bottom, yanchor="top", showarrow=True, arrowhead=0,
                                          arrowwidth=0.8, arrowcolor=MUTED, ax=0, ay=2 + step * LINE_PX,
                                          standoff=0)
        elif step is not None:
            src.annotations[index].update(y=bottom, yanchor="top", yshift=-2)
        placed.append(box)
        lowest = max(lowest, box[3] - src.height * py)
    return lowest


MAX_SHARED_LEGEND = 16  # legend entries for replicated ranges (KV heads); the rest are named on hover


def family_figure(m: ShardMap, family: str, group: LayerGroup | None = None) -> go.Figure:
    """Source view and rank view of one matrix family (in one layer group), side by side."""
    if family == "replicated":
        return replicated_figure(m, FAMILY_INFO["replicated"], group)
    split = [t for t in m.family(family, group) if t.split_dim is not None]
    if not split and family in whole_towers(m, group):
        hf = m.model.tower is not None and m.model.tower.kind in HF_KINDS
        key = "audio" if family == "audio" else "vision_hf" if hf else "vision_data"
        return replicated_figure(m, FAMILY_INFO[key], group, family)
    if not split:
        raise KeyError(f"{m.model.name} has no split tensors in family {family!r}")
    # vectors (column-parallel biases, attention sinks) follow their matrix's rows: named, not drawn
    tensors = [t for t in split if len(t.shape) >= 2] or split
    vectors = [t for t in split if t not in tensors]
    embedder = family == "audio" and m.model.audio.kind in HF_KINDS  # Gemma-3n: only embed_audio is cut
    key = "audio_embedder" if embedder else "audio_split" if family == "audio" else family
    title, line = FAMILY_INFO[key]
    if m.model.arch.mlp_gather and family in GATHERED_INFO:
        title, line = GATHERED_INFO[family]
    elif family == "qkv" and m.model.is_mla:
        line = MLA_LINE
    elif family == "experts" and (lay := m.deployment.layout if m.deployment else None) and lay.expert_cut:
        blocks = lay.tp // lay.expert_cut
        line = (f"Each expert is cut over the {lay.expert_cut} GPUs of its EP block (moe_tp_size = tp / "
                f"ep_size), gate/up by rows and down by columns: GPUs 0–{lay.expert_cut - 1} hold the first "
                f"block of experts and each of the {blocks} blocks cuts its own the same way (see the expert "
                "placement).")
    src, rk = source_view(m, tensors), rank_view(m, tensors)
    layout = base_layout(title, figure_height(m.tp_size))
    note = " · ".join(filter(None, [_notes(m, family, group), rk.header_note]))
    if vectors:
        names = ", ".join(dict.fromkeys(tensor_label(t) for t in vectors))
        note = " · ".join(filter(None, [note, f"split like their rows, not drawn: {names}"]))
    wrapped = textwrap.wrap(note, 150)  # Plotly never wraps text itself
    lines = textwrap.wrap(line, 150)
    layout["title"]["subtitle"] = dict(text="<br>".join(lines)
                                       + (f"<br><i>{'<br>'.join(wrapped)}</i>" if note else ""),
                                       font=dict(size=11, color=MUTED))
    # room for the subtitle lines and panel titles
    layout["margin"]["t"] = 130 + 15 * (len(lines) + len(wrapped))
    pad_x = src.width * 0.03
    x_range = _source_x_range(src, layout, pad_x)
    px = _px_per_unit(src, layout, x_range)
    room = _panel_px(layout)[1] - src.height * 1.01 * src.y_scale * px + layout["margin"]["b"]
    if not src.stacked:
        _space_sections(src, px * src.y_scale)
    lowest = _place_labels(src, px) if not src.stacked else _spread_stacked(src, px * src.y_scale)
    extra = max(0.0, lowest - room + 4)  # labels pushed below the drawing need the room
    layout["margin"]["b"] += int(extra)
    layout["height"] += int(extra)
    layout["xaxis"] = axis(domain=SOURCE_DOMAIN, range=x_range,
                           showticklabels=False, constrain="domain",
                           constraintoward="right" if src.stacked else "left")
    # the labels are placed in px at VIEW_WIDTH's scale: rows run on below the drawing until the panel's
    # height holds that scale, so a wider figure (a wide window, a PNG) keeps it, and its labels stay apart
    bottom = max(src.height * 1.01, _panel_px(layout)[1] / (px * src.y_scale))
    stacked_ticks = dict(tickvals=[y for y, _ in src.ticks], ticktext=[t for _, t in src.ticks], side="right",
                         tickfont=dict(size=9, color=MUTED)) if src.stacked else dict(
        tickformat="~s", tickvals=row_ticks(src.height))
    layout["yaxis"] = axis("rows of each tensor" if src.stacked else "rows of the checkpoint tensor" if any(
                           t.split_dim == 0 for t in tensors) else "rows", range=[bottom, 0],
                           scaleanchor="x", scaleratio=src.y_scale, constrain="domain", constraintoward="top",
                           **stacked_ticks)
    layout["xaxis2"] = axis(f"local {rk.axis_word} of each GPU's parameter", domain=RANK_DOMAIN, anchor="y2",
                            range=[0, rk.width * 1.01], showgrid=True, gridcolor="#eef1f4",
                            tickvals=[x for x, _ in rk.ticks], ticktext=[t for _, t in rk.ticks])
    labels = [gpu_label(r) for r in range(m.tp_size)]
    layout["yaxis2"] = axis(anchor="x2", type="category", categoryorder="array", categoryarray=labels,
                            range=[m.tp_size - 0.5, -0.5], tickfont=dict(size=10, color=INK))
    layout["shapes"] = [dict(type="line", xref="x", yref="y", x0=a, y0=b, x1=c, y1=d,
                             line=dict(color=INK, width=1.4, dash="dot")) for a, b, c, d in src.lines]
    scaled = "" if abs(src.y_scale - 1) < 0.1 else (
        f"<br><span style='font-size:10px'>rows drawn ×{src.y_scale:.2g} (long side compressed)</span>")
    layout["annotations"] = (
        [_panel_title("Source view</b> · checkpoint tensors, banded by GPU" + scaled, SOURCE_DOMAIN),
         _panel_title("Rank view</b> · each GPU's local parameter", RANK_DOMAIN)]
        + [dict(a, xref="x", yref="y") for a in src.annotations]
        + [dict(a, xref="x2", yref="y2") for a in rk.annotations])
    traces = [src.bars.trace("x", "y", line_width=0 if src.dense else 0.6),
              rk.bars.trace("x2", "y2", line_width=0.8)]
    for trace in traces:
        trace.showlegend = False
    shown = list(src.shared.items())[:MAX_SHARED_LEGEND]
    # legend entries only
    traces += [go.Bar(x=[None], y=[None], name=name, marker=dict(color=color, pattern=dict(
        shape="x", fillmode="overlay", fgcolor="rgba(255,255,255,0.5)", size=7,
        solidity=0.25)), hoverinfo="skip") for name, color in shown]
    if shown:
        rows = -(-len(shown) // 4)
        extra = 70 + 22 * rows  # below the rank view's axis title; the plots keep their height
        layout["margin"]["b"] += extra
        layout["height"] += extra
        more = (f"{len(src.shared) - len(shown)} more shared heads in the hover · "
                if len(src.shared) > len(shown) else "")
        layout.update(showlegend=True, legend=dict(
            orientation="h", x=SOURCE_DOMAIN[0], y=0, yref="container", yanchor="bottom", entrywidth=230,
            font=dict(size=10, color=MUTED), title=dict(text=f"{more}hatched: one band held by several GPUs",
                                                          side="top")))
    return go.Figure(data=traces, layout=layout)


def all_figures(m: ShardMap, group: LayerGroup | None = None) -> dict[str, go.Figure]:
    """Every figure of a view, keyed by a file-safe name: one per family present (in the group), then
    memory."""
    figs = {family: family_figure(m, family, group) for family in families_present(m, group)}
    figs["memory"] = memory_figure(m)
    return figs


def grouped_figures(m: ShardMap) -> list[tuple[LayerGroup, dict[str, go.Figure]]]:
    """Every layer group with the figures it adds: a family is drawn once per distinct set of tensors, so MoE
    experts shared by all groups, the embeddings and the norms appear under the first group only."""
    out, seen = [], set()
    for i, g in enumerate(m.groups):
        figs = {}
        for family in families_present(m, g):
            key = (family, tuple((t.name, tuple(t.layers or ())) for t in m.family(family, g)
                                 if family != "replicated" or t.split_dim is None))
            if key not in seen:
                seen.add(key)
                figs[f"group{i + 1}_{family}"] = family_figure(m, family, g)
        out.append((g, figs))
    return out


def export_figures(m: ShardMap) -> dict[str, go.Figure]:
    """Every figure of every layer group, the layer strip and memory: what the ZIP and `map --png` write."""
    if len(m.groups) <= 1:
        figs = dict(all_figures(m))
    else:
        figs = {"layers": layer_strip(m)}
        for _, group_figs in grouped_figures(m):
            figs.update(group_figs)
        figs["memory"] = memory_figure(m)
    if m.deployment and m.deployment.layout.expert_cut == 1:  # whole experts: no tp cut of them to draw
        figs = {k: f for k, f in figs.items() if k != "experts" and not k.endswith("_experts")}
    if m.deployment:  # a pp / dp / ep deployment: its device grid and expert placement too
        figs["device_grid"] = device_grid(m.deployment)
        if (experts := expert_figure(m.deployment)) is not None:
            figs["expert_placement"] = experts
    return figs

"""Geometry shared by the views: sections and heads of a tensor, and a compact bar accumulator.

Figures draw one bar per (piece, head) at most, never one point per row, so a page stays small
even for DeepSeek-V3 at tp=64.
"""
import math
from dataclasses import dataclass, field

import plotly.graph_objects as go

from tpviz.render.plots.style import text_color
from tpviz.trace.shardmap import Piece, TensorMap
from tpviz.config.spec import ModelSpec
from tpviz.render.summary import short_name

MAX_HEAD_BARS = 512  # above this many heads in one tensor, draw pieces only (heads would be sub-pixel)
# Mixtral's expert names in the rank view's words
ALIASES = {"w1": "w1 (gate)", "w3": "w3 (up)", "w2": "w2 (down)"}


@dataclass
class Section:
    """A labelled run [start, stop) along a tensor's split dim, optionally made of heads of head_size."""
    label: str
    start: int
    stop: int
    head_size: int | None = None
    head_word: str = "head"


# a quantized matrix's companions, stored beside its weight
QUANT_PARTS = ("weight_scale_inv", "weight_scale", "weight_scale_2", "input_scale", "scales", "qzeros",
               "g_idx", "qweight")


# modules outside the encoder blocks keep their name as a prefix: Llama-4's adapter and MiniCPM-V's resampler
# have an mlp.fc1 / attn.out_proj of their own, MiniCPM-V 4.6's vit_merger a whole attention block
OUTSIDE = {"merger": "merger.", "deepstack_merger_list": "deepstack.", "vision_adapter": "adapter.",
           "vit_merger": "vit_merger.", "resampler": "resampler.", "mlp1": "mlp1.", "neck": "neck."}


# transformers-built towers (plan/tower_hf.py): modules nest, and one leaf name recurs under several parents
# (Gemma-4's audio feed_forward1 / feed_forward2 each hold ffw_layer_1 and its clip bounds), so the whole path
NESTED = ("audio_tower", "embed_audio", "embed_vision")
NESTED_VISION = ("encoder", "patch_embedder", "std_bias", "std_scale")  # Gemma-4's (Gemma-3's: vision_model)


def _nested_label(names: list[str], skip: tuple) -> str:
    """Every module on the path (the embedder's own name kept), ClippableLinear's inner 'linear' dropped:
    'audio_tower.layers.*.feed_forward1.ffw_layer_1.linear.weight' -> 'feed_forward1.ffw_layer_1'."""
    parts = [p for p in names[names[0] not in ("embed_audio", "embed_vision"):]
             if p not in skip and p not in ("linear", "mlp", "conformer")]
    bias = parts[-1] == "bias" and len(parts) > 1
    return ".".join(parts[:-1] if bias else parts) + (" bias" if bias else "")


def tower_label(name: str) -> str:
    """A tower tensor's or parameter's short name, its part kept: 'visual.blocks.*.attn.proj.weight' ->
    'attn.proj', 'visual.merger.mlp.0.bias' -> 'merger.mlp.0 bias'."""
    skip = ("weight", "*", "blocks", "vision_model", "encoder", "layers", "embeddings", "self_attn")
    names = name.split(".")
    if names[0] in NESTED or names[0] == "vision_tower" and names[1] in NESTED_VISION:
        return _nested_label(names, skip)
    at = next((i for i, p in enumerate(names) if p in OUTSIDE), None)
    if at is None:
        part, parts = "", [p for p in names[1:] if p not in skip and p != "mlp"]
    else:
        part, parts = OUTSIDE[names[at]], [p for p in names[at + 1:] if p not in skip]
    if not parts:  # 'merger.weight': the module is the tensor
        return part.rstrip(".") or name
    tail = parts[:-1] if parts[-1] == "bias" else parts
    if not tail:
        return f"{part.rstrip('.')} bias"
    label = part + (".".join(tail[-2:]) if tail[-1] == "proj" or part else tail[-1])
    label = f"{label} bias" if parts[-1] == "bias" else label
    # one tensor per block where blocks differ (SAM's relative-position tables, two sizes)
    block = next((b for a, b in zip(names, names[1:]) if a == "blocks" and b.isdigit()), None)
    return f"{label} (block {block})" if block is not None else label


def tensor_label(t: TensorMap) -> str:
    """Short display name: 'self_attn.q_proj.weight' -> 'q_proj', keeping '.bias'."""
    if t.tower:
        return tower_label(t.name)
    name = short_name(t.name)
    parts = [p for p in name.split(".") if p not in ("weight", "*", "self_attn", "mlp", "experts")]
    label = parts[-1] if parts else name
    label = ALIASES.get(label, label)
    if len(parts) > 1 and parts[-2].endswith("_adapter_list") and label in ("0", "1"):  # Zamba2's LoRA A / B
        label = f"{parts[-2].removeprefix('linear_').removesuffix('_list')} {'AB'[int(label)]}"
    if label in QUANT_PARTS and len(parts) > 1:  # a scale names its matrix: q_proj's and k_proj's differ
        label = f"{ALIASES.get(parts[-2], parts[-2])}.{label}"
    if name.endswith(".bias"):
        label = f"{parts[-2] if len(parts) > 1 else label} bias"
    if "shared_expert" in name:
        label = f"shared {label}"
    return label


def sections(t: TensorMap, model: ModelSpec) -> list[Section]:
    """The labelled parts of a tensor along its split dim: q|k|v, gate|up, heads, or the whole tensor."""
    # declared by the plan: fused parts, per-head or per-group interleaving, each group's head dims
    if t.sections:
        return [Section(label, a, b, size or None, word or "head") for label, a, b, size, word in t.sections]
    n = t.shape[t.split_dim or 0]
    h, kv, d = model.num_attention_heads, model.num_key_value_heads, model.head_dim
    shared = "shared " if "shared_expert" in t.name else ""
    bias = " bias" if t.name.endswith(".bias") else ""
    if t.family in ("qkv", "o_proj"):
        # fused on disk
        if t.layer_class == "QKVParallelLinear" and t.shard_id is None and n == (h + 2 * kv) * d:
            return [Section("q" + bias, 0, h * d, d, "q head"),
                    Section("k" + bias, h * d, (h + kv) * d, d, "KV head"),
                    Section("v" + bias, (h + kv) * d, n, d, "KV head")]
        heads, word = (kv, "KV head") if t.shard_id in ("k", "v") else (h,
                                                                        "q head"
                                                                        if t.shard_id == "q" else "head")
        label = str(t.shard_id) + bias if t.shard_id in ("q", "k", "v") else tensor_label(t)
        return [Section(label, 0, n, n // heads if n % heads == 0 and n >= heads else None, word)]
    if t.layer_class == "MergedColumnParallelLinear":
        if t.shard_id is None:  # fused gate_up on disk: [gate | up]
            return [Section(f"{shared}gate{bias}", 0, n // 2), Section(f"{shared}up{bias}", n // 2, n)]
        return [Section(f"{shared}{('gate', 'up')[int(t.shard_id)]}{bias}", 0, n)]
    return [Section(tensor_label(t), 0, n)]


def split_piece(p: Piece, secs: list[Section], by_heads: bool) -> list[tuple[int, int, Section]]:
    """Cut a piece at section (and, if by_heads, head) boundaries: [(start, stop, section)]."""
    out = []
    for s in secs:
        a, b = max(p.start, s.start), min(p.stop, s.stop)
        if a >= b:
            continue
        step = s.head_size if by_heads and s.head_size else None
        if step is None:
            out.append((a, b, s))
            continue
        cut = a
        while cut < b:
            nxt = min(b, s.start + ((cut - s.start) // step + 1) * step)
            out.append((cut, nxt, s))
            cut = nxt
    return out


def head_text(a: int, b: int, s: Section) -> str:
    """'q head 5' or 'KV heads 0–1' for the source range [a, b) inside section s, '' when s has no heads."""
    if not s.head_size:
        return ""
    first, last = (a - s.start) // s.head_size, (b - 1 - s.start) // s.head_size
    return f"{s.head_word} {first}" if first == last else f"{s.head_word}s {first}–{last}"


def head_short(a: int, b: int, s: Section) -> str:
    """'h0' or 'h0–3' for the source range [a, b) inside s, '' when s has no heads (a label inside a
    bar)."""
    if not s.head_size:
        return ""
    first, last = (a - s.start) // s.head_size, (b - 1 - s.start) // s.head_size
    return f"h{first}" if first == last else f"h{first}–{last}"


def span(a: int, b: int) -> str:
    """Inclusive display of a half-open range."""
    return f"{a}" if b - a == 1 else f"{a}–{b - 1}"


def label_px(text: str) -> float:
    """Rough width in px of a two-line 11 px label '<b>name</b><br>shape' (Plotly cannot measure text for
    us)."""
    name, _, shape = text.replace("<b>", "").replace("</b>", "").partition("<br>")
    return max(6.8 * len(name), sum(6.6 if c.isalpha() or c == "_" else 6.1 for c in shape))


def row_ticks(rows: float) -> list[float]:
    """Round row numbers from 0 to a drawing's last row (none in blank rows below it)."""
    step = 10 ** max(0, math.floor(math.log10(max(rows, 1) / 4)))  # whole rows
    step *= next(k for k in (1, 2, 5, 10) if rows / (step * k) <= 6)
    return [i * step for i in range(int(rows // step) + 1)]


def plural(n: int, word: str) -> str:
    """'1 layer', '3 layers'."""
    return f"{n} {word}{'' if n == 1 else 's'}"


def counted(word: str, a: int, b: int) -> str:
    """'rows 0–3', or 'row 4' for a single one."""
    return f"{word.removesuffix('s') if b - a == 1 else word} {span(a, b)}"


@dataclass
class Bars:
    """Columns of one go.Bar trace: every rectangle of a view in a single trace keeps the payload small."""
    orientation: str = "v"
    cols: dict = field(default_factory=lambda: {k: [] for k in
                                                ("x", "y", "base", "width", "color",
                                                 "pattern", "hover", "text")})

    def add(self, x: float | str, y: float | str, base: float, width: float, color: str,
            hover: str, text: str = "", pattern: str = "") -> None:
        """One rectangle: position and size along each axis, fill, hover text, inside label and hatch
        pattern."""
        for key, value in zip(self.cols, (x, y, base, width, color, pattern, hover, text)):
            self.cols[key].append(value)

    def __len__(self) -> int:
        return len(self.cols["x"])

    def trace(self, xaxis: str = "x", yaxis: str = "y", line_width: float = 0.6,
              opacity: float | None = None) -> go.Bar:
        """The accumulated rectangles as one bar trace."""
        c = self.cols
        return go.Bar(
            x=c["x"], y=c["y"], base=c["base"], width=c["width"], orientation=self.orientation,
            marker=dict(color=c["color"], line=dict(color="white", width=line_width),
                        pattern=dict(shape=c["pattern"], fillmode="overlay",
                                     fgcolor="rgba(255,255,255,0.5)", size=7, solidity=0.25),
                        opacity=opacity),
            hovertext=c["hover"], hovertemplate="%{hovertext}<extra></extra>",
            text=c["text"], textposition="inside", insidetextanchor="middle",
            # a halo hides the hatching
            textfont=dict(color=[text_color(f) for f in c["color"]], size=11, shadow=[
                f"0 0 1px {f}, 0 0 2px {f}, 0 0 2px {f}, 0 0 4px {f}" if pat and tx else "none"
                for f, pat, tx in zip(c["color"], c["pattern"], c["text"])]),
            textangle=0, xaxis=xaxis, yaxis=yaxis, cliponaxis=False)

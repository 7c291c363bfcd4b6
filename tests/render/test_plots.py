"""Figures built from a ShardMap: what each view draws, the special cases, colours and payload size."""
from functools import lru_cache

import pytest

from tpviz import load_spec, shard_map as _shard_map
from tpviz.render.plots import FAMILY_INFO, all_figures, figure_height
from tpviz.render.plots.geometry import Section, head_text, sections, split_piece, tensor_label
from tpviz.render.plots.style import INK, PADDING_COLOR, RANK_COLORS, rank_color, text_color
from tpviz.trace.shardmap import Piece
from tpviz.config.sources import presets
from tpviz.render.summary import families_present
from tpviz.trace.validity import split_problem
from tpviz.archs import arch_of

MB = 1_000_000


@lru_cache(maxsize=None)
def shard_map(model, tp: int, rules: str = "vllm"):
    """Read-only shard maps shared by the tests; 'vocabN' is Llama-2-7B with vocab_size=N."""
    if model.startswith("vocab"):
        return _shard_map(dict(presets()["meta-llama/Llama-2-7b-hf"], vocab_size=int(model[5:])), tp, rules)
    return _shard_map(model, tp, rules)


@lru_cache(maxsize=None)
def figs(model, tp: int, rules: str = "vllm"):
    return all_figures(shard_map(model, tp, rules))


def bars(fig, view: int) -> list[dict]:
    """The rectangles of a view (0 = source, 1 = rank) as dicts."""
    t = fig.data[view]
    return [dict(x=x, y=y, base=b, width=w, color=c, hover=h, text=tx, pattern=pt) for x, y,
            b, w, c, h, tx, pt in
            zip(t.x, t.y, t.base, t.width, t.marker.color, t.hovertext, t.text, t.marker.pattern.shape)]


def test_one_figure_per_family_then_memory():
    f = figs("Qwen/Qwen3-8B", 4)
    assert list(f) == ["qkv", "o_proj", "gate_up", "down_proj", "embed", "lm_head", "replicated", "memory"]
    moe = figs("Qwen/Qwen3-30B-A3B", 8)
    assert "experts" in moe and "gate_up" not in moe  # every layer is MoE
    for key, fig in f.items():
        title = fig.layout.title.text
        assert title == (FAMILY_INFO[key][0] if key in FAMILY_INFO else "Memory per GPU")


@pytest.mark.parametrize("model", list(presets()))
def test_every_preset_draws(model):
    tp = 2 if split_problem(load_spec(model), 2)[0] is None else 1  # falcon-7b's 71 heads split only at tp=1
    m = shard_map(model, tp)
    f = figs(model, tp)
    assert set(f) == set(families_present(m)) | {"memory"}
    for key, fig in f.items():
        fig.to_json()  # serialisable
        assert all(len(trace.x) > 0 for trace in fig.data), key


def test_source_view_hover_has_head_range_rank_and_local_offset():
    fig = figs("Qwen/Qwen3-8B", 4)["qkv"]
    hovers = [b["hover"] for b in bars(fig, 0)]
    q8 = next(h for h in hovers if "q_proj rows 1024–1151" in h)
    assert "<b>GPU 1</b>" in q8 and "q head 8" in q8 and "local rows 0–127 of self_attn.qkv_proj" in q8
    k0 = next(h for h in hovers if "k_proj rows 256–383" in h)
    # after this GPU's 1024 q rows
    assert "GPU 1" in k0 and "KV head 2" in k0 and "local rows 1024–1151" in k0
    # one bar per head (32 q + 8 k + 8 v), never one per row
    assert len(hovers) == 48


def test_source_view_bands_match_pieces_and_rank_colours():
    m, fig = shard_map("Qwen/Qwen3-8B", 4), figs("Qwen/Qwen3-8B", 4)["gate_up"]
    src = bars(fig, 0)
    assert len(src) == sum(len(t.pieces) for t in m.family("gate_up"))
    gate = m.tensor("model.layers.*.mlp.gate_proj.weight")
    for piece, bar in zip(gate.pieces, src):
        assert (bar["base"], bar["y"]) == (piece.start, piece.size)  # rows in proportion, along y
        assert bar["color"] == rank_color(piece.rank)


def test_row_parallel_is_banded_by_columns():
    m, fig = shard_map("Qwen/Qwen3-8B", 4), figs("Qwen/Qwen3-8B", 4)["down_proj"]
    src = bars(fig, 0)
    assert [b["width"] for b in src] == [p.size
                                         for p in m.tensor("model.layers.*.mlp.down_proj.weight").pieces]
    assert all(b["y"] == 4096 for b in src) and "columns 0–3071" in src[0]["hover"]


def test_replicated_kv_heads_are_one_hatched_band_named_in_the_legend():
    fig = figs("meta-llama/Llama-3.1-8B", 16)["qkv"]
    k_head0 = [b for b in bars(fig, 0) if "k_proj rows 0–127" in b["hover"]]
    assert len(k_head0) == 1 and k_head0[0]["width"] == 4096  # one full-width band, not a fake column split
    assert k_head0[0]["pattern"] == "x" and "GPUs 0, 1 each hold a full copy" in k_head0[0]["hover"]
    legend = [t.name for t in fig.data if t.showlegend is not False]
    assert legend == [f"KV head shared by GPUs {2 * i}–{2 * i + 1}" for i in range(8)]
    assert [b["pattern"] for b in bars(fig, 0) if "q_proj" in b["hover"]][0] == ""  # q heads are not shared
    gpu1 = [b["text"] for b in bars(fig, 1) if b["y"].endswith("GPU 1")]
    # head ranges readable without hovering
    assert gpu1 == ["q h2–3 (256–511)", "k h0 (0–127)", "v h0 (0–127)"]
    assert list(fig.layout.yaxis.ticktext) == ["0", "2,048", "4,096", "0", "512", "1,024",
                                               "0", "512", "1,024"]
    # nothing shared: no legend
    assert [t.showlegend for t in figs("Qwen/Qwen3-8B", 4)["qkv"].data] == [False, False]


def test_rank_view_is_the_double_cut():
    m = shard_map("microsoft/Phi-3-mini-128k-instruct", 2)  # qkv and gate_up fused on disk
    rk = bars(figs("microsoft/Phi-3-mini-128k-instruct", 2)["qkv"], 1)
    gpu0 = [b for b in rk if b["y"].endswith("GPU 0")]
    assert [b["text"].split()[0] for b in gpu0] == ["q", "k", "v"]
    assert [b["base"] for b in gpu0] == [0, 1536, 3072] and [b["x"] for b in gpu0] == [1536] * 3
    assert "← qkv_proj rows 3072–4607 (KV heads 0–15)" in gpu0[1]["hover"]
    gate_up = [b for b in bars(figs("microsoft/Phi-3-mini-128k-instruct", 2)["gate_up"], 1)
               if b["y"].endswith("GPU 1")]
    assert [b["text"].split()[0] for b in gate_up] == ["gate", "up"]
    assert m.params[-2].local_shapes[1][0] == 8192


def test_a_gathered_gate_up_is_one_cut_not_the_double_cut():
    """GLM-4-hf (vLLM's Transformers backend): at tp 2 GPU 0 holds all of gate and GPU 1 all of up, and the
    titles say the output is gathered, not packed [gate | up] on every GPU."""
    f = figs("THUDM/glm-4-9b-chat-hf", 2)
    assert "gathered" in f["gate_up"].layout.title.text and "gathered" in f["down_proj"].layout.title.text
    assert "packed" not in f["gate_up"].layout.title.subtitle.text
    rk = bars(f["gate_up"], 1)
    assert [(b["y"].split()[-1], b["text"].split()[0]) for b in rk] == [("0", "gate"), ("1", "up")]


def test_vocab_padding_is_drawn_in_both_views():
    fig = figs("vocab32001", 4)["embed"]
    pad_src = [b for b in bars(fig, 0) if b["color"] == PADDING_COLOR]
    assert len(pad_src) == 1 and "63 padding rows" in pad_src[0]["hover"] and "32064" in pad_src[0]["hover"]
    pad_rank = [b for b in bars(fig, 1) if b["color"] == PADDING_COLOR]
    assert len(pad_rank) == 1 and pad_rank[0]["y"].endswith("GPU 3") and "7953–8015" in pad_rank[0]["hover"]
    assert not [b for b in bars(figs("Qwen/Qwen3-8B", 4)["embed"], 1) if b["color"] == PADDING_COLOR]


def test_row_parallel_bias_is_marked_rank0_only():
    fig = figs("openai/gpt-oss-20b", 8)["replicated"]
    grid = bars(fig, 1)
    o_bias = [b for b in grid if "o_proj.bias" in b["hover"]]
    assert len(o_bias) == 8
    assert "added here (GPU 0)" in o_bias[0]["hover"]
    assert all("held but not added" in b["hover"] for b in o_bias[1:])
    assert list(fig.data[1].marker.opacity)[:8] == [1.0] * 8  # norm.weight: every GPU uses it
    assert "added on GPU 0 only" in " ".join(fig.layout.yaxis.ticktext)


def test_mla_and_experts_figures():
    ds = figs("deepseek-ai/DeepSeek-V3", 8)
    assert "MLA" in ds["qkv"].layout.title.subtitle.text
    assert "all 256 experts in 58 layers" in ds["experts"].layout.title.subtitle.text
    q_b = [b for b in bars(ds["qkv"], 0) if "q_b_proj rows 0–191" in b["hover"]]
    assert q_b and "head 0" in q_b[0]["hover"]  # q_b rows are 192 per head (128 nope + 64 rope)


def test_palette_is_fixed_and_distinct():
    assert len(set(RANK_COLORS)) == len(RANK_COLORS) == 64
    assert rank_color(3) == RANK_COLORS[3] and rank_color(64) == RANK_COLORS[0]


def test_geometry_helpers():
    secs = [Section("q", 0, 8, 2, "q head"), Section("k", 8, 12, 2, "KV head")]
    cuts = split_piece(Piece(0, 6, 10, 0), secs, by_heads=True)
    assert [(a, b, s.label) for a, b, s in cuts] == [(6, 8, "q"), (8, 10, "k")]
    assert head_text(4, 8, secs[0]) == "q heads 2–3" and head_text(8, 10, secs[1]) == "KV head 0"
    m = shard_map("Qwen/Qwen3-8B", 4)
    assert tensor_label(m.tensor("model.layers.*.self_attn.q_proj.weight")) == "q_proj"
    assert [s.label for s in sections(m.tensor("model.layers.*.mlp.up_proj.weight"), m.model)] == ["up"]


@pytest.mark.parametrize("model, tp", [("meta-llama/Llama-3.1-405B", 64), ("deepseek-ai/DeepSeek-V3", 16)])
def test_payload_stays_small_at_tp64(model, tp):  # DeepSeek-V3's FP8 blocks stop at tp 16 (down_proj at 32)
    total = sum(len(fig.to_json()) for fig in figs(model, tp).values())
    assert total < 2 * MB, total
    assert figure_height(64) <= 1000


def test_memory_figure_naive_line():
    fig = figs("meta-llama/Llama-3.1-8B", 16)["memory"]
    assert fig.layout.barmode == "stack"
    naive = shard_map("meta-llama/Llama-3.1-8B", 16).total_weight_bytes / 16 / 2**30
    assert fig.layout.shapes[0].y0 == pytest.approx(naive)
    assert "+3.4%" in fig.layout.title.subtitle.text


def tensor_labels(fig) -> dict[str, str]:
    """Source-view tensor name -> where its label sits ('bottom' = above the tensor, 'top' = below it); a
    scale's label is its matrix's name over 'weight_scale_inv 16 × 56', keyed 'gate_proj weight_scale_inv'."""
    out = {}
    for a in fig.layout.annotations:
        if a.xref == "x" and "×" in (a.text or ""):
            name, shape = a.text.replace("<b>", "").replace("</b>", "").split("<br>")
            part = shape.split(" ")[0]
            out[f"{name} {part}" if not part[0].isdigit() else name] = a.yanchor
    return out


def test_side_by_side_names_never_run_into_each_other():
    # tall, narrow gate/up tensors: the second name moves below its tensor
    assert (tensor_labels(figs("Qwen/Qwen2.5-7B-Instruct", 4)["gate_up"])
            == {"gate_proj": "bottom", "up_proj": "top"})
    # FP8: the block scales sit beside them
    ds = tensor_labels(figs("deepseek-ai/DeepSeek-V3", 16)["gate_up"])
    assert {k: v for k, v in ds.items() if "scale" not in k} == {
        "gate_proj": "bottom", "up_proj": "top", "shared gate_proj": "bottom", "shared up_proj": "top"}
    # MLA: each narrow scale tensor's name is wider than the gap it sits in, so both go under the drawing, one
    # line apart, and the figure grows to keep them (they ran into kv_b_proj's name and each other)
    qkv = figs("deepseek-ai/DeepSeek-V3", 16)["qkv"]
    # how far below its tensor (px): a name lines further down hangs from a line to its tensor
    below = sorted(a.ay if a.showarrow else -a.yshift for a in qkv.layout.annotations
                   if a.xref == "x" and "<br>weight_scale_inv " in (a.text or "") and a.yanchor == "top")
    assert len(below) == 2 and below[0] <= below[1] - 30 and qkv.layout.margin.b > 48
    # names that fit stay above
    assert set(tensor_labels(figs("Qwen/Qwen3-8B", 4)["gate_up"]).values()) == {"bottom"}
    assert set(tensor_labels(figs("Qwen/Qwen3-8B", 4)["o_proj"]).values()) == {"bottom"}


def test_a_name_far_below_its_tensor_hangs_from_a_line_to_it():
    """Llama-4's vision tab: q/k/v/o are thin beside fc1 and fc2, so their names step down under the drawing;
    past the first line each hangs from a line to its own tensor, or it could be read as another's."""
    fig = figs("meta-llama/Llama-4-Scout-17B-16E-Instruct", 8)["vision"]
    below = {a.text.split("<br>")[0].replace("<b>", "").replace("</b>", ""): a for a in fig.layout.annotations
             if a.xref == "x" and "×" in (a.text or "") and a.yanchor == "top"}
    hung = {name for name, a in below.items() if a.showarrow}
    assert {"v_proj", "o_proj", "fc1"} <= hung
    assert all(a.ay >= 30 and a.arrowhead == 0 for name, a in below.items() if name in hung)
    assert all(a.yshift == -2 for name, a in below.items() if name not in hung)  # just under their tensor


def test_stacked_names_have_room_on_the_left():
    fig = figs("meta-llama/Llama-3.1-405B", 64)["qkv"]  # q/k/v fill the panel's width at tp=64
    assert fig.layout.xaxis.range[0] < -0.3 * 16384
    assert set(tensor_labels(fig).values()) == {"middle"}


def test_inside_text_contrasts_with_its_bar():
    assert text_color(rank_color(0)) == "white" and text_color("#edc948") == INK  # blue / yellow
    assert text_color(PADDING_COLOR) == INK
    rank = figs("meta-llama/Llama-3.1-8B", 8)["qkv"].data[1]
    fills = dict(zip(rank.marker.color, rank.textfont.color))
    assert fills[rank_color(0)] == "white" and fills[rank_color(5)] == INK


def test_mixtral_expert_names_say_gate_up_down():
    labels = tensor_labels(figs("mistralai/Mixtral-8x7B-v0.1", 8)["experts"])
    assert list(labels) == ["w1 (gate)", "w3 (up)", "w2 (down)"]


def test_hovers_name_the_gpu_count_in_words_and_format_bytes_as_the_header():
    from tpviz.render.plots.geometry import counted, plural
    from tpviz.render.plots.memory import memory_figure
    from tpviz.render.summary import memory_rows
    from tpviz.render.text import fmt_bytes
    assert (plural(1, "layer"), plural(3, "layer")) == ("1 layer", "3 layers")
    assert (counted("rows", 0, 1), counted("rows", 0, 2)) == ("row 0", "rows 0–1")
    m = shard_map("deepseek-ai/DeepSeek-V3", 16)  # 16 GPUs: the axis keeps only the swatch and the number
    fig, rows = memory_figure(m), memory_rows(m)
    kv = fig.data[-1]
    assert [c[1] for c in kv.customdata] == [fmt_bytes(r["kv_per_token"]) for r in rows]  # as the header
    assert kv.customdata[3][0] == "GPU 3" and "%{x}" not in kv.hovertemplate
    assert all("%{y" not in t.hovertemplate for t in fig.data)  # no second rounding of the same bytes


def test_a_wide_source_view_keeps_its_scale_in_a_wider_figure():
    """Labels are placed in px at VIEW_WIDTH: a drawing that the width limits there (the vision tower's wide,
    short row of tensors) gets blank rows below it, so in a wider figure (a PNG, a wide window) the height
    limits it at the same scale, and no tick names a row below the tensors."""
    from tpviz.render.plots import SOURCE_DOMAIN, VIEW_WIDTH
    from tpviz.render.plots.geometry import row_ticks
    lay = figs("Qwen/Qwen2.5-VL-7B-Instruct", 4)["vision"].layout
    by_width = ((VIEW_WIDTH - lay.margin.l - lay.margin.r - 40) * (SOURCE_DOMAIN[1] - SOURCE_DOMAIN[0])
                / (lay.xaxis.range[1] - lay.xaxis.range[0]))
    by_height = (lay.height - lay.margin.t - lay.margin.b) / (lay.yaxis.range[0] * lay.yaxis.scaleratio)
    assert by_height == pytest.approx(by_width)  # both bind at VIEW_WIDTH; wider, the height alone does
    tallest = 5120  # merger.mlp.0: 5120 × 5120
    assert lay.yaxis.range[0] > 1.5 * tallest
    assert list(lay.yaxis.tickvals) == [0, 1000, 2000, 3000, 4000, 5000]
    assert row_ticks(7) == [0, 2, 4, 6] and row_ticks(1) == [0, 1]  # whole rows
    tall = figs("meta-llama/Llama-3.1-8B", 8)["gate_up"].layout  # the height limits it already: no blank rows
    assert tall.yaxis.range[0] == pytest.approx(14336 * 1.01)


TOWERS = sorted(hub for hub, cfg in presets().items()  # mapped
                if (a := arch_of(cfg.get("model_type", ""))).tower or a.audio)


@pytest.mark.parametrize("model", TOWERS)
def test_each_tower_label_names_one_tensor(model):
    """Two tower tensors under one label would share a row of the vision figure (Llama-4's adapter MLP beside
    the blocks' own fc1 / fc2)."""
    tower = [t for t in shard_map(model, 1).tensors if t.tower]
    assert tower, model
    named: dict[str, set[str]] = {}
    for t in tower:
        named.setdefault(tensor_label(t), set()).add(t.name)
    assert {label: names for label, names in named.items() if len(names) > 1} == {}

"""The explorer's header: the view's title and model line, its notes and warnings, the four metrics, the
special cases and a deployment's GPUs."""
import streamlit as st

from explorer.cache import Page, other_engine
from explorer.deploy import deployment_section
from explorer.style import PLOTLY_CONFIG
from explorer.text import literal
from tpviz.render import summary as S
from tpviz.render.text import fmt_bytes
from tpviz.rules.layout import Layout
from tpviz.trace.checkpoint import checkpoint_sentence
from tpviz.trace.shardmap import Deployment
from tpviz.trace.validity import ValidRow


LABELS = {"rank": "GPU", "weights": "weights", "naive": "total / tp", "overhead": "above total / tp",
          "kv_per_token": "KV cache / token", "kv_naive_per_token": "KV total / tp / token",
          "kv_windowed_per_token": "windowed KV / token (up to the window)"}


def versus(value: float, naive: float) -> dict:
    """metric() delta arguments against the naive total/tp: red and up when above it, plain when equal."""
    pct = (value / naive - 1) * 100 if naive else 0.0
    if abs(pct) < 0.05:
        return dict(delta="= total/tp", delta_color="off", delta_arrow="off")
    return dict(delta=f"{pct:+.1f}% vs total/tp", delta_color="inverse")


def header(page: Page, rows: list[ValidRow], lay: Deployment | None, mem: list[dict], coll: list) -> None:
    """The view's title, model line, notes, metrics, the special cases and a deployment's GPUs."""
    m, spec = page.m, page.m.model
    gpus = len(lay.gpus) if lay else m.tp_size
    st.markdown(f"## {literal(spec.name)} on {gpus} GPU{'s' if gpus > 1 else ''}"
                + (f" · {lay.label}" if lay else ""))
    heads = (f"{spec.num_attention_heads} q heads, {spec.num_key_value_heads} KV heads × {spec.head_dim}"
             if not spec.is_mla else f"{spec.num_attention_heads} heads, MLA latent {spec.kv_lora_rank}")
    st.caption(f"{m.rules.label} rules · {spec.num_hidden_layers} layers · hidden {spec.hidden_size} · "
               f"{heads} · vocab {spec.vocab_size:,} · {literal(spec.dtype)}")
    if spec.quant:
        st.caption(f"Quantized checkpoint: {literal(spec.quant.label)}; weights and "
                   "scales are counted at the bytes they are stored in.")
    for note in spec.notes:
        st.caption(f"Note: {literal(note)}")
    for warning in lay.warnings if lay else m.warnings:  # a deployment's own: with EP the experts are whole
        st.warning(literal(warning))
    if m.checkpoint:
        (st.success if m.checkpoint["verified"] else st.warning)(literal(checkpoint_sentence(m.checkpoint)))
    worst = max(mem, key=lambda r: r["weights"])
    c1, c2, c3, c4 = st.columns(4)
    # the deployment's fullest GPU and busiest sender (tpviz.deploy.deployment), not the tensor-parallel map's
    if lay:  # the layout is in the heading above: each metric's note says what is its own
        heaviest = max(lay.gpus, key=lambda g: g.weight_bytes)
        c1.metric("Weights on the fullest GPU", fmt_bytes(heaviest.weight_bytes), f"GPU {heaviest.rank}",
                  delta_color="off", delta_arrow="off")
        full = max(lay.gpus, key=lambda g: g.kv_cache_bytes_per_token + g.kv_windowed_bytes_per_token)
        per_token = full.kv_cache_bytes_per_token + full.kv_windowed_bytes_per_token
        c2.metric("KV cache per token, fullest GPU", fmt_bytes(per_token),
                  f"GPU {full.rank}", delta_color="off", delta_arrow="off")
        c3.metric("Sent per decoded token, busiest GPU",
                  fmt_bytes(sum(lay.comm_bytes_per_token.values())) if lay.comm_bytes_per_token or not
                  # SGLang's DP gathers and EP sums: not guessed
                  lay.layout.carved else "not modelled")
    else:
        c1.metric("Weights per GPU", fmt_bytes(worst["weights"]), **versus(worst["weights"], worst["naive"]))
        # windowed layers cache each token too, up to their window (the cache sentences below give the caps)
        windowed = worst.get("kv_windowed_per_token", 0)
        c2.metric("KV cache per token per GPU", fmt_bytes(worst["kv_per_token"] + windowed),
                  **(dict(delta=f"{fmt_bytes(windowed)} of it up to a window",
                          delta_color="off", delta_arrow="off")
                     if windowed else versus(worst["kv_per_token"], worst["kv_naive_per_token"])))
        # as the Plan page and a layout count it: what each GPU sends (ring all-reduce 2(tp-1)/tp of the
        # tensor)
        c3.metric("Sent per decoded token, busiest GPU",
                  fmt_bytes(sum(c.count * c.sent_per_rank for c in coll)),
                  f"{sum(c.count for c in coll)} collectives per forward",
                  delta_color="off", delta_arrow="off")
    c4.metric(f"Valid tp sizes ({m.rules.label})", " ".join(map(str, S.valid_sizes(rows, m.rules))))
    layout = lay.layout if lay else None
    mla = S.mla_kv_sentence(m, layout)
    for sentence in filter(None, [*S.special_cases(m, layout).values(), mla, *S.cache_sentences(m)]):
        st.info(literal(sentence))  # tensor names carry '*': Markdown would set them in italics
    if absent := S.absent_cases(m, layout):
        st.caption(literal("Not in this view: " + "; ".join(absent) + "."))
    if line := other_engine(page.key[0], page.key[1], lay.layout if lay else Layout(m.tp_size), m.rules.name):
        # the same GPUs in the other engine, compared GPU by GPU
        st.caption(literal(f"{line[0].upper()}{line[1:]}."))
    if lay:
        deployment_section(lay, PLOTLY_CONFIG)

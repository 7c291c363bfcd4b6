"""Attention mixers: q/k/v (separate, or fused on disk in one of three orders), o_proj, MLA."""
from dataclasses import replace

import torch

from tpviz.config.kinds import Mixer
from tpviz.errors import TPSizeError
from tpviz.layers import ColumnParallelLinear, QKVParallelLinear
from tpviz.layers.norm import ShardedRMSNorm
from tpviz.plan.core import (DT, PROBE, ParamPlan, Source, column, merged, norm, param, replicated, row,
                             shared, stored)
from tpviz.plan.quantized import qplan
from tpviz.plan.indexer import indexer
from tpviz.archs.names import Names
from tpviz.config.spec import ModelSpec
from tpviz.rules import RuleSet


def per_head(h: int, kv: int, d: int):
    """GPT-NeoX / BLOOM store query_key_value per head as [h, (q, k, v), d]; load_weights regroups it to
    [q all heads | k | v] before the weight_loader, so each rank's rows come from every third head block."""
    def prepare(x: torch.Tensor) -> torch.Tensor:
        return x.reshape(h, 3, d, -1).transpose(0, 1).reshape((3 * h * d,) + x.shape[1:])
    return prepare


def per_kv_group(h: int, kv: int, d: int):
    """Falcon's new decoder architecture stores query_key_value per KV group as [kv, (q per kv, k, v), d]."""
    def prepare(x: torch.Tensor) -> torch.Tensor:
        g = x.reshape(kv, h // kv + 2, d, -1)
        q, k, v = g[:, :-2], g[:, -2:-1], g[:, -1:]
        return torch.cat([t.reshape((-1,) + x.shape[1:]) for t in (q, k, v)])
    return prepare


ORDERS = {"per_head": per_head, "per_kv_group": per_kv_group}


def qkv_sections(order: str, h: int, kv: int, d: int, qd: int, bias: str) -> list:
    """The labelled parts of a fused q/k/v tensor as it lies on disk."""
    if order == "per_kv_group_as_qkv":  # the rows as they lie on disk; the loader cuts them as qkv
        order = "per_kv_group"
    if order in ("per_head", "per_head_plain"):  # [q, k, v] of head 0, then of head 1, ...
        return [[f"{part}{bias} (head {i})", (3 * i + j) * d, (3 * i + j + 1) * d, 0, ""]
                for i in range(h) for j, part in enumerate("qkv")]
    if order == "per_kv_group":  # [q of its heads, k, v] of KV group 0, then of group 1, ...
        g = h // kv + 2
        return [[f"{part}{bias} (KV group {i})", (g * i + a) * d, (g * i + b) * d, 0, ""]
                for i in range(kv) for part, a, b in (("q", 0, g - 2), ("k", g - 2, g - 1), ("v", g - 1, g))]
    return [[f"q{bias}", 0, h * qd, qd, "q head"], [f"k{bias}", h * qd, h * qd + kv * d, d, "KV head"],
            [f"v{bias}", h * qd + kv * d, h * qd + 2 * kv * d, d, "KV head"]]


def qkv(spec: ModelSpec, names: Names, rules: RuleSet, m: Mixer, layers, bias: bool) -> list[ParamPlan]:
    """q, k and v of one attention group; with an output gate (Qwen3-Next) each q head is [q | gate]."""
    h, kv, d, hidden = m.heads, m.kv_heads, m.head_dim, spec.hidden_size
    qh = h * (2 if m.output_gate else 1)  # vLLM builds the gated q as twice the heads
    qd = d * (2 if m.output_gate else 1)  # rows per real q head
    p = f"{names.layer}{names.attn}"
    q = qplan(spec, rules, f"{p}{names.qkv_fused or names.q}", layers)
    if q is not None and names.qkv_order in ("qkv", "per_kv_group_as_qkv") and not m.k_eq_v:
        make = lambda ctx, tp, r: QKVParallelLinear(PROBE, d, qh, kv, tp, r, rules=rules, dtype=DT, quant=ctx)
        # Phi-3: one tensor
        parts = ([(f"{p}{names.qkv_fused}", (qh + 2 * kv) * d, None)] if names.qkv_fused else
                 [(f"{p}{n}", (h * qd if sid == "q" else kv * d), sid)
                  for sid, n in zip("qkv", (names.q, names.k, names.v))])
        plans = stored(q, False, make, parts, (qh + 2 * kv) * d, hidden, "qkv",
                       f"{p}{names.qkv_fused or 'qkv_proj'}", slots=3, layers=layers, heads=h,
                       sections=qkv_sections(names.qkv_order, h, kv, d, qd, "") if names.qkv_fused else None)
        return plans + ([pl for pl in qkv(replace(spec, quant=None), names, rules, m, layers, bias) if
                         pl.name.endswith(".bias")] if bias else [])
    plans = []
    # Transformers backend (GPT-NeoX): a plain row split, no reorder
    plain = names.qkv_order == "per_head_plain"
    layer = shared(lambda tp, r: ColumnParallelLinear(PROBE, 3 * h * d, tp, r, bias=bias, dtype=DT) if plain
                   else QKVParallelLinear(PROBE, d, qh, kv, tp, r, bias=bias, rules=rules, dtype=DT))
    for suffix in ("weight", "bias") if bias else ("weight",):
        def build(tp, r, s=suffix):
            mod = layer(tp, r)
            return mod, getattr(mod, s)
        tail = (hidden,) if suffix == "weight" else ()
        rows = (qh + 2 * kv) * d
        b = " bias" if suffix == "bias" else ""
        if names.qkv_fused:
            order = names.qkv_order
            sec = qkv_sections(order, h, kv, d, qd, b)
            prepare = ORDERS[order](h, kv, d) if order in ORDERS else None
            if names.conv1d and suffix == "weight":  # stored [hidden, 3*hidden]: transpose, then load
                sources = [Source(f"{p}{names.qkv_fused}.{suffix}", tail + (rows,), None,
                                  dim=1, prepare=torch.t, sections=sec)]
            else:
                sources = [Source(f"{p}{names.qkv_fused}.{suffix}", (rows,) + tail, None,
                                  prepare=prepare, sections=sec)]
        else:
            sources = [Source(f"{p}{n}.{suffix}", ((h * qd if sid == "q" else kv * d),) + tail, sid,
                              sections=[s for s in qkv_sections("qkv", h, kv, d, qd, b) if s[0][0] == sid])
                       for sid, n in zip("qkv", (names.q, names.k, names.v))]
            if m.k_eq_v:  # Gemma-4 global layers: k_proj fills both the K and the V slots
                sources = sources[:2]
                sources[1].shard_id = ["k", "v"]
                sources[1].sections = [[f"k = v{b}", 0, kv * d, d, "KV head"]]
            for src in sources:  # sections of a separate tensor start at its own row 0
                src.sections = [[lab, 0, b_ - a, hs, w] for lab, a, b_, hs, w in src.sections]
        param_name = f"{p}{names.qkv_fused or 'qkv_proj'}.{suffix}"
        plans.append(param(param_name, "qkv", build, (rows,) + tail, sources, layers=layers, heads=h))
    return plans


def attention(spec: ModelSpec, names: Names, rules: RuleSet, m: Mixer, layers) -> list[ParamPlan]:
    """A softmax-attention mixer: q/k/v, optional q/k norms, o_proj, gpt-oss sinks."""
    p = f"{names.layer}{names.attn}"
    if m.q_rank:
        return low_rank_q(spec, names, rules, m, layers)
    if m.kv_shared:  # Gemma-4: q_proj alone (column-parallel); K and V come from an earlier layer's cache
        plans = column(f"{p}{names.q}", spec.hidden_size, m.heads * m.head_dim, "qkv", layers,
                       spec.attention_bias, ("num_attention_heads", m.heads), heads=m.heads,
                       q=qplan(spec, rules, f"{p}{names.q}", layers))
    else:
        plans = qkv(spec, names, rules, m, layers, spec.attention_bias)
    if m.head_gate:  # Step-3.5's g_proj: one row per head, cut with the heads (ColumnParallelLinear)
        plans += column(f"{p}g_proj", spec.hidden_size, m.heads, "qkv", layers, False,
                        ("num_attention_heads", m.heads), heads=m.heads,
                        q=qplan(spec, rules, f"{p}g_proj", layers))
    if rules.regroups_qkv(spec.arch):
        for pl in plans:
            pl.build = no_kv_replicas(pl.build, m.kv_heads, REGROUPED)
    # per head; OLMo-2/3's span the whole q and k (replicated, fed by an all-gather under TP)
    if spec.arch.qk_norm == "tp":  # MiniMax-M2: over the whole q and k, each GPU holds its own rows' slice
        plans += sharded_qk_norms(names, m, layers)
    elif spec.qk_norm:
        widths = (m.heads * m.head_dim, m.kv_heads * m.head_dim) if spec.qk_norm_full else (m.head_dim,) * 2
        norms = [pl for n, w in zip((names.q_norm, names.k_norm)[:2 - m.kv_shared], widths)
                 for pl in norm(f"{p}{n}", w, layers)]
        if spec.qk_norm_full:
            norms[-1].build = no_kv_replicas(norms[-1].build, m.kv_heads, FULL_K_NORM)
        plans += norms
    plans += row(f"{p}{names.o}", m.heads * m.head_dim, spec.hidden_size, "o_proj", layers, spec.o_proj_bias,
                 ("num_attention_heads", m.heads), disk_t=names.conv1d,
                 q=qplan(spec, rules, f"{p}{names.o}", layers))
    if "sinks" in spec.arch.extra:  # gpt-oss: one attention-sink logit per head, split with the heads
        sink = column(f"{p}sinks", PROBE, m.heads, "qkv", layers, True, ("num_attention_heads", m.heads))[1]
        sink.name = sink.sources[0].name = f"{p}sinks"
        plans.append(sink)
    return plans


def sharded_qk_norms(names: Names, m: Mixer, layers) -> list[ParamPlan]:
    """q_norm cut over tp like q's rows; k_norm over tp, or over the KV heads when they are fewer (each GPU
    then holds its replicated head's slice), as vLLM 0.33's MiniMaxText01RMSNormTP weight_loader cuts them."""
    p, out = f"{names.layer}{names.attn}", []
    for n, heads, quantity in ((names.q_norm, m.heads, "num_attention_heads"),
                               (names.k_norm, m.kv_heads, "num_key_value_heads")):
        size = heads * m.head_dim

        def build(tp, r, heads=heads, size=size):
            shards = tp if heads >= tp else heads
            if heads % shards or (heads < tp and tp % heads):
                raise TPSizeError(f"{quantity}={heads} and tp_size={tp}: neither divides the other",
                                  quantity, heads, tp)
            module = ShardedRMSNorm(size, shards, r if heads >= tp else r // (tp // heads), dtype=DT)
            return module, module.weight
        name = f"{p}{n}.weight"
        word = "KV head" if n == names.k_norm else "q head"
        sections = [[n.removesuffix("_norm"), 0, size, m.head_dim, word]]
        out.append(param(name, "qkv", build, (size,), [Source(name, (size,), sections=sections)],
                         layers=layers, quantity=(quantity, heads),
                         note="RMSNorm over the whole projection: each GPU normalises its slice and "
                              "all-reduces the per-token variance"))
    return out


FULL_K_NORM = ("k_norm spans all KV heads and vLLM 0.33 all-gathers k to apply it, which fails when KV heads "
               "are replicated")  # a TP-aware RMSNorm: the ranks' k slices must tile the whole k
REGROUPED = ("InternLM2's split_qkv all-gathers q/k/v and cuts it again by KV group, which fails when KV "
             "heads are replicated (vLLM 0.33 internlm2.py)")


def no_kv_replicas(build, kv_heads: int, why: str):
    """A build that refuses a tp replicating KV heads, for a forward that all-gathers k (why says how)."""
    def checked(tp, rank):
        if tp > kv_heads:
            raise TPSizeError(f"num_key_value_heads={kv_heads} is fewer than tp_size={tp}: {why}")
        return build(tp, rank)
    return checked


def _list(plan) -> list[ParamPlan]:
    return plan if isinstance(plan, list) else [plan]


def mla(spec: ModelSpec, names: Names, rules: RuleSet, m: Mixer, layers) -> list[ParamPlan]:
    """DeepSeek multi-head latent attention: the latent down-projections are replicated, the per-head
    up-projections column-split, o_proj row-split (as vLLM does)."""
    p, hidden, h = f"{names.layer}{names.attn}", spec.hidden_size, m.heads
    qk, heads = spec.qk_nope_head_dim + spec.qk_rope_head_dim, ("num_attention_heads", h)
    plans, latent = [], spec.kv_lora_rank + spec.qk_rope_head_dim
    kv_note = "MLA latent: every rank computes and caches the compressed KV"
    if spec.arch.mla_as_attention:
        kv_note = "MLA latent: every rank computes it whole; the cache holds each head's K and V instead"
    own = rules.mla_fused_a(spec.arch)
    if spec.q_lora_rank and not own and not spec.arch.mla_as_attention:
        # vLLM loads both latents into one merged table built as tp 1, kv from row q_lora_rank
        plans += merged(f"{p}fused_qkv_a_proj", [f"{p}q_a_proj", f"{p}kv_a_proj_with_mqa"], None, hidden,
                        [spec.q_lora_rank, latent], "replicated", layers, None, whole=True,
                        note=kv_note + " (q_a_proj and kv_a_proj_with_mqa in one table)",
                        q=qplan(spec, rules, f"{p}q_a_proj", layers))
    else:
        if spec.q_lora_rank and own:  # SGLang loads both into one ReplicatedLinear
            kv_note += f"; loaded after q_a_proj's {spec.q_lora_rank} rows into one ReplicatedLinear, {own}"
        if spec.q_lora_rank:  # SGLang, or two ReplicatedLinears (MiniCPM3)
            plans += _list(replicated(f"{p}q_a_proj.weight", spec.q_lora_rank, hidden, layers,
                                      q=qplan(spec, rules, f"{p}q_a_proj", layers)))
        plans += _list(replicated(f"{p}kv_a_proj_with_mqa.weight", latent, hidden, layers, note=kv_note,
                                  q=qplan(spec, rules, f"{p}kv_a_proj_with_mqa", layers)))
    if spec.q_lora_rank:
        plans += [*norm(f"{p}q_a_layernorm", spec.q_lora_rank, layers),
                  *column(f"{p}q_b_proj", spec.q_lora_rank, h * qk, "qkv", layers, False, heads, heads=h,
                          q=qplan(spec, rules, f"{p}q_b_proj", layers))]
    else:
        plans += column(f"{p}q_proj", hidden, h * qk, "qkv", layers, False, heads, heads=h,
                        q=qplan(spec, rules, f"{p}q_proj", layers))
    plans += norm(f"{p}kv_a_layernorm", spec.kv_lora_rank, layers)
    plans += column(f"{p}kv_b_proj", spec.kv_lora_rank, h * (spec.qk_nope_head_dim + spec.v_head_dim), "qkv",
                    layers, False, heads, heads=h, q=qplan(spec, rules, f"{p}kv_b_proj", layers))
    plans += row(f"{p}o_proj", h * spec.v_head_dim, hidden, "o_proj", layers, False, heads, heads=h,
                 q=qplan(spec, rules, f"{p}o_proj", layers))
    if m.index_heads:  # DeepSeek Sparse Attention: the lightning indexer beside MLA
        plans += indexer(spec, names, rules, m, layers)
    return plans


def low_rank_q(spec: ModelSpec, names: Names, rules: RuleSet, m: Mixer, layers) -> list[ParamPlan]:
    """Step3's attention (vLLM 0.33 step3_text.py): q_proj (to the low-rank width), k_proj and v_proj (one
    head each) load into one ReplicatedLinear, qkv_proj, whole on every GPU; inter_norm over the low-rank q,
    whole; wq makes the heads from it (column-parallel) and o_proj takes them back (row-parallel)."""
    p, hidden, d, heads = f"{names.layer}{names.attn}", spec.hidden_size, m.head_dim, ("num_attention_heads",
                                                                                       m.heads)
    plans = merged(f"{p}qkv_proj", [f"{p}{n}" for n in (names.q, names.k, names.v)], None, hidden,
                   [m.q_rank, m.kv_heads * d, m.kv_heads * d], "replicated", layers, None, whole=True,
                   labels=("q", "k", "v"), q=qplan(spec, rules, f"{p}{names.q}", layers),
                   note="one K/V head: every GPU computes and caches it")
    plans += norm(f"{p}inter_norm", m.q_rank, layers)
    plans += column(f"{p}wq", m.q_rank, m.heads * d, "qkv", layers, False, heads, heads=m.heads,
                    q=qplan(spec, rules, f"{p}wq", layers))
    plans += row(f"{p}{names.o}", m.heads * d, hidden, "o_proj", layers, False, heads,
                 q=qplan(spec, rules, f"{p}{names.o}", layers))
    return plans

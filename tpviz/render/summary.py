"""Pure numbers and sentences derived from a ShardMap: memory per rank, collectives, valid tp, the special
cases.

Everything here reads the shard map (or the valid-tp rows) only, so the app, the plots and the tests agree.
"""
from tpviz.config.indexer import indexer_cache_bytes
from tpviz.render.text import fmt_bytes
from tpviz.rules import RuleSet
from tpviz.trace.validity import ValidRow
from tpviz.trace.shardmap import FAMILIES, ShardMap, in_group

MAX_TP = 64  # the explorer offers tp 1..64
FAMILY_LABELS = {"qkv": "q/k/v", "o_proj": "o_proj", "gate_up": "gate/up", "down_proj": "down_proj",
                 "linear_attn": "Gated DeltaNet", "mamba": "Mamba2", "mamba1": "Mamba1", "conv": "short conv",
                 "kda": "Kimi Delta Attention",
                 "experts": "MoE experts", "vision": "vision tower", "audio": "audio tower",
                 "embed": "embed_tokens",
                 "lm_head": "lm_head",
                 "replicated": "replicated (norms, biases, routers)"}


def short_name(name: str) -> str:
    """A checkpoint name without the per-layer prefix: 'model.layers.*.self_attn.q_proj.weight' ->
    'self_attn.q_proj.weight'."""
    # everything up to the layer wildcard: model.layers.*., transformer.h.*.
    for marker in ("layers.*.", "h.*."):
        if name.startswith(marker) or f".{marker}" in name:
            return name.split(marker, 1)[1]
    for prefix in ("model.", "transformer.", "backbone.", "gpt_neox."):
        if name.startswith(prefix):
            return name[len(prefix):]
    return name


def families_present(m: ShardMap, group=None) -> list[str]:
    """The matrix families this model has (in one layer group), in display order; a tensor whole on every GPU
    (SGLang's attention at one GPU per attention group) is drawn with the replicated ones."""
    mine, whole = [t for t in m.tensors if in_group(t, group)], whole_towers(m, group)
    have = {t.family if t.split_dim is not None or t.family in whole else "replicated" for t in mine}
    return [f for f in FAMILIES if f in have]


def whole_towers(m: ShardMap, group=None) -> set[str]:
    """The tower families no GPU cuts (an audio tower; a vision tower under --mm-encoder-tp-mode data): drawn
    whole in a tab of their own, not among the replicated norms and biases."""
    mine = [t for t in m.tensors if t.tower and in_group(t, group)]
    return {t.family for t in mine} - {t.family for t in mine if t.split_dim is not None}


def naive_bytes_per_rank(m: ShardMap) -> float:
    """What calculators assume: the whole model divided evenly by tp."""
    return m.total_weight_bytes / m.tp_size


def memory_rows(m: ShardMap) -> list[dict]:
    """Per rank: weight bytes by family, total, naive total/tp, the difference, KV-cache bytes per token (full
    layers; and windowed layers' apart, when there are some)."""
    naive = naive_bytes_per_rank(m)
    kv_total = kv_cache_total_per_token(m)
    rows = []
    for r in m.ranks:
        row = {"rank": r.rank}
        row.update({f: r.weight_bytes_by_family.get(f, 0) for f in families_present(m)})
        row.update(weights=r.weight_bytes, naive=naive, overhead=r.weight_bytes - naive,
                   kv_per_token=r.kv_cache_bytes_per_token, kv_naive_per_token=kv_total / m.tp_size)
        if any(x.kv_cache_windowed for x in m.ranks):  # windowed layers cache a token too, up to their window
            row["kv_windowed_per_token"] = sum(w["bytes_per_token"] for w in r.kv_cache_windowed)
        rows.append(row)
    return rows


def kv_cache_total_per_token(m: ShardMap) -> int:
    """KV-cache bytes per token of the unsplit model (tp=1), full-attention and MLA layers only."""
    spec, b, total = m.model, m.kv_bytes, 0
    for g in m.groups:
        kind = g.mixer["kind"]
        if kind == "mla" and spec.latent_cache:  # MLA caches one latent + rope key per token, not per head
            total += (spec.kv_lora_rank + spec.qk_rope_head_dim) * len(g.layers) * b
            total += indexer_cache_bytes(g.mixer.get("index_dim", 0)) * len(g.layers)  # DSA's index keys
        elif kind == "mla":  # MiniCPM3: every head's K and V (V padded to the q/k head)
            total += 2 * g.mixer["heads"] * g.mixer["head_dim"] * len(g.layers) * b
        elif kind == "attention":
            total += 2 * g.mixer["kv_heads"] * g.mixer["head_dim"] * len(g.layers) * b
    return total


def cache_sentences(m: ShardMap) -> list[str]:
    """One sentence each on windowed KV caches and recurrent state, when the model has them (numbers per
    GPU)."""
    r = max(m.ranks, key=lambda x: x.cache_bytes(1 << 20))
    out = []
    for w in r.kv_cache_windowed:
        word = "sliding-window" if w["kind"] == "sliding_attention" else "chunked-attention"
        out.append(f"{w['layers']} {word} layers cache at most {w['window']:,} tokens: "
                   f"{fmt_bytes(w['bytes_per_token'])} per token per GPU up to the window, capped at "
                   f"{fmt_bytes(w['bytes_per_token'] * w['window'])} per sequence per GPU.")
    if r.state_bytes_per_sequence:
        stateful = ("gated_deltanet", "mamba1", "mamba2", "kda", "short_conv")
        # a Mamba2 beside attention (Falcon-H1) is named alone: "full attention ‖ Mamba2" -> "Mamba2"
        kinds = sorted({g.label.split(" + ")[0].split(" ‖ ")[-1] for g in m.groups
                        if g.mixer["kind"] in stateful
                        or (g.mixer.get("beside") or {}).get("kind") in stateful})
        out.append(f"{' and '.join(kinds)} layers keep a fixed state instead of a KV cache: "
                   f"{fmt_bytes(r.state_bytes_per_sequence)} per sequence per GPU (conv and recurrent state, "
                   "split by heads as vLLM splits it), whatever the context length.")
    return out


def valid_sizes(rows: list[ValidRow], rules: RuleSet | str) -> list[int]:
    """The tp sizes that work under these rules."""
    return [row.tp for row in rows if row.valid(rules)]


def tp_problem(rows: list[ValidRow], tp: int, rules: str) -> str | None:
    """None if tp is valid under rules, else the failing rule (out-of-range tp is a problem too)."""
    for row in rows:
        if row.tp == tp:
            return row.problem(rules)
    return f"tp={tp} is outside 1..{len(rows)}"


def kv_sharing(m: ShardMap) -> dict[int, list[int]]:
    """Global KV head -> the ranks holding it (more than one rank when vLLM replicates KV heads)."""
    holders: dict[int, list[int]] = {}
    for r in m.ranks:
        for head in r.kv_heads:
            holders.setdefault(head, []).append(r.rank)
    return holders


def layer_span(layers: list[int], most: int = 8) -> str:
    """'0–3, 5, 7, …' for a list of layer indices: runs collapsed, long lists cut."""
    runs, start = [], None
    for i, x in enumerate(layers):
        if start is None:
            start = x
        if i + 1 == len(layers) or layers[i + 1] != x + 1:
            runs.append(f"{start}" if start == x else f"{start}–{x}")
            start = None
    return ", ".join(runs[:most]) + (", …" if len(runs) > most else "")


def _span(ranks: list[int]) -> str:
    return f"GPU {ranks[0]}" if len(ranks) == 1 else (
        f"GPUs {ranks[0]}–{ranks[-1]}" if ranks == list(range(ranks[0], ranks[-1] + 1)) else
        "GPUs " + ", ".join(map(str, ranks)))


def attn_group(m: ShardMap, layout=None) -> int:
    """The GPUs attention is cut over: tp, or under SGLang's attention DP (`layout`) one attention group."""
    return m.tp_size // layout.attn_dp if layout is not None and layout.attn_dp > 1 else m.tp_size


def kv_sentence(m: ShardMap, layout=None) -> str | None:
    """One sentence on replicated KV heads, or None when every KV head lives on one rank (of an attention
    group, under SGLang's attention DP: the groups serve different sequences, so theirs are no copies)."""
    group = attn_group(m, layout)
    # the first group's GPUs (ranks 0..group-1): every group holds the same heads
    share = {h: [r for r in ranks if r < group] for h, ranks in kv_sharing(m).items()}
    if not share or all(len(r) <= 1 for r in share.values()):
        # the first attention group splits its KV heads; a later one with fewer (Gemma-4's full layers) may
        # not
        fewer = next((g for g in m.groups if g.mixer.get("kind") == "attention"
                      and 0 < g.mixer.get("kv_heads", m.tp_size) < m.tp_size), None)
        if fewer is None or m.model.is_mla or group < m.tp_size:
            return None
        kv, heads = fewer.mixer["kv_heads"], fewer.mixer.get("heads", m.model.num_attention_heads)
        return (f"Replicated KV heads: the {fewer.label.split(' + ')[0]} layers have {kv} KV "
                f"head{'s' if kv != 1 else ''} on {m.tp_size} GPUs, so {m.rules.engine} copies each KV head "
                f"to {m.tp_size // kv} GPUs while their {heads} query heads still split "
                f"{heads // m.tp_size} per GPU.")
    kv, per, heads = len(share), len(next(iter(share.values()))), m.model.num_attention_heads
    first = "; ".join(f"head {h} on {_span(r)}" for h, r in list(share.items())[:2])
    on, of, still = (f"{m.tp_size} GPUs", "", "still ") if group == m.tp_size else (
        f"each attention group of {group} GPUs (attention DP {layout.attn_dp})", " of its group", "")
    return (f"Replicated KV heads: {kv} KV head{'s' if kv != 1 else ''} on {on}, so {m.rules.engine} copies "
            f"each KV head to {per} GPUs{of} ({first}{'; …' if kv > 2 else ''}) while the {heads} query "
            f"heads {still}split {heads // group} per GPU.")


def padding_sentence(m: ShardMap) -> str | None:
    """One sentence on the vocabulary's padding rows (the embedding and lm_head alone), or None when there are
    none."""
    padded = [p for p in m.params if p.family in ("embed", "lm_head") and p.split_dim is not None
              and any(p.padding)]
    if not padded:
        return None
    p = padded[0]
    rows = p.local_shapes[0][0]
    where = ", ".join(f"{n} on GPU {r}" for r, n in enumerate(p.padding) if n)
    names = " and ".join(short_name(q.name).split(".")[0] for q in padded)
    return (f"Vocab padding: {m.rules.label} pads the vocabulary {m.model.vocab_size} → "
            f"{rows * m.tp_size} so it splits into {m.tp_size} × {rows} rows; the padding rows of {names} "
            f"({where}) are zeros that are never loaded and whose logits are dropped.")


def expert_padding_sentence(m: ShardMap) -> str | None:
    """One sentence on rows a quantized layer allocates beyond what it loads (MXFP4's whole 32-row blocks, FP8
    scale rows), naming the tensors and GPUs; None when there are none."""
    # split ones only: a replicated row-parallel bias that only GPU 0 loads is the bias sentence's
    padded = [p for p in m.params if p.family not in ("embed", "lm_head") and p.split_dim is not None
              and any(p.padding)]
    if not padded:
        return None
    names = ", ".join(dict.fromkeys(short_name(p.name) for p in padded))
    p = padded[0]
    where = ", ".join(f"{n} on GPU {r}" for r, n in enumerate(p.padding) if n)
    return (f"Allocation padding: {names} allocate more rows per GPU than they load (whole quantization "
            f"blocks); in {short_name(p.name)}, {where} are zeros never loaded.")


def row_bias_params(m: ShardMap) -> list[str]:
    """Names of row-parallel biases: held whole by every rank, added by rank 0 only."""
    # a row-parallel layer's other whole parameters (NVFP4's weight_scale_2 and input_scale) are no biases
    return [p.name for p in m.params if p.layer_class == "RowParallelLinear" and p.split_dim is None
            and p.name.endswith(".bias")]


def bias_sentence(m: ShardMap) -> str | None:
    """One sentence on row-parallel biases, or None when the model has none."""
    names = row_bias_params(m)
    if not names:
        return None
    # a tower's keep their prefix: Llama-4's vision o_proj.bias is not the decoder's
    towers = {p.name for p in m.params if p.tower}
    shown = " and ".join(n if n in towers else short_name(n) for n in names)
    verb = "is" if len(names) == 1 else "are"
    return (f"Row-parallel bias: {shown} {verb} held whole by all {m.tp_size} GPUs but added on GPU 0 only, "
            "so the all-reduce that sums the partial outputs counts "
            f"{'it' if len(names) == 1 else 'each'} exactly once.")


def mla_kv_sentence(m: ShardMap, layout=None) -> str | None:
    """One sentence on why an MLA model's KV cache does not shrink with tp, or None (not MLA, or tp=1); under
    SGLang's attention DP (`layout`), the latent is copied over an attention group alone."""
    spec = m.model
    if not spec.latent_cache or m.tp_size == 1:
        return None
    per_gpu = max(r.kv_cache_bytes_per_token for r in m.ranks)
    head = (f"MLA KV cache: each token caches one latent of {spec.kv_lora_rank} + {spec.qk_rope_head_dim} "
            f"values per layer, shared by all {spec.num_attention_heads} heads")
    size = f"{fmt_bytes(per_gpu)} per token per GPU with all layers"
    dp = layout.attn_dp if layout is not None else 1
    if dp > 1:  # each attention group serves its own sequences
        group = m.tp_size // dp
        where = "each GPU keeps the latents of its own sequences" if group == 1 else (
            f"each attention group of {group} GPUs keeps the whole latent cache of its own sequences on "
            "every one of them")
        return f"{head}; with attention DP {dp}, {where} ({size})."
    return (f"{head}, so {m.rules.engine} keeps the whole latent cache on each of the {m.tp_size} "
            f"tensor-parallel GPUs ({size}, not 1/{m.tp_size}).")


def special_cases(m: ShardMap, layout=None) -> dict[str, str | None]:
    """The three cases drawn explicitly: case -> its sentence, or None when absent from this model at this
    tp (and SGLang layout)."""
    return {"kv": kv_sentence(m, layout), "padding": padding_sentence(m), "bias": bias_sentence(m),
            "allocation": expert_padding_sentence(m)}


def absent_cases(m: ShardMap, layout=None) -> list[str]:
    """Short reasons why a special case does not occur here (teaches when it would)."""
    cases, out = special_cases(m, layout), []
    if cases["kv"] is None:
        group = attn_group(m, layout)
        cut = f"tp={m.tp_size}" if group == m.tp_size else f"attn_tp={group}"
        out.append("no replicated KV heads (MLA caches a shared latent)" if m.model.latent_cache else
                   f"no replicated KV heads ({cut} ≤ {m.model.num_key_value_heads} KV heads)")
    if cases["padding"] is None:
        vocab = m.model.vocab_size
        out.append(f"no vocab padding ({m.rules.label} never pads; vocab {vocab} splits evenly)"
                   if not m.rules.vocab_padding
                   else f"no vocab padding rows (vocab {vocab} is already a multiple of "
                        "64 and splits evenly)")
    if cases["bias"] is None:
        out.append("no row-parallel biases (o_proj / down_proj have no bias)")
    return out

"""What each rank caches, read off the traced k rows: KV bytes per token per layer (windowed layers apart),
the KV heads it holds, and the recurrent state of stateful mixers."""
from tpviz.config.kinds import ATTENTION_KINDS
from tpviz.config.spec import DTYPE_BYTES, ModelSpec
from tpviz.config.indexer import indexer_cache_bytes
from tpviz.plan import mixer_groups, state_plans
from tpviz.trace.shardmap import TensorMap, numel


def kv_heads_held(tensors: list[TensorMap], layers: list[int], d: int, rank: int,
                  k_rows: tuple[int, int] | None = None) -> list[int]:
    """Which global KV heads a rank holds in one attention group, read off the loaded k rows; k_rows: where
    the loader reads k in a fused tensor whose disk order it ignores (InternLM2, whose forward gathers q/k/v
    and cuts them again as the loader did)."""
    ks = [t for t in tensors if t.family == "qkv" and set(t.layers or ()) & set(layers)
          and not t.name.endswith("bias") and (t.shard_id == "k"
                                               or (isinstance(t.shard_id, list) and "k" in t.shard_id)
                                               or (t.shard_id is None
                                                   and any(s[0].split(" ")[0] == "k" for s in t.sections)))]
    # split ones first; attention whole on every rank (SGLang's attn_tp 1) holds every KV head, traced along
    # dim 0 (tracer.spread)
    ks = [t for t in ks if t.split_dim is not None] or [t for t in ks if t.split_dim is None]
    # the k tensor in whole output rows: quantized layers also store scales, and AWQ packs the rows 8 to an
    # int32
    k = max(ks, key=lambda t: t.shape[t.split_dim or 0])
    if k.shard_id is not None:  # a separate k tensor ("k", or ["k", "v"] when it also fills V)
        return _kv_in(k, rank, 0, k.shape[k.split_dim or 0], d)
    # fused on disk: the k sections the plan declares (one [k] block, or one per head / KV group)
    if k_rows is not None:
        return _kv_in(k, rank, *k_rows, d)
    ks = [s for s in k.sections if s[0].split(" ")[0] == "k"]
    if len(ks) == 1:
        return _kv_in(k, rank, ks[0][1], ks[0][2], d)
    pieces = k.rank_pieces(rank)
    return [i for i, s in enumerate(ks) if any(p.start < s[2] and s[1] < p.stop for p in pieces)]


def heads_held(tensors: list[TensorMap], layers: list[int], rank: int, heads: int) -> int:
    """How many of an MLA group's heads a rank holds, read off its share of kv_b_proj's head rows."""
    kv_b = max((t for t in tensors if t.name.endswith("kv_b_proj.weight") and t.split_dim is not None
                and set(t.layers or ()) & set(layers)), key=lambda t: t.shape[t.split_dim])
    rows = sum(p.stop - p.start for p in kv_b.rank_pieces(rank))
    return heads * rows // kv_b.shape[kv_b.split_dim]


def _kv_in(k: TensorMap, rank: int, first: int, last: int, d: int) -> list[int]:
    rows = [(max(p.start, first), min(p.stop, last)) for p in k.rank_pieces(rank)]
    return sorted({(row - first) // d for a, b in rows if a < b for row in range(a, b, d)})


def layer_caches(spec: ModelSpec, tensors: list[TensorMap], rank: int,
                 regrouped: bool | None = None) -> tuple[dict[int, tuple[int, int]], list]:
    """Per attention layer on this rank: (KV bytes per token, window or 0), and the first group's KV heads."""
    b, out, heads_seen = spec.kv_bytes, {}, None
    regrouped = spec.arch.regroups_qkv if regrouped is None else regrouped
    for mixer, layers in mixer_groups(spec).items():
        if mixer.kind == "mla" and spec.arch.mla_as_attention:  # MiniCPM3: its heads' K and V, V padded
            held = heads_held(tensors, layers, rank, mixer.heads)
            out.update({i: (2 * held * mixer.head_dim * b, 0) for i in layers})
        elif mixer.kind == "mla":  # the compressed latent and rope key are cached whole on every rank
            # with DeepSeek Sparse Attention's own index keys, whole on every rank too
            latent = (spec.kv_lora_rank + spec.qk_rope_head_dim) * b + indexer_cache_bytes(mixer.index_dim)
            out.update({i: (latent, 0) for i in layers})
        elif mixer.q_rank:  # Step3: k and v lie in the replicated qkv_proj, so every GPU caches them all
            heads_seen = list(range(mixer.kv_heads)) if heads_seen is None else heads_seen
            out.update({i: (2 * mixer.kv_heads * mixer.head_dim * b, spec.layers[i].mixer.window)
                        for i in layers})
        elif mixer.kind in ATTENTION_KINDS and not mixer.kv_shared:  # a KV-shared layer owns no cache
            q_rows = mixer.heads * mixer.head_dim
            k_rows = (q_rows, q_rows + mixer.kv_heads * mixer.head_dim) if regrouped else None
            heads = kv_heads_held(tensors, layers, mixer.head_dim, rank, k_rows)
            heads_seen = heads if heads_seen is None else heads_seen
            out.update({i: (2 * len(heads) * mixer.head_dim * b,
                            spec.layers[i].mixer.window) for i in layers})
    return out, heads_seen or []


def rank_caches(spec: ModelSpec, tensors: list[TensorMap], rank: int,
                regrouped: bool | None = None) -> tuple[int, list[dict], list[int]]:
    """Per rank: KV bytes per token of unbounded layers, the windowed layers' entries, and the KV heads
    held (regrouped: whether the loaded k rows lie where a regrouping forward reads them, as layer_caches)."""
    per_layer, heads = layer_caches(spec, tensors, rank, regrouped)
    per_token, windowed = 0, {}
    for i, (size, window) in per_layer.items():
        if not window:
            per_token += size
        else:
            key = (spec.layers[i].mixer.kind, window)
            windowed[key] = windowed.get(key, 0) + size
    entries = [{"kind": kind, "window": w,
                "layers": sum(1 for x in spec.layers if (x.mixer.kind, x.mixer.window) == (kind, w)
                              and not x.mixer.kv_shared), "bytes_per_token": v}
               for (kind, w), v in windowed.items()]
    return per_token, entries, heads


def kv_sources(spec: ModelSpec) -> dict[int, int]:
    """Each KV-shared layer and the layer whose cache it reads: the last earlier layer of its kind that owns
    one (vLLM 0.33 Gemma4Attention)."""
    owners = [i for i, layer in enumerate(spec.layers)
              if layer.mixer.is_attention and not layer.mixer.kv_shared]
    return {i: max(j for j in owners if j < i and spec.layers[j].mixer.kind == layer.mixer.kind)
            for i, layer in enumerate(spec.layers) if layer.mixer.kv_shared}


def state_bytes(spec: ModelSpec, tp_size: int) -> int:
    """Recurrent state per sequence on each rank, from the stateful layers' own state shapes, read on rank 0:
    every mixer's state_shapes divides by tp, never by rank."""
    # Nemotron-H keeps its SSM state in float32
    ssm_bytes = DTYPE_BYTES.get(spec.state_dtype, spec.dtype_bytes)
    total = 0
    for layers, build in state_plans(spec):
        conv, *ssm = build(tp_size, 0).state_shapes()
        total += (numel(conv) * spec.dtype_bytes + sum(numel(s) for s in ssm) * ssm_bytes) * len(layers)
    return total

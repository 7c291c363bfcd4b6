"""Config readers: each turns one source of per-layer information into the list of LayerSpecs.

The readers follow the HF configs as vLLM 0.33 reads them (models/<arch>.py); an unknown combination
is refused with one line naming the field.
"""
from dataclasses import replace

from tpviz.archs import Arch
from tpviz.config.fields import read_int
from tpviz.config.indexer import with_indexers
from tpviz.config.kinds import Ffn, LayerSpec, Mixer, index_list, layer_list, per_layer
from tpviz.config.windows import model_wide_kinds
from tpviz.errors import ConfigError

LAYER_TYPES = {"full_attention": "attention", "attention": "attention",
               "sliding_attention": "sliding_attention",
               "chunked_attention": "chunked_attention", "linear_attention": "gated_deltanet",
               "conv": "short_conv", "mamba": "mamba2", "kda": "kda", "mamba1": "mamba1",
               "parallel_hybrid": "parallel_hybrid"}  # Falcon-H1: attention and Mamba2 side by side
HYBRID_HINTS = ("ssm_cfg", "mamba_d_state", "mamba_expand", "ssm_state_size", "attn_type_list",
                "attn_layer_period", "linear_attn_config", "conv_L_cache", "linear_num_key_heads",
                "hybrid_override_pattern", "block_configs", "layer_types", "mamba_num_heads")


def _mixers(cfg: dict, arch: Arch, n: int, attn: Mixer) -> list[Mixer]:
    """Each layer's mixer: full attention unless a per-layer field says otherwise."""
    window = cfg.get("sliding_window") if isinstance(cfg.get("sliding_window"), int) else 0
    sliding = replace(attn, kind="sliding_attention", window=window) if window else None
    # Step-3.5: sliding layers with a head count of their own (transformers' Step3p7TextConfig)
    if sliding and cfg.get("num_sliding_attention_heads") not in (None, attn.heads):
        sliding = replace(sliding, heads=read_int(cfg, "num_sliding_attention_heads"))
        if sliding.heads % attn.kv_heads:
            raise ConfigError(f"num_sliding_attention_heads={sliding.heads} (a hub config's "
                              "attention_other_setting.num_attention_heads) is not a multiple of "
                              f"num_key_value_heads={attn.kv_heads}")
    kinds = layer_list(cfg, "layer_types", n, LAYER_TYPES)
    interval = cfg.get("full_attention_interval", arch.full_attention_interval or None)
    if kinds is None and isinstance(interval, int) and interval > 0:
        k = interval  # Qwen3-Next: every k-th layer is full attention, the rest linear (HF default 4)
        kinds = ["attention" if (i + 1) % k == 0 else "gated_deltanet" for i in range(n)]
    if kinds is None and (full := index_list(cfg, "full_attn_idxs", n)) is not None:  # LFM2
        kinds = ["attention" if i in full else "short_conv" for i in range(n)]
    if arch.sliding_even and sliding:  # vLLM ignores layer_types here: every even layer is sliding
        kinds = ["sliding_attention" if i % 2 == 0 else "attention" for i in range(n)]
    if kinds is None and sliding and arch.sliding_pattern:
        every = cfg.get("sliding_window_pattern") or arch.sliding_pattern
        if not isinstance(every, int) or every < 1:
            raise ConfigError(f"sliding_window_pattern={every!r} must be a positive integer")
        kinds = ["attention" if (i + 1) % every == 0 else "sliding_attention" for i in range(n)]
    kinds = model_wide_kinds(cfg, arch, n, kinds, bool(sliding))
    chunk = cfg.get("attention_chunk_size", arch.chunk or None)
    if arch.global_attention:  # Gemma-4's global layers: their own head size, and K = V with fewer KV heads
        k_eq_v = cfg.get("attention_k_eq_v") is True
        kv = (cfg.get("num_global_key_value_heads") if k_eq_v
              and cfg.get("num_global_key_value_heads") else attn.kv_heads)
        attn = replace(attn, head_dim=read_int(cfg, "global_head_dim", default=512),
                       kv_heads=read_int({"kv": kv}, "kv"), k_eq_v=k_eq_v)
        if attn.heads % attn.kv_heads:
            raise ConfigError(f"num_attention_heads={attn.heads} is not a multiple of "
                              f"num_global_key_value_heads={kv}")
    no_rope = cfg.get("no_rope_layers")
    mixers = []
    for i, kind in enumerate(kinds):
        if kind == "sliding_attention":
            if not sliding:
                raise ConfigError("layer_types has sliding_attention layers but sliding_window is not set")
            m = sliding
        elif kind == "parallel_hybrid":
            m = replace(attn, beside=_linear_mixer(cfg, "mamba2"), shared_block=arch.shared_blocks)
        elif kind in ("attention", "chunked_attention"):  # transformers' Llama-4 names its chunked layers
            m = attn
            # Llama-4: RoPE layers attend within chunks, NoPE layers fully
            if isinstance(chunk, int) and chunk > 0:
                m = replace(attn, kind="chunked_attention", window=chunk)
            if isinstance(no_rope, list) and len(no_rope) == n and not no_rope[i]:
                m = replace(attn, rope=False)
        else:
            m = _linear_mixer(cfg, kind)
        mixers.append(m)
    if isinstance(no_rope, list) and len(no_rope) != n:
        raise ConfigError(f"no_rope_layers has {len(no_rope)} entries but num_hidden_layers={n}")
    return _kv_shared(cfg, kinds, mixers, arch.hf_class) if arch.kv_sharing else mixers


def _kv_shared(cfg: dict, kinds: list[str], mixers: list[Mixer], cls: str) -> list[Mixer]:
    """Gemma-3n's and Gemma-4's last num_kv_shared_layers attend over the cache of the last earlier layer of
    their kind (vLLM 0.33's kv_sharing_target_layer_name): they build q_proj alone and cache nothing."""
    shared, n = read_int(cfg, "num_kv_shared_layers", default=0, minimum=0), len(mixers)
    first = n - shared
    if shared and (first < 1 or any(kind not in kinds[:first] for kind in kinds[first:])):
        raise ConfigError(f"num_kv_shared_layers={shared} of {n} layers: a shared layer has no earlier "
                          f"layer of its kind to share a KV cache with, which vLLM 0.33's {cls} cannot "
                          "build")
    return mixers[:first] + [replace(m, kv_shared=True, kv_heads=0, k_eq_v=False) for m in mixers[first:]]


def _linear_mixer(cfg: dict, kind: str) -> Mixer:
    if kind == "gated_deltanet":
        return Mixer(kind, heads=read_int(cfg, "linear_num_value_heads"),
                     head_dim=read_int(cfg, "linear_value_head_dim"),
                     groups=read_int(cfg, "linear_num_key_heads"),
                     key_dim=read_int(cfg, "linear_key_head_dim"),
                     conv_kernel=read_int(cfg, "linear_conv_kernel_dim", default=4))
    if kind == "mamba2":
        return Mixer(kind, heads=read_int(cfg, "mamba_num_heads"), head_dim=read_int(cfg, "mamba_head_dim"),
                     groups=read_int(cfg, "n_groups", default=1), state=read_int(cfg, "ssm_state_size"),
                     conv_kernel=read_int(cfg, "conv_kernel", default=4),
                     no_norm=cfg.get("mamba_rms_norm") is False)
    if kind == "mamba1":  # Jamba's and Mamba's records read their keys into these
        return Mixer(kind, inner=read_int(cfg, "mamba_inner"), state=read_int(cfg, "ssm_state_size"),
                     dt_rank=read_int(cfg, "time_step_rank"), conv_kernel=read_int(cfg, "conv_kernel"),
                     no_norm=cfg.get("mamba_dt_norms") is False)
    if kind == "short_conv":
        return Mixer(kind, conv_kernel=read_int(cfg, "conv_L_cache", default=3))
    if kind == "kda":  # Kimi-Linear: its record reads linear_attn_config into these keys
        return Mixer(kind, heads=read_int(cfg, "kda_num_heads"), head_dim=read_int(cfg, "kda_head_dim"),
                     conv_kernel=read_int(cfg, "kda_conv_kernel"))
    raise ConfigError(f"layer kind {kind!r} is not one tpviz models")


def _moe_layers(cfg: dict, n: int, experts: int) -> list[bool]:
    """Which layers carry experts: DeepSeek's first_k_dense_replace and moe_layer_freq, Qwen-MoE's
    decoder_sparse_step and mlp_only_layers, Llama-4's interleave_moe_layer_step / moe_layers."""
    if not experts:
        return [False] * n
    if (listed := index_list(cfg, "moe_layers", n)) is not None:
        return [i in listed for i in range(n)]
    first = cfg.get("first_k_dense_replace") or 0
    freq = (read_int(cfg, "moe_layer_freq", default=1)
            if not isinstance(cfg.get("moe_layer_freq"), list) else 1)
    step = read_int(cfg, "decoder_sparse_step", default=1)
    inter = read_int(cfg, "interleave_moe_layer_step", default=1)
    if isinstance(first, bool) or not isinstance(first, int) or first < 0:
        raise ConfigError(f"first_k_dense_replace={first!r} must be an integer >= 0")
    dense = set(index_list(cfg, "mlp_only_layers", n) or [])
    return [i >= first and i % freq == 0 and (i + 1) % step == 0 and (i + 1) % inter == 0 and i not in dense
            for i in range(n)]


def derive(cfg: dict, arch: Arch, n: int, hidden: int, attn: Mixer, dense: Ffn,
           moe: Ffn | None) -> list[LayerSpec]:
    """Every layer's LayerSpec from the config's per-layer fields."""
    for key, part in arch.unmodelled:  # before any layer reader: a pattern's keys too (Mamba2's use_bias)
        if cfg.get(key):
            raise ConfigError(f"{key}={cfg[key]!r}: {arch.model_type}'s {part} are not modelled by tpviz yet")
    if "block_configs" in cfg:
        return _block_configs(cfg, n, hidden, attn, dense)
    if "hybrid_override_pattern" in cfg:
        return _hybrid_pattern(cfg, n, attn, dense, moe)
    if arch.refused:
        raise ConfigError(f"{arch.model_type} uses {arch.refused}, which tpviz does not model yet")
    mixers = _mixers(cfg, arch, n, attn)
    if arch.mixer_only:  # a pure SSM stack (Mamba): no layer has an FFN
        return [LayerSpec(m, Ffn("none")) for m in mixers]
    if arch.shared_blocks:  # Zamba2: the hybrid layers' shared block runs the MLP, Mamba2 layers have none
        return [LayerSpec(m, dense if m.beside else Ffn("none")) for m in mixers]
    if "indexer" in arch.extra:  # DeepSeek Sparse Attention: the lightning indexer beside MLA
        mixers = with_indexers(cfg, mixers)
    has_moe = _moe_layers(cfg, n, moe.experts if moe else 0)
    top_k = per_layer(cfg, "moe_topk_per_layer", n, moe.top_k if moe else 0) if moe else [0] * n
    # Gemma-4's use_double_wide_mlp: the KV-shared layers' MLP is twice intermediate_size
    wide = [m.kv_shared and cfg.get("use_double_wide_mlp") is True for m in mixers]
    # Gemma-3n: one MLP size per layer (its adapt checks the list)
    sizes = cfg.get("layer_intermediate_sizes") or [dense.size] * n
    return [LayerSpec(m, replace(moe, top_k=k if isinstance(k, int) else moe.top_k,
                                 shared=moe.shared * (1 + w)) if is_moe
                      else replace(dense, size=size * (1 + w)))
            for m, is_moe, k, w, size in zip(mixers, has_moe, top_k, wide, sizes)]


def _hybrid_pattern(cfg: dict, n: int, attn: Mixer, dense: Ffn, moe: Ffn | None) -> list[LayerSpec]:
    """Nemotron-H: one char per layer: M = Mamba2, * = attention, - = MLP, E = MoE; each layer is one of
    them."""
    pattern = cfg["hybrid_override_pattern"]
    if not isinstance(pattern, str) or len(pattern) != n:
        raise ConfigError(f"hybrid_override_pattern must be a string of num_hidden_layers={n} characters "
                          "(M, *, -, E), got "
                          f"{len(pattern) if isinstance(pattern, str) else type(pattern).__name__}")
    none_mixer, none_ffn = Mixer("none"), Ffn("none")
    sizes = cfg.get("mlp_sizes")
    if isinstance(sizes, list) and len(sizes) not in (1, pattern.count("-")):
        raise ConfigError(f"intermediate_size has {len(sizes)} entries but hybrid_override_pattern has "
                          f"{pattern.count('-')} MLP layers")
    out = []
    for ch in pattern:
        if ch == "M":
            out.append(LayerSpec(_linear_mixer(cfg, "mamba2"), none_ffn))
        elif ch == "*":  # Nemotron-H attention uses no RoPE
            out.append(LayerSpec(replace(attn, rope=False), none_ffn))
        elif ch == "-":
            k = sum(1 for layer in out if layer.ffn.kind == "dense")
            size = sizes[k if len(sizes) > 1 else 0] if isinstance(sizes, list) else dense.size
            out.append(LayerSpec(none_mixer, replace(dense,
                                                     size=read_int({"intermediate_size": size},
                                                                   "intermediate_size"))))
        elif ch == "E" and moe:
            out.append(LayerSpec(none_mixer, moe))
        else:
            raise ConfigError(f"hybrid_override_pattern has {ch!r}; tpviz knows M, *, - and E "
                              "(with n_routed_experts)")
    return out


def ffn_mult_to_intermediate(ffn_mult: float, hidden: int) -> int:
    """Nemotron-NAS (DeciLM): intermediate = 2/3 * ffn_mult * hidden, rounded up to a multiple of 256."""
    size = int(2 * ffn_mult * hidden / 3)
    return size + (-size % 256)


def _block_configs(cfg: dict, n: int, hidden: int, attn: Mixer, dense: Ffn) -> list[LayerSpec]:
    """Llama-Nemotron (nemotron-nas): per-layer attention (no_op or n_heads_in_group) and FFN (no_op or
    ffn_mult)."""
    blocks = cfg["block_configs"]
    if not isinstance(blocks, list) or len(blocks) != n:
        raise ConfigError(f"block_configs must have one entry per layer (num_hidden_layers={n})")
    out = []
    for i, block in enumerate(blocks):
        a = block.get("attention") if isinstance(block, dict) else None
        f = block.get("ffn") if isinstance(block, dict) else None
        if not isinstance(a, dict) or not isinstance(f, dict):
            raise ConfigError(f"block_configs[{i}] needs an 'attention' and an 'ffn' object")
        for part, d in (("attention", a), ("ffn", f)):
            if d.get("replace_with_linear"):
                raise ConfigError(f"block_configs[{i}].{part}.replace_with_linear: tpviz "
                                  "does not model linear replacement blocks yet")
        if a.get("no_op"):
            mixer = Mixer("none")
        else:
            group = a.get("n_heads_in_group")
            if isinstance(group, bool) or not isinstance(group, int) or group < 1 or attn.heads % group:
                raise ConfigError(f"block_configs[{i}].attention.n_heads_in_group={group!r} must divide "
                                  f"num_attention_heads={attn.heads}")
            mixer = replace(attn, kv_heads=attn.heads // group)
        if f.get("no_op"):
            ffn = Ffn("none")
        else:
            mult = f.get("ffn_mult")
            if isinstance(mult, bool) or not isinstance(mult, (int, float)) or not 0 < mult < 1000:
                raise ConfigError(f"block_configs[{i}].ffn.ffn_mult={mult!r} must be a positive number")
            ffn = replace(dense, size=ffn_mult_to_intermediate(mult, hidden))
        out.append(LayerSpec(mixer, ffn))
    return out


def hybrid_hint(cfg: dict) -> str | None:
    """The field that shows a config is not a plain attention decoder, if any."""
    return next((k for k in HYBRID_HINTS if k in cfg), None) or next(
        (k for k in cfg if any(w in k.lower() for w in ("mamba", "ssm", "conv_"))), None)


def family_defaults(cfg: dict, arch: Arch) -> dict:
    """The config with the family's own field names mapped to the common ones, as vLLM reads them."""
    cfg = dict(cfg)
    if arch.adapt:
        cfg = arch.adapt(cfg)
    if isinstance(cfg.get("moe_topk"), list):  # Hunyuan: per layer; the model-wide value is the largest
        tops = [read_int({"moe_topk": v}, "moe_topk") for v in cfg["moe_topk"]]
        cfg["moe_topk_per_layer"], cfg["moe_topk"] = tops, max(tops, default=0)
    return cfg


# vLLM 0.33 (transformers_utils/model_arch_config_convertor.py): the least of these is the model's length
MAX_LEN_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "model_max_length",
                "max_target_positions", "max_sequence_length", "max_seq_length", "seq_len")
# factor not applied
SCALED_ALREADY = ("su", "longrope", "llama3", "yarn", "deepseek_yarn", "deepseek_llama_scaling")


def bad_lengths(cfg: dict) -> list[str]:
    """The length keys set to what cannot be a length (1.5, "4096", true, -1, NaN): left out of max_model_len,
    and named in a note; a huge or infinite one means no limit."""
    def length(v):
        return isinstance(v, (int, float)) and not isinstance(v, bool) and (v >= 1e15
                                                                            or v >= 1 and v == int(v))
    return [k for k in MAX_LEN_KEYS if cfg.get(k) is not None and not length(cfg[k])]


def max_model_len(cfg: dict, arch: Arch) -> int:
    """vLLM 0.33's derived max_model_len (config/model.py _get_and_verify_max_len): the least length key
    (model_max_length wins when set), times a RoPE factor the length does not already count; 0 when the config
    names no length (vLLM then assumes 2048, or the config class's default applies)."""
    def positive(v):  # a JSON number that can be a length or a factor (not NaN, not Infinity)
        return isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v < 1e15
    lengths = [cfg[k] for k in MAX_LEN_KEYS if k not in bad_lengths(cfg) and positive(cfg.get(k))]
    if not lengths:
        return 0
    length = cfg["model_max_length"] if positive(cfg.get("model_max_length")) else min(lengths)
    rope = cfg.get("rope_scaling") or cfg.get("rope_parameters")
    ropes = ([rope] if "rope_type" in rope or "type" in rope
             else [r for r in rope.values() if isinstance(r, dict)]) \
        if isinstance(rope, dict) else []
    factor = 1.0
    for r in ropes if arch.length_counts_rope else []:  # Gemma-3's length already counts its scaling
        if r.get("rope_type", r.get("type")) not in SCALED_ALREADY and positive(r.get("factor")):
            factor = r["factor"]
    return int(length * factor)

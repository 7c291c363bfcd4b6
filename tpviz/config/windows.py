"""Which layers a config's sliding_window windows, as vLLM 0.33 runs it: model-wide (EngineArgs sets the cache's
window when there are no layer_types or all are sliding), Qwen's use_sliding_window / max_window_layers, and the
note for a window tpviz leaves unapplied."""


# a config sliding_window with no layer_types windows every layer (their transformers configs keep it as given)
MODEL_WIDE_WINDOW = ("mistral", "mixtral", "starcoder2", "phi3")
QWEN_WINDOWS = ("qwen2", "qwen3", "qwen2_moe", "qwen3_moe")  # use_sliding_window + max_window_layers, as below


def qwen_window_layers(cfg: dict, model_type: str, n: int, kinds: list[str] | None = None) -> int:
    """How many layers transformers makes sliding with use_sliding_window and a window: config layer_types', else
    Qwen2/Qwen3Config's from max_window_layers (default 28) on, Qwen2MoeConfig's even ones below it, and every
    layer for Qwen3MoeConfig (no layer_types). vLLM 0.33 windows the cache only when that is all of them."""
    if cfg.get("use_sliding_window") is not True or not isinstance(cfg.get("sliding_window"), int):
        return 0
    if cfg.get("layer_types") is not None and kinds is not None:
        return sum(k == "sliding_attention" for k in kinds)
    if model_type == "qwen3_moe":
        return n
    first = cfg.get("max_window_layers", 28)
    if not isinstance(first, int) or isinstance(first, bool):
        return 0
    if model_type == "qwen2_moe":
        return len(range(0, min(max(first, 0), n), 2))
    return n - min(max(first, 0), n)


def binding_window(cfg: dict) -> int:
    """The config's sliding_window when it is a positive int below max_position_embeddings (a wider one, like
    Phi-3-128k's 262144 over 131072 positions, never binds), else 0."""
    window, limit = cfg.get("sliding_window"), cfg.get("max_position_embeddings")
    if not isinstance(window, int) or isinstance(window, bool) or window <= 0:
        return 0
    return 0 if isinstance(limit, int) and window >= limit else window


def model_wide_kinds(cfg: dict, model_type: str, n: int, kinds: list[str] | None, windowed: bool) -> list[str]:
    """Each layer's kind once a model-wide sliding_window is applied as vLLM 0.33 does (`windowed`: the config
    has one); `kinds`: what layer_types or the architecture's pattern said, None when nothing did."""
    if kinds is None:  # vLLM 0.33 applies a model-wide sliding_window to every layer (EngineArgs: no layer_types)
        uses = windowed and binding_window(cfg) and cfg.get("use_sliding_window", model_type in MODEL_WIDE_WINDOW)
        kinds = ["sliding_attention" if uses else "attention"] * n
    if model_type in QWEN_WINDOWS:  # vLLM 0.33 windows the cache only when transformers makes every layer sliding
        every = windowed and qwen_window_layers(cfg, model_type, n, kinds) == n
        kinds = ["sliding_attention" if every else "attention"] * n
    elif model_type.startswith("qwen") and cfg.get("use_sliding_window") is False:
        kinds = ["attention" if k == "sliding_attention" else k for k in kinds]  # Qwen: windows only if enabled
    return kinds


def _qwen_mix(cfg: dict, model_type: str, n: int) -> str | None:
    """The note for Qwen layers that differ: vLLM 0.33's Qwen2Model (Qwen2, Qwen3) refuses them unless
    max_window_layers == num_hidden_layers; otherwise, with no per-layer windows, it runs full attention."""
    types, mwl = cfg.get("layer_types"), cfg.get("max_window_layers", 28)
    given = isinstance(types, list)
    sliding = sum(t == "sliding_attention" for t in types) if given else qwen_window_layers(cfg, model_type, n)
    how = "layer_types" if given else f"use_sliding_window with max_window_layers={mwl}"
    if (model_type in ("qwen2", "qwen3") and given and len(set(types)) > 1) or 0 < sliding < n:
        if model_type in ("qwen2", "qwen3") and mwl != n:
            return (f"{how} makes {sliding} of the {n} layers sliding, which vLLM 0.33's {model_type.title()} refuses "
                    "to load (Qwen2Model asserts max_window_layers == num_hidden_layers when layers differ); mapped "
                    "as full attention")
        return (f"{how} makes {sliding} of the {n} layers sliding; vLLM 0.33 windows the KV cache only when all "
                "are, so it runs full attention, as mapped here")
    return None


def ignored_window(cfg: dict, model_type: str, layers: list) -> str | None:
    """The note for a window left unapplied: a Qwen mix vLLM 0.33 refuses or ignores, or a binding model-wide one
    outside MODEL_WIDE_WINDOW (vLLM windows every layer when the transformers config keeps it: sized as full
    attention)."""
    window, n = binding_window(cfg), len(layers)
    if model_type in QWEN_WINDOWS:
        return _qwen_mix(cfg, model_type, n)
    if (not window or cfg.get("use_sliding_window") is False or model_type.startswith("qwen")
            or any(layer.mixer.kind == "sliding_attention" for layer in layers)):
        return None
    return (f"sliding_window={window} in a {model_type!r} config is not applied: vLLM windows every layer's KV cache "
            f"when the transformers config keeps it, which tpviz knows only for {', '.join(MODEL_WIDE_WINDOW)}; "
            "the KV cache is sized for full attention (an upper bound)")

"""Which layers a config's sliding_window windows, as vLLM 0.33 runs it: model-wide (EngineArgs sets the
cache's window when there are no layer_types or all are sliding), Qwen's use_sliding_window /
max_window_layers, and the note for a window tpviz leaves unapplied. The architecture record's `window` names
its rule:

- "model_wide": a config sliding_window with no layer_types windows every layer (Mistral, Mixtral, StarCoder2,
  Phi-3: their transformers configs keep it as given);
- "qwen2" (Qwen2, Qwen3), "qwen2_moe", "qwen3_moe": use_sliding_window with max_window_layers, as below.
"""
from tpviz.archs import REGISTRY, Arch

QWEN_RULES = ("qwen2", "qwen2_moe", "qwen3_moe")


def qwen_window_layers(cfg: dict, arch: Arch, n: int, kinds: list[str] | None = None) -> int:
    """How many layers transformers makes sliding with use_sliding_window and a window: config layer_types',
    else Qwen2/Qwen3Config's from max_window_layers (default 28) on, Qwen2MoeConfig's even ones below it, and
    every layer for Qwen3MoeConfig (no layer_types). vLLM 0.33 windows the cache only when that is all of
    them."""
    if cfg.get("use_sliding_window") is not True or not isinstance(cfg.get("sliding_window"), int):
        return 0
    if cfg.get("layer_types") is not None and kinds is not None:
        return sum(k == "sliding_attention" for k in kinds)
    if arch.window == "qwen3_moe":
        return n
    first = cfg.get("max_window_layers", 28)
    if not isinstance(first, int) or isinstance(first, bool):
        return 0
    if arch.window == "qwen2_moe":
        return len(range(0, min(max(first, 0), n), 2))
    return n - min(max(first, 0), n)


def binding_window(cfg: dict) -> int:
    """The config's sliding_window when it is a positive int below max_position_embeddings (a wider one, like
    Phi-3-128k's 262144 over 131072 positions, never binds), else 0."""
    window, limit = cfg.get("sliding_window"), cfg.get("max_position_embeddings")
    if not isinstance(window, int) or isinstance(window, bool) or window <= 0:
        return 0
    return 0 if isinstance(limit, int) and window >= limit else window


def model_wide_kinds(cfg: dict, arch: Arch, n: int, kinds: list[str] | None, windowed: bool) -> list[str]:
    """Each layer's kind once a model-wide sliding_window is applied as vLLM 0.33 does (`windowed`: the config
    has one); `kinds`: what layer_types or the architecture's pattern said, None when nothing did."""
    # vLLM 0.33 applies a model-wide sliding_window to every layer (EngineArgs: no layer_types)
    if kinds is None:
        uses = windowed and binding_window(cfg) and cfg.get("use_sliding_window", arch.window == "model_wide")
        kinds = ["sliding_attention" if uses else "attention"] * n
    # vLLM 0.33 windows the cache only when transformers makes every layer sliding
    if arch.window in QWEN_RULES:
        every = windowed and qwen_window_layers(cfg, arch, n, kinds) == n
        kinds = ["sliding_attention" if every else "attention"] * n
    elif arch.window_flag and cfg.get("use_sliding_window") is False:
        # Qwen: windows only if enabled
        kinds = ["attention" if k == "sliding_attention" else k for k in kinds]
    return kinds


def _qwen_mix(cfg: dict, arch: Arch, n: int) -> str | None:
    """The note for Qwen layers that differ: vLLM 0.33's Qwen2Model (Qwen2, Qwen3) refuses them unless
    max_window_layers == num_hidden_layers; otherwise, with no per-layer windows, it runs full attention."""
    types, mwl = cfg.get("layer_types"), cfg.get("max_window_layers", 28)
    given = isinstance(types, list)
    sliding = sum(t == "sliding_attention" for t in types) if given else qwen_window_layers(cfg, arch, n)
    how = "layer_types" if given else f"use_sliding_window with max_window_layers={mwl}"
    refuses = arch.window == "qwen2"  # Qwen2Model (Qwen2, Qwen3) asserts on a mix
    if (refuses and given and len(set(types)) > 1) or 0 < sliding < n:
        if refuses and mwl != n:
            return (f"{how} makes {sliding} of the {n} layers sliding, which vLLM 0.33's "
                    f"{arch.model_type.title()} refuses to load (Qwen2Model asserts max_window_layers == "
                    "num_hidden_layers when layers differ); mapped as full attention")
        return (f"{how} makes {sliding} of the {n} layers sliding; vLLM 0.33 windows the KV "
                "cache only when all are, so it runs full attention, as mapped here")
    return None


def ignored_window(cfg: dict, arch: Arch, layers: list) -> str | None:
    """The note for a window left unapplied: a Qwen mix vLLM 0.33 refuses or ignores, or a binding model-wide
    one outside the model-wide rule (vLLM windows every layer when the transformers config keeps it: sized as
    full attention)."""
    window, n = binding_window(cfg), len(layers)
    if arch.window in QWEN_RULES:
        return _qwen_mix(cfg, arch, n)
    if (not window or cfg.get("use_sliding_window") is False or arch.window_flag
            or any(layer.mixer.kind == "sliding_attention" for layer in layers)):
        return None
    wide = ", ".join(t for t, a in REGISTRY.items() if a.window == "model_wide")
    return (f"sliding_window={window} in a {arch.model_type!r} config is not applied: vLLM "
            "windows every layer's KV cache when the transformers config keeps it, which tpviz "
            f"knows only for {wide}; the KV cache is sized for full attention (an upper bound)")

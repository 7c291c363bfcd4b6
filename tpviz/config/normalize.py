"""One normalized model spec from the many shapes real config.json files take: read through transformers'
config class (config/hf.py), then as the architecture's record (tpviz.archs) says."""
from tpviz.archs import arch_of, arch_of_class
from tpviz.config.fields import MAX_DIM, full_rope, json_type, pick, read_bool, read_float, read_int
from tpviz.config.hf import DIMENSIONS, class_defaults, config_class, through_transformers
from tpviz.config.kinds import Ffn, Mixer
from tpviz.config.quant import served_quant
from tpviz.config.readers import bad_lengths, derive, family_defaults, hybrid_hint, max_model_len
from tpviz.config.spec import DTYPE_BYTES, LIMITS, ModelSpec
from tpviz.config.towers import read_towers, tower_notes
from tpviz.config.windows import ignored_window
from tpviz.errors import ConfigError, MissingFieldError
from tpviz.rules.served import architecture, retired, serves, unserved


def normalize(cfg: dict, name: str = "model") -> ModelSpec:
    """Read a Hugging Face config dict (parsed JSON) into a ModelSpec, or raise one clear ConfigError: first
    through transformers' config class, as vLLM reads it (config/hf.py), then as the model_type's record
    says."""
    if not isinstance(cfg, dict):
        raise ConfigError(f"config must be a JSON object, got {json_type(cfg)}")
    arch = arch_of(str(cfg.get("model_type", "")))
    given = served_part(cfg, arch.inner) if arch.inner else cfg
    check_plausible(given)  # before transformers' class, which builds per-layer lists of any length
    # vLLM reads some model_types with its own config class (Kimi-Linear): as given, by the record's adapt
    read, refusal = (cfg, None) if arch.own_config else through_transformers(cfg)
    read = served_part(read, arch.inner) if arch.inner else read
    # as given when the class refuses it: tpviz's own reading names a faulty field
    try:
        spec = read_spec(read, name)
    except ConfigError as e:  # read as given because the class refused it: that refusal is the cause
        if refusal:
            e.args = (f"{refusal.split('; its keys')[0]}; read as given, {e}", *e.args[1:])
        raise
    spec.config = cfg
    if arch.note and arch.note not in spec.notes:  # a wrapper's own note (its decoder's record gave its own)
        spec.notes.append(arch.note)
    if defaults := class_defaults(given, read):
        cls = config_class(read["text_config"].get("model_type"))
        spec.notes.append("text_config leaves " + ", ".join(f"{k} ({v})" for k, v in defaults.items())
                          + f" to {cls.__name__ if cls else 'its class'}'s defaults, as vLLM 0.33 builds it")
    if refusal:  # a checkpoint may ship its own config code (trust_remote_code), which tpviz never runs
        spec.notes.append(f"{refusal}; read as given: vLLM loads it only with the "
                          "checkpoint's own config code")
    return spec


def served_part(cfg: dict, inner: str) -> dict:
    """The sub-config vLLM builds a model from (Qwen2.5-Omni's thinker_config), under the outer model_type
    (its record) and with the outer dtype and quantization where it gives none."""
    part = cfg.get(inner)
    if not isinstance(part, dict):
        raise MissingFieldError(f"config has no {inner} object, the part of {cfg.get('model_type')} "
                                "vLLM 0.33 serves", inner)
    outer = {k: cfg[k] for k in ("architectures", "torch_dtype", "dtype", "quantization_config") if k in cfg}
    return {**outer, **part, "model_type": cfg.get("model_type")}


def check_plausible(cfg: dict) -> None:
    """One line for a dimension of the config as given (its text decoder's, in a multimodal wrapper) that is
    no whole number or larger than any real model's."""
    text = cfg["text_config"] if isinstance(cfg.get("text_config"), dict) else cfg
    experts = ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts")
    for key, names in (*DIMENSIONS.items(), ("num_experts", experts), ("head_dim", ("head_dim",)),
                       ("num_key_value_heads", ("num_key_value_heads", "num_kv_heads",
                                                "multi_query_group_num"))):
        value = pick(text, *names)
        for one in value if isinstance(value, list) else [] if value is None else [value]:  # or one per layer
            read_int({key: one}, key, minimum=0, maximum=LIMITS.get(key, MAX_DIM))


def nested_decoder(cfg: dict) -> str | None:
    """The key of a custom wrapper's decoder config (InternVL's llm_config, DeepSeek-VL2's language_config)
    when the config itself has no hidden size."""
    if any(cfg.get(n) is not None for n in DIMENSIONS["hidden_size"]):
        return None
    return next((k for k, v in cfg.items() if isinstance(v, dict) and k != "quantization_config"
                 and any(v.get(n) is not None for n in DIMENSIONS["hidden_size"])), None)


def read_spec(cfg: dict, name: str) -> ModelSpec:
    """A config dict (as transformers' class reads it, or as given) into a ModelSpec, as its record says."""
    nest = next((k for k in ("text_config", "llm_config", "language_config") if k in cfg), "text_config")
    if "text_config" not in cfg and isinstance(cfg.get("llm_config"), dict):  # InternVL: vLLM 0.33 reads
        cfg = {**cfg, "text_config": cfg["llm_config"]}  # llm_config as text_config (_CONFIG_ATTRS_MAPPING)
    decoder_note = ""
    if (wrapper := arch_of(str(cfg.get("model_type", "")))).decoder and "text_config" not in cfg:
        text, decoder_note = through_transformers(wrapper.decoder(cfg))  # MiniCPM-V, DeepSeek-VL2
        cfg = {**cfg, "text_config": text}
    if wrapper.whole_reason:  # refused before its text_config is read (Voxtral)
        raise ConfigError(f"{wrapper.model_type}: {wrapper.refused}")
    outer = cfg
    if isinstance(cfg.get("text_config"), dict):  # multimodal wrappers (Gemma-3, Llama-4, Mistral-3)
        kept = ("torch_dtype", "dtype", "tie_word_embeddings")  # model-wide keys some wrappers keep outside
        cfg = {**{k: v for k, v in outer.items() if k in kept}, **cfg["text_config"]}
    wrapped = cfg is not outer
    model_type = str(pick(cfg, "model_type", default=outer.get("model_type", "unknown")))
    arch, notes = arch_of(model_type), [decoder_note] if decoder_note else []
    cls = architecture(outer) or architecture(cfg)
    if not arch.known and not arch.refused and (built := arch_of_class(cls)):  # Kimi-K2: DeepSeek-V3
        notes.append(f"model_type {model_type!r} is built by vLLM 0.33 as {cls} (its architectures "
                     f"entry), so it is mapped as {built.model_type}")
        model_type, arch = built.model_type, built
        cfg = {**cfg, "model_type": model_type}
    if arch.refused:  # and where vLLM itself does not serve the class (Bamba, RWKV), it says so
        last = retired(cls)
        why = (f"; vLLM served {cls} until {last}" if last else
               f"; nor does vLLM 0.33 serve {cls}" if cls and not serves(cls) else "")
        raise ConfigError(f"{model_type} uses {arch.refused}, which tpviz does not model yet{why}")
    if not arch.known:
        if why := unserved(cls):  # vLLM builds by architectures: a class it serves otherwise is no Llama
            raise ConfigError(f"model_type {outer.get('model_type') or model_type!r}: {why}")
        if hint := hybrid_hint(cfg):
            raise ConfigError(f"model_type {model_type!r} is not one tpviz knows and its config "
                              f"has {hint!r}, a part of a non-Llama architecture tpviz does not model; "
                              "refusing to guess its layout")
        notes.append(f"model_type {model_type!r} is not one tpviz knows; mapped as a Llama-like decoder "
                     "(q/k/v/o, gate/up/down, Llama checkpoint names)")
    if arch.note:
        notes.append(arch.note)
    cfg = family_defaults(cfg, arch)
    if inner := nested_decoder(cfg):
        raise ConfigError(f"model_type {model_type!r} is a custom multimodal config: its text decoder is in "
                          f"'{inner}', not text_config, and tpviz reads text_config alone")
    if wrapped and (gone := [k for k in ("hidden_size", "num_attention_heads", "num_hidden_layers")
                             if pick(cfg, *DIMENSIONS[k]) is None]):  # LLaVA-1.5 leaves them to its class
        raise MissingFieldError(f"{nest} is missing {gone[0]}: vLLM 0.33 would take its {model_type} "
                                "config class's default, which tpviz does not assume (it may be another "
                                "model's size)", gone[0])
    hidden = read_int(cfg, "hidden_size", "n_embd", "n_embed", "d_model", "model_dim",
                      maximum=LIMITS["hidden_size"])
    heads = read_int(cfg, "num_attention_heads", "n_head", "num_heads", "n_heads")
    if cfg.get("new_decoder_architecture") is True:  # Falcon-40B/180B: grouped KV heads
        kv_heads = read_int(cfg, "num_kv_heads", "n_head_kv", default=heads)
    elif cfg.get("multi_query") is True:
        kv_heads = 1
    else:
        kv_heads = read_int(cfg, "num_key_value_heads", "num_kv_heads", "multi_query_group_num",
                            "n_head_kv", default=heads)
    if arch.kv_heads:  # stored per head (GPT-NeoX, BLOOM, old Falcon), or ChatGLM without multi-query groups
        kv_heads = arch.kv_heads(cfg, heads, kv_heads)
    if kv_heads > heads or heads % kv_heads:
        raise ConfigError(f"num_attention_heads={heads} is not a multiple of num_key_value_heads={kv_heads}")
    head_dim = pick(cfg, "head_dim", "kv_channels")
    # MLA: a query/key head is nope + rope wide (transformers' head_dim is the rope part)
    if cfg.get("kv_lora_rank"):
        head_dim = (read_int(cfg, "qk_nope_head_dim", default=0, minimum=0)
                    + read_int(cfg, "qk_rope_head_dim", default=0, minimum=0)) or head_dim
    if head_dim is None:
        if hidden % heads:
            raise ConfigError(f"hidden_size={hidden} is not divisible by num_attention_heads={heads} and "
                              "no head_dim is given")
        head_dim = hidden // heads
    head_dim = read_int({"head_dim": head_dim}, "head_dim")
    experts = read_int(cfg, "num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts",
                       default=0, minimum=0,
                   maximum=LIMITS["num_experts"])
    inter = pick(cfg, "intermediate_size", "ffn_hidden_size", "n_inner")
    if inter is None and arch.ffn_ratio:
        inter = arch.ffn_ratio * hidden
    moe_inter = pick(cfg, "moe_intermediate_size", default=inter if experts else 0)
    num_layers = read_int(cfg, "num_hidden_layers", "n_layer", "num_layers",
                          maximum=LIMITS["num_hidden_layers"])
    attention_bias = read_bool(cfg, "attention_bias", False)
    spec = ModelSpec(
        name=name, model_type=model_type, hidden_size=hidden, num_attention_heads=heads,
        num_key_value_heads=kv_heads, head_dim=head_dim,
        intermediate_size=read_int({"intermediate_size": inter}, "intermediate_size", minimum=0)
        if inter is not None else 0,
        vocab_size=read_int(cfg, "vocab_size", "padded_vocab_size", "n_vocab", maximum=LIMITS["vocab_size"]),
        num_hidden_layers=num_layers,
        tie_word_embeddings=read_bool(cfg, "tie_word_embeddings", arch.tied),
        attention_bias=(attention_bias or read_bool(cfg, "add_qkv_bias", False)) if arch.qkv_bias is None
        else arch.qkv_bias,
        o_proj_bias=attention_bias if arch.o_bias is None else arch.o_bias,
        # per head; a "use_*" record builds them when that config key is set (GLM-4.5's use_qk_norm)
        qk_norm=bool(arch.qk_norm) and (not arch.qk_norm.startswith("use_")
                                        or read_bool(cfg, arch.qk_norm, False)),
        qk_norm_full=arch.qk_norm == "full",
        num_experts=experts,
        num_experts_per_tok=read_int(cfg, "num_experts_per_tok", "experts_per_token", "moe_topk",
                                     default=0, minimum=0),
        # vLLM 0.33 deepseek_v2.py: the bias exists only for topk_method noaux_tc (V3's default, never V2's)
        router_score_bias=arch.score_bias == "always" or (
            arch.score_bias == "noaux_tc" and cfg.get("topk_method", arch.topk_method) == "noaux_tc") or (
            arch.score_bias.startswith("use_") and read_bool(cfg, arch.score_bias, False)),
        moe_intermediate_size=read_int({"moe_intermediate_size": moe_inter},
                                       "moe_intermediate_size", minimum=0),
        shared_expert_intermediate_size=read_int(cfg, "shared_expert_intermediate_size", default=0, minimum=0)
        or read_int(cfg, "n_shared_experts", default=0, minimum=0) * (moe_inter or 0),
        gated_mlp=arch.gated_mlp,
        conv_bias=read_bool(cfg, "conv_bias", False) or read_bool(cfg, "use_conv_bias", False),
        max_positions=read_int(cfg, "n_positions", "max_position_embeddings", default=0,
                               minimum=0, maximum=1 << 22)
        if arch.learned_positions else 0,
        max_model_len=max_model_len(cfg, arch),
        # the SSM state dtype vLLM takes from the config (Qwen3.5's mamba_ssm_dtype; Nemotron-H's default
        # float32)
        state_dtype=str(cfg.get("mamba_ssm_cache_dtype") or cfg.get("mamba_ssm_dtype") or arch.state_dtype),
        variant=arch.variant(cfg) if arch.variant else "",
        q_lora_rank=read_int(cfg, "q_lora_rank", default=0, minimum=0),
        kv_lora_rank=read_int(cfg, "kv_lora_rank", default=0, minimum=0),
        qk_nope_head_dim=read_int(cfg, "qk_nope_head_dim", default=0, minimum=0),
        qk_rope_head_dim=read_int(cfg, "qk_rope_head_dim", default=0, minimum=0),
        v_head_dim=read_int(cfg, "v_head_dim", default=0, minimum=0),
        config_dtype=str(pick(cfg, "torch_dtype", "dtype",
                              default=outer.get("torch_dtype", "bfloat16"))).replace(
            "torch.", ""),
        rope_theta=read_float(cfg, "rope_theta", read_float(full_rope(cfg), "rope_theta", 10000.0)),
        mlp_bias=read_bool(cfg, "mlp_bias", False),
        rms_norm_eps=read_float(cfg, "rms_norm_eps", read_float(cfg, "layer_norm_epsilon", 1e-6)),
        hidden_act=str(pick(cfg, "hidden_act", "hidden_activation", default="silu")),
        notes=notes,
    )
    spec.tower, spec.audio = read_towers(outer)
    if "per_layer_inputs" in arch.extra:  # Gemma-4 E2B / E4B, as vLLM 0.33 gemma4.py reads them
        spec.per_layer_input = read_int(cfg, "hidden_size_per_layer_input", default=0, minimum=0)
        spec.per_layer_vocab = read_int(cfg, "vocab_size_per_layer_input", default=spec.vocab_size,
                                        maximum=LIMITS["vocab_size"]) if spec.per_layer_input else 0
        if spec.per_layer_input and arch.pp:
            spec.notes.append(f"per-layer inputs: with pp > 1 vLLM 0.33 also hands each token's "
                              f"{num_layers} x {spec.per_layer_input} per-layer input values to the next "
                              "stage, which the PP hand-off traffic here leaves out")
    if "altup_laurel" in arch.extra:  # Gemma-3n, as vLLM 0.33 gemma3n.py reads them
        spec.altup_inputs = read_int(cfg, "altup_num_inputs", default=4, maximum=64)
        spec.laurel_rank = read_int(cfg, "laurel_rank", default=64, maximum=MAX_DIM)
    if arch.shared_blocks:  # Zamba2, as its record reads them
        spec.shared_blocks = read_int(cfg, "shared_blocks")
        spec.attention_adapters = cfg["attention_adapters"]
        spec.adapter_rank = read_int(cfg, "adapter_rank", maximum=MAX_DIM)
    spec.notes += tower_notes(spec.tower, spec.audio, outer, wrapped)
    spec.quant, spec.quantization, note = served_quant(outer, cfg, arch, model_type, experts)
    if note:
        spec.notes.append(note)
    check_dims(spec)
    if arch.learned_positions and not spec.max_positions:
        raise MissingFieldError(f"config is missing n_positions, the size of {model_type}'s learned position "
                                "embeddings", "n_positions")
    if arch.bias_switch:  # one switch for every bias: Falcon's "bias" (off by default), the others' use_bias
        spec.attention_bias = spec.o_proj_bias = spec.mlp_bias = read_bool(cfg, *arch.bias_switch)
    attn = Mixer("mla" if spec.kv_lora_rank else "attention", heads, kv_heads, head_dim,
                 output_gate=read_bool(cfg, "attn_output_gate", arch.output_gate),
                 head_gate="head_gate" in arch.extra and read_bool(cfg, "use_head_wise_attn_gate", False),
                 q_rank=read_int(cfg, arch.low_rank_q, minimum=1) if arch.low_rank_q else 0)
    if experts and spec.num_experts_per_tok > experts:
        raise ConfigError(f"num_experts_per_tok={spec.num_experts_per_tok} is more than "
                          f"the {experts} experts")
    moe = Ffn("moe", spec.moe_intermediate_size, experts, spec.num_experts_per_tok,
              spec.shared_expert_intermediate_size) if experts else None
    spec.layers = derive(cfg, arch, num_layers, hidden, attn, Ffn("dense", spec.intermediate_size), moe)
    if experts and not spec.is_moe:  # experts no layer holds are none (a class default, or every layer dense)
        spec.num_experts = spec.num_experts_per_tok = spec.moe_intermediate_size = 0
        spec.shared_expert_intermediate_size = 0
    if window_note := ignored_window(cfg, arch, spec.layers):
        spec.notes.append(window_note)
    spec.notes += [f"{k}={cfg[k]!r} is not a whole number of tokens, so no context limit is taken from it"
                   for k in bad_lengths(cfg)]
    check_parts(spec, cfg)
    spec.dtype = "bfloat16" if spec.config_dtype == "float32" else spec.config_dtype  # vLLM's dtype=auto
    if spec.config_dtype == "float32":
        spec.notes.append("the config says float32; vLLM's dtype=auto serves it in bfloat16, as sized here")
    if spec.dtype not in DTYPE_BYTES:
        spec.notes.append(f"dtype {spec.dtype!r} is unknown; sized as 2 bytes per weight")
    return spec


def check_dims(spec: ModelSpec) -> None:
    """One line for a dimension no real model has (it would also make a map cost without bound)."""
    dims = {"vocab_size": spec.vocab_size, "hidden_size": spec.hidden_size,
            "intermediate_size": spec.intermediate_size, "moe_intermediate_size": spec.moe_intermediate_size,
            "num_attention_heads * head_dim": spec.num_attention_heads * spec.head_dim,
            "num_attention_heads * MLA head dims": spec.num_attention_heads * (
                spec.qk_nope_head_dim + spec.qk_rope_head_dim + spec.v_head_dim),
            "num_experts": spec.num_experts, "num_hidden_layers": spec.num_hidden_layers,
            "kv_lora_rank": spec.kv_lora_rank, "q_lora_rank": spec.q_lora_rank,
            "shared_expert_intermediate_size": spec.shared_expert_intermediate_size}
    for key, value in dims.items():
        limit = LIMITS.get(key, MAX_DIM)
        if value > limit:
            raise ConfigError(f"{key}={value} is larger than {limit}; this does not look "
                              "like a real model config")


def check_parts(spec: ModelSpec, cfg: dict) -> None:
    """One line for a part the layers need but the config does not give (MLA dims, expert and MLP sizes)."""
    if spec.is_mla and not (spec.qk_nope_head_dim and spec.qk_rope_head_dim and spec.v_head_dim):
        raise ConfigError("config has kv_lora_rank (MLA) but lacks qk_nope_head_dim, "
                          "qk_rope_head_dim or v_head_dim")
    if spec.is_moe and spec.moe_intermediate_size < 1:
        raise ConfigError(f"config has {spec.num_experts} experts but moe_intermediate_size="
                          f"{spec.moe_intermediate_size}; it must be >= 1")
    if any(layer.ffn.kind == "dense" and not layer.ffn.size for layer in spec.layers):
        if pick(cfg, "intermediate_size") is None:
            raise MissingFieldError("config is missing intermediate_size, needed by its dense MLP layers",
                                    "intermediate_size")
        raise ConfigError(f"intermediate_size={pick(cfg, 'intermediate_size')!r} must be >= 1: its dense MLP "
                          "layers need it")

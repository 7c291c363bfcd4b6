"""The architecture record: everything tpviz knows about one model_type, in one frozen object.

The config stage reads a config through its record (defaults, quirks, windows, layer kinds), the plan names
its checkpoint tensors with it, and the live half picks its block from it. Only tpviz/archs/ defines records;
the rest of tpviz asks a record and never compares model_type strings.
"""
from dataclasses import dataclass
from typing import Callable

from tpviz.archs.names import LLAMA, Names
from tpviz.rules.sglang_files import Groups


@dataclass(frozen=True)
class Arch:
    """One model_type as vLLM 0.33 serves it. Fields left at their default are Llama's behaviour."""
    model_type: str
    hf_class: str = "LlamaForCausalLM"  # the checkpoint's architectures entry (random checkpoints write it)
    names: Names = LLAMA  # checkpoint names; names_for picks them per config where a variant changes them
    names_for: Callable[[str, int], Names] | None = None  # (variant, kv heads) -> names (Falcon)
    # False: the Llama-like reading of a model_type tpviz does not know (checked, or refused)
    known: bool = True
    refused: str = ""  # a part tpviz does not model: the config is refused in one line naming it
    whole_reason: bool = False  # refused is the whole reason, a sentence of its own (Voxtral's format)
    unmodelled: tuple[tuple[str, str], ...] = ()  # (config key, part): set and truthy, the config is refused
    text_model: str = ""  # a multimodal wrapper's text decoder model_type (Gemma-3: gemma3_text)
    tower: str = ""  # the wrapper's vision tower as config/tower.py reads it ("": not modelled, left out)
    audio: str = ""  # its audio tower as config/tower_audio.py reads it ("": none, or left out)
    inner: str = ""  # the sub-config vLLM serves (Qwen2.5-Omni's thinker_config: no talker or token2wav)
    unloaded: tuple[str, ...] = ()  # checkpoint prefixes the loader drops (those parts' tensors)
    # a wrapper that keeps its decoder's config elsewhere than text_config: the config -> that decoder's
    # config, with the model_type vLLM builds it as (MiniCPM-V's flat config by version, DeepSeek-VL2's
    # language_config); read through transformers' class for that model_type, as vLLM's config class does
    decoder: Callable[[dict], dict] | None = None
    # --- reading the config (what vLLM reads through transformers' config class, and the quirks it adds)
    # vLLM reads the config with its own class (transformers_utils/configs/), not transformers': read as
    # given, and adapt applies that class's defaults (Kimi-Linear)
    own_config: str = ""
    adapt: Callable[[dict], dict] | None = None  # the family's own config fields onto the common ones
    # (config, heads, KV heads read) -> the KV heads it runs
    kv_heads: Callable[[dict, int, int], int] | None = None
    variant: Callable[[dict], str] | None = None  # a decoder variant that changes checkpoint names (Falcon)
    # variants ("*": all) whose attention and MLP outputs are summed, then all-reduced once per layer
    joint_reduce: tuple[str, ...] = ()
    tied: bool = False  # tie_word_embeddings when the config does not say
    # None: the config's attention_bias (or add_qkv_bias); True/False: always/never
    qkv_bias: bool | None = None
    o_bias: bool | None = None  # None: attention_bias, unless q/k/v always have a bias (Qwen2)
    # one config key (and its default) for every bias (classic decoders)
    bias_switch: tuple[str, bool] | None = None
    # "head": q_norm / k_norm per head; "full": over the whole projection (OLMo-2/3); "tp": over the whole
    # projection, cut over tp with it (MiniMax-M2); a config key ("use_qk_norm"): per head when it is set
    # (GLM-4.5)
    qk_norm: str = ""
    # the config key of a low-rank query's width (Step3's share_q_dim): q_proj to that width, then a norm and
    # a per-head wq, with q/k/v one replicated table and one KV head (plan/attention.py low_rank_q)
    low_rank_q: str = ""
    # MLA's weights run as plain attention (MiniCPM3: minicpm3.py, not in vLLM's is_deepseek_mla): q_a_proj
    # and kv_a_proj_with_mqa two replicated tables, and every head's K and V cached, qk_nope + qk_rope wide
    # (V padded to it), not the latent
    mla_as_attention: bool = False
    # SwiGLU gate/up; False: one up projection (GPT-2 c_fc, NeoX dense_h_to_4h, Nemotron-H)
    gated_mlp: bool = True
    # the MLP's one fused gate_up_proj is a ColumnParallelLinear that all-gathers its 2 x intermediate output
    # (colwise_gather_output) and down_proj cuts it again (rowwise_split_input): GLM-4 on vLLM's backend
    mlp_gather: bool = False
    ffn_ratio: int = 0  # an MLP size the config may leave out: this many times hidden (classic decoders: 4)
    learned_positions: bool = False  # learned position embeddings of n_positions rows (GPT-2, GPTBigCode)
    # the router's e_score_correction_bias: "always", "noaux_tc" when topk_method is, or the config key that
    # switches it on (MiniMax-M2's use_routing_bias, LFM2-MoE's use_expert_bias)
    score_bias: str = ""
    router_fp32: bool = False  # the router and its bias are float32 on disk and on the GPU (MiniMax-M2)
    score_bias_fp32: bool = False  # ... the bias alone (LFM2-MoE)
    topk_method: str | None = None  # topk_method when the config does not say (DeepSeek-V3: noaux_tc)
    state_dtype: str = ""  # recurrent state dtype when the config does not say (Nemotron-H: float32)
    mixer_only: bool = False  # a pure SSM stack (mamba.py): no layer has an FFN
    # Zamba2: shared transformer blocks cycled over the hybrid layers (plan/shared_blocks.py); only those run
    # an MLP
    shared_blocks: bool = False
    mxfp4: bool = False  # reads MXFP4 expert checkpoints (gpt-oss), as vLLM does for it alone
    output_gate: bool = False  # attn_output_gate when the config does not say (Qwen3-Next, Qwen3.5)
    # max_model_len times the RoPE factor (Gemma-3's length already counts it)
    length_counts_rope: bool = True
    # --- layer kinds and windows
    full_attention_interval: int = 0  # the interval when the config does not say (Qwen3-Next: every 4th)
    sliding_pattern: int = 0  # every n-th layer full attention, the rest sliding (Gemma-2: 2, Gemma-3: 6)
    sliding_even: bool = False  # even layers slide whatever layer_types says (gpt-oss, as vLLM reads it)
    chunk: int = 0  # attention_chunk_size when the config does not say (Llama-4: 8192)
    global_attention: bool = False  # global layers with their own head size and KV heads (Gemma-4)
    # the last num_kv_shared_layers attend over an earlier layer's KV cache (Gemma-3n, Gemma-4)
    kv_sharing: bool = False
    window: str = ""  # a model-wide sliding_window: "model_wide" (every layer), or a Qwen rule (windows.py)
    window_flag: bool = False  # windows only when use_sliding_window is not false (the Qwen family)
    # Gated DeltaNet projections stored apart (Qwen3.5), not interleaved (Qwen3-Next)
    deltanet_split: bool = False
    # --- the plan's extra tensors and checks
    # "positions", "embed_norm", "layer_scalar", "sinks", "router_bias", "head_bias" (lm_head.bias),
    # "router_scales" (Gemma-4's router.scale and router.per_expert_scale), "altup_laurel" (Gemma-3n's
    # AltUp and LAuReL blocks: plan/per_layer.py), "head_gate" (Step-3.5's g_proj, when the config's
    # use_head_wise_attn_gate says so)
    extra: tuple[str, ...] = ()
    # routed experts' layout: "" gate/up/down, "stacked" (gpt-oss), "ungated" (Nemotron-H), "halves"
    # (Granite-MoE: stacked [experts, gate | up, hidden] and [experts, hidden, intermediate]), "transposed"
    # (Qwen3-VL-MoE, Llama-4: experts.gate_up_proj [experts, hidden, gate | up], experts.down_proj [experts,
    # intermediate, hidden], loaded transposed), "fused" (Gemma-4: "halves" named experts.gate_up_proj and
    # experts.down_proj, without .weight)
    experts: str = ""
    shared_reduce: bool = False  # the shared MLP all-reduces apart from the experts (Granite-4 hybrids)
    moe_tp_limit: bool = False  # vLLM's model file refuses tp above the expert count (Qwen MoE)
    # the forward all-gathers q/k/v and cuts it again by KV group (InternLM2): no KV-head replicas
    regroups_qkv: bool = False
    note: str = ""  # what the engine does with this architecture that the map alone does not show
    # the config's own name of a key its adapt renames (Falcon-H1's mamba_n_heads): errors say it
    config_keys: tuple[tuple[str, str], ...] = ()
    dense_replicated: str = ""  # the dense MLP is not split (GPTBigCode on vLLM's Transformers backend): why
    # vLLM's model file builds embed_tokens with no is_first_rank guard (qwen3_moe.py, mixtral.py, gemma*.py,
    # ...): every pipeline stage allocates and loads its slice of the table (checked in vLLM 0.28 and 0.33)
    embed_every_stage: bool = False
    # ... and its lm_head with no is_last_rank guard (jamba.py, in vLLM 0.28 and 0.33): every stage holds its
    # slice of the head too
    head_every_stage: bool = False
    # KimiMoE (Kimi-Linear): each GPU's share of moe_intermediate_size is padded up to this when tp cuts it
    # finer (without expert parallelism); the padding is zeros
    moe_min_partition: int = 0
    # False: the model class lacks SupportsPP, so vLLM 0.33 refuses pipeline parallelism (Gemma-3n)
    pp: bool = True
    # (layout, spec) -> why vLLM's model file runs this layout otherwise than the map draws it, or None
    layout_problem: Callable | None = None
    # --- Run live
    live: str = ""  # the live block that runs it: llama, olmo, gemma2, gemma3, gpt_oss, mla ("" does not run)
    live_moe: bool = False  # the live MoE block runs its routed experts
    live_shared: bool = False  # ... and its shared experts
    needs_experts: bool = False  # a config without routed experts is no such model (Mixtral)
    renormalize_default: bool = False  # norm_topk_prob when the config does not say (DeepSeek-V3: true)
    # "": softmax top-k; "fp32": in float32, always renormalized (Mixtral); "v2" / "v3": DeepSeek's
    routing: str = ""
    # grouped top-k (V3: sigmoid scores with e_score_correction_bias)
    hf_partial_rotary: bool = False  # transformers' own model turns partial_rotary_factor (Phi-3) too
    hf_extra: tuple[tuple[str, object], ...] = ()  # extra keys of a random checkpoint's config.json
    # --- other engines
    sglang: Groups | None = None  # SGLang 0.5.23's model file and its weight groups (None: not modelled)

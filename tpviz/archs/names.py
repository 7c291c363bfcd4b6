"""Checkpoint names of each architecture, as data; '*' is the layer (or expert) index."""
from dataclasses import dataclass


@dataclass(frozen=True)
class Names:
    embed: str = "model.embed_tokens.weight"
    lm_head: str = "lm_head.weight"
    final_norm: str = "model.norm"
    layer: str = "model.layers.*."
    block_norms: tuple = ()  # held by every layer (Nemotron-H's one norm per block)
    mixer_norms: tuple = ("input_layernorm",)  # held by a layer that has a mixer
    ffn_norms: tuple = ("post_attention_layernorm",)  # held by a layer that has an FFN
    # LayerNorm (weight and bias) instead of RMSNorm; "weight": a LayerNorm without bias (Cohere)
    norm_bias: bool | str = False
    attn: str = "self_attn."
    q: str = "q_proj"
    k: str = "k_proj"
    v: str = "v_proj"
    o: str = "o_proj"
    qkv_fused: str | None = None  # fused on disk (Phi-3, ChatGLM, the classic decoders)
    # how a fused qkv is laid out on disk: qkv, per_head (NeoX, BLOOM), per_kv_group (Falcon), or
    # per_kv_group_as_qkv (InternLM2: per KV group on disk, loaded as if qkv)
    qkv_order: str = "qkv"
    conv1d: bool = False  # GPT-2 style Conv1D weights, stored transposed [in, out]
    q_norm: str = "q_norm"
    k_norm: str = "k_norm"
    mlp: str = "mlp."
    moe: str = ""  # the MoE block's prefix where it is not mlp's (Kimi-Linear: block_sparse_moe.)
    gate: str = "gate_proj"
    up: str = "up_proj"  # the single up projection of an ungated MLP too
    down: str = "down_proj"
    gate_up_fused: str | None = None
    router: str = "gate"
    score_bias: str = ""  # the router's e_score_correction_bias, when not under the router (MiniMax-M2)
    score_bias_rows: int = 0  # ... stored with this leading dim (ERNIE-4.5's [1, experts])
    experts: str = "experts.*."
    expert_gate_up: tuple = ("gate_proj", "up_proj")
    expert_down: str = "down_proj"
    shared: str = "shared_expert."
    shared_outside: bool = False  # the shared MLP sits beside the MoE block, under the layer (Granite-4)
    shared_fused: str | None = None  # its gate/up fused on disk (Granite-4's input_linear)
    shared_down: str = "down_proj"
    shared_gate: str | None = None
    shared_size_key: str = "shared_expert_intermediate_size"  # the config key of its size (Gemma-4's MLP)
    linear_attn: str = "linear_attn."  # Gated DeltaNet
    mamba: str = "mixer."
    conv: str = "conv."


LLAMA = Names()

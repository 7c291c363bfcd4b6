"""Checkpoint names of each architecture, as data; '*' is the layer (or expert) index."""
from dataclasses import dataclass, replace


@dataclass(frozen=True)
class Names:
    embed: str = "model.embed_tokens.weight"
    lm_head: str = "lm_head.weight"
    final_norm: str = "model.norm"
    layer: str = "model.layers.*."
    block_norms: tuple = ()  # held by every layer (Nemotron-H's one norm per block)
    mixer_norms: tuple = ("input_layernorm",)  # held by a layer that has a mixer
    ffn_norms: tuple = ("post_attention_layernorm",)  # held by a layer that has an FFN
    norm_bias: bool = False  # LayerNorm (weight and bias) instead of RMSNorm
    attn: str = "self_attn."
    q: str = "q_proj"
    k: str = "k_proj"
    v: str = "v_proj"
    o: str = "o_proj"
    qkv_fused: str | None = None  # fused on disk (Phi-3, ChatGLM, the classic decoders)
    qkv_order: str = "qkv"  # how a fused qkv is laid out on disk: qkv, per_head (NeoX, BLOOM), per_kv_group (Falcon)
    conv1d: bool = False  # GPT-2 style Conv1D weights, stored transposed [in, out]
    q_norm: str = "q_norm"
    k_norm: str = "k_norm"
    mlp: str = "mlp."
    gate: str = "gate_proj"
    up: str = "up_proj"  # the single up projection of an ungated MLP too
    down: str = "down_proj"
    gate_up_fused: str | None = None
    router: str = "gate"
    experts: str = "experts.*."
    expert_gate_up: tuple = ("gate_proj", "up_proj")
    expert_down: str = "down_proj"
    shared: str = "shared_expert."
    shared_gate: str | None = None
    linear_attn: str = "linear_attn."  # Gated DeltaNet
    mamba: str = "mixer."
    conv: str = "conv."


LLAMA = Names()
GEMMA2 = replace(LLAMA, mixer_norms=("input_layernorm", "post_attention_layernorm"),
                 ffn_norms=("pre_feedforward_layernorm", "post_feedforward_layernorm"))
OLMO2 = replace(LLAMA, mixer_norms=("post_attention_layernorm",), ffn_norms=("post_feedforward_layernorm",))  # post-norm
ARCH_NAMES = {
    "phi3": replace(LLAMA, qkv_fused="qkv_proj", gate_up_fused="gate_up_proj"),
    "mixtral": replace(LLAMA, mlp="block_sparse_moe.", expert_gate_up=("w1", "w3"), expert_down="w2"),
    "qwen2_moe": replace(LLAMA, shared_gate="shared_expert_gate"),
    "qwen3_next": replace(LLAMA, shared_gate="shared_expert_gate"),
    "deepseek_v3": replace(LLAMA, shared="shared_experts."),
    "deepseek_v2": replace(LLAMA, shared="shared_experts."),
    "olmo2": OLMO2, "olmo3": OLMO2,
    "gemma2": GEMMA2, "gemma3": GEMMA2, "gemma3_text": GEMMA2, "gemma4": GEMMA2, "gemma4_text": GEMMA2,
    "gpt_oss": replace(LLAMA, router="router", experts="experts.", expert_gate_up=("gate_up_proj",)),
    "nemotron_h": replace(LLAMA, embed="backbone.embeddings.weight", final_norm="backbone.norm_f",
                          layer="backbone.layers.*.", block_norms=("norm",), mixer_norms=(), ffn_norms=(),
                          attn="mixer.", mlp="mixer.", shared="shared_experts.", mamba="mixer."),
    "lfm2": replace(LLAMA, final_norm="model.embedding_norm", mixer_norms=("operator_norm",), ffn_norms=("ffn_norm",),
                    o="out_proj", q_norm="q_layernorm", k_norm="k_layernorm", mlp="feed_forward.", gate="w1", up="w3",
                    down="w2"),
    "chatglm": replace(LLAMA, embed="transformer.embedding.word_embeddings.weight",
                       lm_head="transformer.output_layer.weight", final_norm="transformer.encoder.final_layernorm",
                       layer="transformer.encoder.layers.*.", attn="self_attention.", qkv_fused="query_key_value",
                       o="dense", gate_up_fused="dense_h_to_4h", down="dense_4h_to_h"),
}

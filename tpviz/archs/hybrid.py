"""Hybrid and heterogeneous decoders: Nemotron-H (Mamba2, attention and MoE layers by pattern; vLLM 0.33
models/nemotron_h.py) and pure Mamba2 as its pattern of 'M' (models/mamba2.py), LFM2 (short convolutions
and attention; models/lfm2.py) and its MoE (models/lfm2_moe.py), and ChatGLM (fused q/k/v with multi-query
groups; models/chatglm.py)."""
from dataclasses import replace

from tpviz.archs.base import Arch
from tpviz.archs.names import LLAMA
from tpviz.config.fields import read_int
from tpviz.errors import ConfigError

NEMOTRON_H = replace(LLAMA, embed="backbone.embeddings.weight", final_norm="backbone.norm_f",
                     layer="backbone.layers.*.", block_norms=("norm",), mixer_norms=(),
                     ffn_norms=(), attn="mixer.", mlp="mixer.", shared="shared_experts.", mamba="mixer.")
LFM2 = replace(LLAMA, final_norm="model.embedding_norm", mixer_norms=("operator_norm",),
               ffn_norms=("ffn_norm",), o="out_proj", q_norm="q_layernorm", k_norm="k_layernorm",
               mlp="feed_forward.", gate="w1", up="w3", down="w2")
LFM2_MOE = replace(LFM2, expert_gate_up=("w1", "w3"), expert_down="w2", score_bias="expert_bias")
CHATGLM = replace(LLAMA, embed="transformer.embedding.word_embeddings.weight",
                  lm_head="transformer.output_layer.weight", final_norm="transformer.encoder.final_layernorm",
                  layer="transformer.encoder.layers.*.", attn="self_attention.", qkv_fused="query_key_value",
                  o="dense", gate_up_fused="dense_h_to_4h", down="dense_4h_to_h")


def nemotron_h_fields(cfg: dict) -> dict:
    """Per-MLP-layer sizes (resolved by the pattern reader), the shared experts' total size; latent MoE
    refused."""
    if isinstance(cfg.get("intermediate_size"), list):
        cfg["mlp_sizes"] = [read_int({"intermediate_size": v}, "intermediate_size")
                            for v in cfg["intermediate_size"]]
        cfg["intermediate_size"] = max(cfg["mlp_sizes"], default=None)
    shared, count = cfg.get("moe_shared_expert_intermediate_size"), cfg.get("n_shared_experts")
    if count and shared is not None:
        cfg["shared_expert_intermediate_size"] = read_int(cfg,
                                                          "moe_shared_expert_intermediate_size") * read_int(
            cfg, "n_shared_experts")
    cfg["n_shared_experts"] = None
    if cfg.get("moe_latent_size"):
        raise ConfigError("moe_latent_size (latent MoE) is set; tpviz does not model "
                          "latent MoE projections yet")
    return cfg


def mamba2_fields(cfg: dict) -> dict:
    """Mamba2ForCausalLM (vLLM 0.33 models/mamba2.py): every layer is Nemotron-H's 'M' (the same MambaMixer2
    and backbone. names); Mamba2Config's num_heads and head_dim are the mixer's, whose width is expand x
    hidden_size. No layer attends: the attention counts every config gives are set to the mixer's heads, and
    no plan reads them."""
    n, hidden = read_int(cfg, "num_hidden_layers"), read_int(cfg, "hidden_size")
    heads, head = read_int(cfg, "num_heads"), read_int(cfg, "head_dim", default=64)
    width = read_int(cfg, "intermediate_size", default=read_int(cfg, "expand", default=2) * hidden)
    if heads * head != width:
        raise ConfigError(f"num_heads={heads} x head_dim={head} is not expand x hidden_size={width}, "
                          "the width vLLM 0.33's MambaMixer2 splits into heads")
    out = {k: v for k, v in cfg.items() if k not in ("num_heads", "head_dim", "num_key_value_heads")}
    return {**out, "hybrid_override_pattern": "M" * n, "mamba_num_heads": heads, "mamba_head_dim": head,
            "ssm_state_size": read_int(cfg, "state_size", default=128), "num_attention_heads": heads,
            "mamba_rms_norm": True}  # mamba2.py builds the gated norm with its weight whatever rms_norm says


def lfm2_fields(cfg: dict) -> dict:
    """LFM2's MLP size: block_ff_dim, adjusted to 2/3, times the multiplier, rounded up to
    block_multiple_of."""
    size = read_int(cfg, "block_ff_dim", default=cfg.get("intermediate_size"))
    if cfg.get("block_auto_adjust_ff_dim", True):
        size = int(2 * size / 3)
        mult = cfg.get("block_ffn_dim_multiplier")
        if mult is not None:
            if isinstance(mult, bool) or not isinstance(mult, (int, float)) or mult <= 0:
                raise ConfigError(f"block_ffn_dim_multiplier={mult!r} must be a positive number")
            size = int(mult * size)
        of = read_int(cfg, "block_multiple_of", default=256)
        size = of * ((size + of - 1) // of)
    cfg["intermediate_size"] = size
    return cfg


def lfm2_moe_fields(cfg: dict) -> dict:
    """LFM2-MoE (vLLM 0.33 models/lfm2_moe.py): the first num_dense_layers hold a dense MLP of
    intermediate_size as given (no LFM2 adjustment), the rest routed experts of moe_intermediate_size, with
    expert_bias when use_expert_bias; layer_types alone says which layers attend; logits always come from
    embed_tokens."""
    if not isinstance(cfg.get("layer_types"), list):
        raise ConfigError("config is missing layer_types, which vLLM 0.33's lfm2_moe.py reads for every "
                          "layer (conv or full_attention)")
    return {**cfg, "first_k_dense_replace": read_int(cfg, "num_dense_layers", default=0, minimum=0),
            "tie_word_embeddings": True}


def chatglm_kv(cfg: dict, heads: int, kv: int) -> int:
    """ChatGLM without multi-query attention runs one KV head per query head."""
    return heads if cfg.get("multi_query_attention") is False and cfg.get("multi_query") is not True else kv


RECORDS = [
    Arch("nemotron_h", "NemotronHForCausalLM", NEMOTRON_H, adapt=nemotron_h_fields, gated_mlp=False,
         score_bias="always", state_dtype="float32", experts="ungated", embed_every_stage=True,
         unmodelled=(("use_bias", "Mamba2 in_proj / out_proj biases (nemotron_h.py passes use_bias)"),)),
    # mamba2.py: a pure Mamba2 stack (Mamba-Codestral); embeddings, lm_head and norm_f unguarded by stage
    Arch("mamba2", "Mamba2ForCausalLM", NEMOTRON_H, adapt=mamba2_fields, gated_mlp=False,
         unmodelled=(("use_bias", "Mamba2 in_proj / out_proj biases"),), embed_every_stage=True,
         head_every_stage=True, config_keys=(("mamba_num_heads", "num_heads"),)),
    Arch("lfm2", "Lfm2ForCausalLM", LFM2, adapt=lfm2_fields, tied=True, qk_norm="head",
         embed_every_stage=True),
    # the router is in the model's dtype, its correction bias float32; tp above num_experts is refused
    Arch("lfm2_moe", "Lfm2MoeForCausalLM", LFM2_MOE, adapt=lfm2_moe_fields, tied=True, qk_norm="head",
         score_bias="use_expert_bias", score_bias_fp32=True, moe_tp_limit=True, embed_every_stage=True),
    Arch("chatglm", "ChatGLMModel", CHATGLM, kv_heads=chatglm_kv, embed_every_stage=True),
]

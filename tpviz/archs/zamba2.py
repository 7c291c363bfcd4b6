"""Zamba2 (vLLM 0.33 models/zamba2.py): Mamba2 layers, and hybrid layers where a shared transformer block
(attention over [hidden | the embeddings], 2 x hidden wide, then a gated MLP) runs before the layer's Mamba2.

num_mem_blocks such blocks are cycled over the hybrid layers: block k is stored once, under the k-th hybrid
layer (model.layers.N.shared_transformer.*), and run by every hybrid layer j with j % num_mem_blocks == k.
Each hybrid layer j owns a LoRA adapter per shared projection (A whole then gathered, B column-parallel),
stored in its block as ...adapter_list.j.{0,1}, a replicated `linear` and its own KV cache
(plan/shared_blocks.py). The embedding is always tied, as the model file ties it."""
from dataclasses import replace

from tpviz.archs.base import Arch
from tpviz.archs.names import LLAMA
from tpviz.config.fields import read_int
from tpviz.errors import ConfigError

ZAMBA2 = replace(LLAMA, final_norm="model.final_layernorm", mixer_norms=(), ffn_norms=(), mamba="mamba.",
                 mlp="shared_transformer.feed_forward.", gate_up_fused="gate_up_proj",
                 attn="shared_transformer.self_attn.")
HYBRID, MAMBA = "hybrid", ("mamba", "linear_attention")  # transformers renames mamba linear_attention


def zamba2_fields(cfg: dict) -> dict:
    """Zamba2Config's keys (as transformers derives them: attention 2 x hidden wide, mamba_headdim) under the
    names the readers know; what zamba2.py raises or cannot load is refused in one line."""
    n, hidden = read_int(cfg, "num_hidden_layers"), read_int(cfg, "hidden_size")
    if cfg.get("quantization_config"):
        raise ConfigError("a quantized Zamba2 checkpoint: tpviz maps Zamba2 in its unquantized dtypes only")
    kinds = cfg.get("layers_block_type")
    if not isinstance(kinds, list) or len(kinds) != n or any(k not in MAMBA + (HYBRID,) for k in kinds):
        raise ConfigError(f"layers_block_type must list 'mamba' or 'hybrid' for each of the {n} layers")
    listed = cfg.get("hybrid_layer_ids")  # zamba2.py numbers adapters by it (transformers keeps it as given)
    if listed is not None and listed != [i for i, k in enumerate(kinds) if k == HYBRID]:
        raise ConfigError(f"hybrid_layer_ids={str(listed)[:60]} does not list layers_block_type's hybrid "
                          "layers, which vLLM 0.33's Zamba2Model needs")
    heads = read_int(cfg, "num_attention_heads")
    head_dim = read_int(cfg, "attention_head_dim", default=2 * hidden // heads)
    if heads * head_dim != 2 * hidden:  # Zamba2Attention raises this
        raise ConfigError(f"num_attention_heads={heads} x attention_head_dim={head_dim} is not "
                          f"attention_hidden_size={2 * hidden} (2 x hidden_size), as vLLM 0.33's "
                          "Zamba2Attention requires")
    if read_int(cfg, "num_key_value_heads", default=heads) != heads:
        raise ConfigError(f"num_key_value_heads={cfg['num_key_value_heads']}: vLLM 0.33's Zamba2Attention "
                          f"builds one KV head per query head ({heads}), so it cannot load fewer")
    if cfg.get("hidden_act", "gelu") != "gelu":
        raise ConfigError(f"hidden_act={cfg['hidden_act']!r}: vLLM 0.33's Zamba2MLP supports gelu only")
    if cfg.get("use_shared_mlp_adapter") is False:
        raise ConfigError("use_shared_mlp_adapter=false: vLLM 0.33's Zamba2MLP always builds the gate_up "
                          "adapters, which such a checkpoint lacks")
    inner, mheads = read_int(cfg, "mamba_expand", default=2) * hidden, read_int(cfg, "n_mamba_heads")
    if inner % mheads:
        raise ConfigError(f"n_mamba_heads={mheads} does not divide mamba_expand x hidden_size={inner}")
    blocks = read_int(cfg, "num_mem_blocks", default=1)
    hybrid = kinds.count(HYBRID)
    if not hybrid:
        raise ConfigError("layers_block_type has no hybrid layer: a Zamba2 runs its shared blocks in them")
    if blocks > hybrid:
        raise ConfigError(f"num_mem_blocks={blocks} but only {hybrid} hybrid layers run a shared block")
    return {**cfg, "layer_types": ["parallel_hybrid" if k == HYBRID else "mamba" for k in kinds],
            "num_key_value_heads": heads, "head_dim": head_dim, "mamba_num_heads": mheads,
            "mamba_head_dim": inner // mheads, "n_groups": read_int(cfg, "mamba_ngroups", default=1),
            "ssm_state_size": read_int(cfg, "mamba_d_state", default=64),
            "conv_kernel": read_int(cfg, "mamba_d_conv", default=4),
            "intermediate_size": read_int(cfg, "intermediate_size", default=4 * hidden),
            "use_conv_bias": cfg.get("use_conv_bias", True) is not False, "tie_word_embeddings": True,
            "shared_blocks": blocks, "adapter_rank": read_int(cfg, "adapter_rank", default=128),
            "attention_adapters": cfg.get("use_shared_attention_adapter") is True}


RECORDS = [
    Arch("zamba2", "Zamba2ForCausalLM", ZAMBA2, adapt=zamba2_fields, qkv_bias=False, o_bias=False, tied=True,
         shared_blocks=True, pp=False, hf_extra=(("use_shared_mlp_adapter", True),),
         config_keys=(("mamba_num_heads", "n_mamba_heads"), ("n_groups", "mamba_ngroups")),
         unmodelled=(("add_bias_linear", "linear-layer biases"),),
         note="Zamba2's shared transformer blocks are stored once and run by every num_mem_blocks-th hybrid "
              "layer: their weights count once, their KV cache and compute once per hybrid layer"),
]

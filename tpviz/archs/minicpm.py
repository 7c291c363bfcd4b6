"""MiniCPM (vLLM 0.33 models/minicpm.py) and MiniCPM3 (models/minicpm3.py).

MiniCPM is a Llama decoder whose muP scalings (scale_emb on the embedding, scale_depth / sqrt(layers) on each
residual branch, hidden_size / dim_model_base before the head) change no weight. Its attention takes
head_dim = hidden_size // num_attention_heads whatever the config says; its MLP runs silu or fatrelu. With
num_experts > 0 every layer's MLP is MiniCPMMoE, not FusedMoE: experts.<e>.w1 / w3 load into one stacked
mlp.ws [experts, 2 x intermediate_size / tp, hidden] and w2 into mlp.w2s [experts, hidden, intermediate_size /
tp], each expert cut over tp like a gate/up and down pair, with a replicated router (mlp.gate); each expert is
intermediate_size wide (moe_intermediate_size is not read). transformers has no MiniCPM class (the checkpoint
ships its own config code), so the config is read as given, with that code's tie_word_embeddings default.

MiniCPM3 is the same decoder under DeepSeek-V2's latent attention weights (q_a_proj and kv_a_proj_with_mqa two
ReplicatedLinears, q_b_proj and kv_b_proj per head, o_proj), which vLLM runs as plain attention: it caches
every head's K and V (qk_nope + qk_rope wide, V padded to it), not the latent (minicpm3 is not in
is_deepseek_mla).
Both build embed_tokens (and the lm_head) on every pipeline stage.
"""
from dataclasses import replace

from tpviz.archs.base import Arch
from tpviz.archs.glm import required
from tpviz.archs.names import LLAMA
from tpviz.config.fields import read_int
from tpviz.errors import ConfigError
from tpviz.rules.sglang_files import Groups

MINICPM_MOE = replace(LLAMA, expert_gate_up=("w1", "w3"), expert_down="w2")
# keys other readers take for layer kinds, windows and experts that vLLM's MiniCPM never reads
IGNORED = ("moe_intermediate_size", "first_k_dense_replace", "moe_layer_freq", "decoder_sparse_step",
           "mlp_only_layers", "moe_layers", "interleave_moe_layer_step", "shared_expert_intermediate_size",
           "n_shared_experts", "num_local_experts", "n_routed_experts", "moe_num_experts",
           "experts_per_token", "moe_topk", "layer_types", "sliding_window", "use_sliding_window")
MLA_KEYS = ("kv_lora_rank", "q_lora_rank")  # minicpm.py builds plain attention whatever they say


def minicpm_fields(cfg: dict, model_file: str = "minicpm.py") -> dict:
    """The config as vLLM's MiniCPM reads it: head_dim from hidden_size, silu or fatrelu, and the experts'
    width intermediate_size."""
    act = cfg.get("hidden_act", "silu")
    if act not in ("silu", "fatrelu"):
        raise ConfigError(f"hidden_act={act!r}: vLLM 0.33's MiniCPMMLP runs silu or fatrelu alone")
    out = {k: v for k, v in cfg.items() if k not in IGNORED}
    if model_file == "minicpm.py":
        hidden, heads = read_int(cfg, "hidden_size"), read_int(cfg, "num_attention_heads")
        if hidden % heads:
            raise ConfigError(f"hidden_size={hidden} is not divisible by num_attention_heads={heads}: vLLM "
                              "0.33's MiniCPMAttention takes hidden_size // num_attention_heads as head_dim")
        out = {k: v for k, v in out.items() if k not in MLA_KEYS} | {"head_dim": hidden // heads}
    if read_int(cfg, "num_experts", default=0, minimum=0):
        required(cfg, "num_experts_per_tok", model_file, "MiniCPM's own config code")
        if cfg.get("quantization_config"):
            raise ConfigError("a quantized MiniCPM MoE: vLLM 0.33's MiniCPMMoE builds its experts without "
                              "the quantization config, so quantized expert tensors do not load")
        out["moe_intermediate_size"] = cfg.get("intermediate_size")  # each expert is this wide
    return out


def minicpm3_fields(cfg: dict) -> dict:
    """MiniCPM3 reads the MLA ranks as given; q_lora_rank is required (q_a_proj is always built)."""
    if not cfg.get("q_lora_rank"):
        raise ConfigError(f"q_lora_rank={cfg.get('q_lora_rank')!r}: vLLM 0.33's MiniCPM3Attention always "
                          "builds q_a_proj to q_lora_rank")
    return minicpm_fields(cfg, "minicpm3.py")


def own_moe_block(layout, spec) -> str | None:
    """MiniCPMMoE cuts each expert over the tp GPUs alone (it is not FusedMoE): data-parallel replicas each
    hold every expert's tp cut, and expert parallelism has no effect; neither is drawn, so both are
    refused."""
    if spec.is_moe and (layout.dp > 1 or layout.ep):
        return ("MiniCPM's MoE block (MiniCPMMoE, not FusedMoE) cuts every expert over tp alone: its data-"
                "parallel replicas and --enable-expert-parallel are not modelled")
    return None


_MINICPM = dict(tied=True, qkv_bias=False, o_bias=False, embed_every_stage=True, head_every_stage=True,
                layout_problem=own_moe_block,
                note="MiniCPM's muP scalings (scale_emb, scale_depth, dim_model_base) change no weight")


def sgl_minicpm(spec, layout) -> str | None:
    """SGLang's minicpm.py: MiniCPMMLP in every layer (silu alone), head_dim read from the config."""
    if spec.is_moe:
        return ("builds a dense MLP in every layer (no MiniCPMMoE), so this checkpoint's experts would not "
                "load; vLLM rules map it")
    if spec.hidden_act != "silu":
        return f"runs silu alone (hidden_act={spec.hidden_act!r}); vLLM rules map it"
    head_dim = spec.config.get("head_dim")
    if head_dim is not None and head_dim != spec.hidden_size // spec.num_attention_heads:
        return (f"takes the config's head_dim={head_dim} where vLLM takes hidden_size // "
                "num_attention_heads: not modelled")
    return None


RECORDS = [
    Arch("minicpm", "MiniCPMForCausalLM", MINICPM_MOE, adapt=minicpm_fields,
         sglang=Groups("minicpm.py", pp=False, check=sgl_minicpm), **_MINICPM),
    Arch("minicpm3", "MiniCPM3ForCausalLM", MINICPM_MOE, adapt=minicpm3_fields, mla_as_attention=True,
         **_MINICPM),
]

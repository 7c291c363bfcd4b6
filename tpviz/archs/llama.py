"""Llama and the decoders vLLM 0.33 runs as Llama (models/llama.py): Mistral, Mixtral, Phi-3, Llama-4, and
Llama-Nemotron's heterogeneous blocks (models/nemotron_nas.py)."""
from dataclasses import replace

from tpviz.archs.base import Arch
from tpviz.rules.sglang import Groups
from tpviz.archs.names import LLAMA

MIXTRAL = replace(LLAMA, mlp="block_sparse_moe.", expert_gate_up=("w1", "w3"), expert_down="w2")
PHI3 = replace(LLAMA, qkv_fused="qkv_proj", gate_up_fused="gate_up_proj")


def llama4_fields(cfg: dict) -> dict:
    """Llama-4: the experts and the shared expert use intermediate_size, the dense MLP intermediate_size_mlp;
    every 4th layer is NoPE when no_rope_layers is not given (transformers' default)."""
    n = cfg.get("num_hidden_layers")
    if not cfg.get("no_rope_layers") and isinstance(n, int) and 0 < n <= 100_000:
        cfg["no_rope_layers"] = [int((i + 1) % cfg.get("no_rope_layer_interval", 4) != 0) for i in range(n)]
    size = cfg.get("intermediate_size", 8192)
    cfg.update(moe_intermediate_size=size, shared_expert_intermediate_size=size,
               intermediate_size=cfg.get("intermediate_size_mlp", 16384))
    return cfg


RECORDS = [
    Arch("llama", live="llama", sglang=Groups("llama.py", lm_head="attn_tp", head_every_stage=True)),
    # MistralForCausalLM / MixtralForCausalLM: no attention biases whatever the config says (transformers'
    # models)
    Arch("mistral", "MistralForCausalLM", qkv_bias=False, o_bias=False, window="model_wide", live="llama",
         sglang=Groups("mistral.py (llama.py's LlamaForCausalLM)", lm_head="attn_tp", head_every_stage=True)),
    Arch("mixtral", "MixtralForCausalLM", MIXTRAL, qkv_bias=False, o_bias=False,
         window="model_wide", live="llama", live_moe=True, needs_experts=True, routing="fp32",
         sglang=Groups("mixtral.py", head_every_stage=True)),
    Arch("phi3", "Phi3ForCausalLM", PHI3, window="model_wide", live="llama", hf_partial_rotary=True,
         # transformers' 32000 may lie past the vocab
         hf_extra=(("pad_token_id", None), ("eos_token_id", None))),
    Arch("llama4", "Llama4ForConditionalGeneration", text_model="llama4_text",
         adapt=llama4_fields, chunk=8192),
    Arch("llama4_text", "Llama4ForCausalLM", adapt=llama4_fields, chunk=8192),
    Arch("nemotron-nas", "DeciLMForCausalLM"),  # its block_configs give each layer's attention and FFN
]

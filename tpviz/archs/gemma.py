"""Gemma 1-4 (vLLM 0.33 models/gemma*.py): tied embeddings, four norms a block from Gemma-2 on, sliding layers
in a fixed pattern, and Gemma-4's global layers with their own head size and K = V."""
from dataclasses import replace

from tpviz.archs.base import Arch
from tpviz.rules.sglang import Groups
from tpviz.archs.names import LLAMA

GEMMA2 = replace(LLAMA, mixer_norms=("input_layernorm", "post_attention_layernorm"),
                 ffn_norms=("pre_feedforward_layernorm", "post_feedforward_layernorm"))
# parts of Gemma-4 tpviz does not model, by the config field that reveals them: refused, never drawn as
# attention
GEMMA4_UNMODELLED = (("num_kv_shared_layers", "KV-shared layers"),
                     ("num_experts", "MoE blocks beside the MLP"),
                     ("hidden_size_per_layer_input", "per-layer input embeddings"))
_GEMMA3 = dict(names=GEMMA2, tied=True, qk_norm="head", sliding_pattern=6,
               length_counts_rope=False, live="gemma3",
               sglang=Groups("gemma3_causal.py", embed="replicated", pp=False))
_GEMMA4 = dict(names=GEMMA2, tied=True, qk_norm="head", global_attention=True, unmodelled=GEMMA4_UNMODELLED,
               extra=("layer_scalar",))

RECORDS = [
    Arch("gemma", "GemmaForCausalLM", tied=True),
    Arch("gemma2", "Gemma2ForCausalLM", GEMMA2, tied=True, sliding_pattern=2, live="gemma2",
         sglang=Groups("gemma2.py", pp=False)),
    Arch("gemma3", "Gemma3ForConditionalGeneration", text_model="gemma3_text", tower="siglip", **_GEMMA3),
    Arch("gemma3_text", "Gemma3ForCausalLM", **_GEMMA3),
    Arch("gemma4", "Gemma4ForConditionalGeneration", text_model="gemma4_text", **_GEMMA4),
    Arch("gemma4_text", "Gemma4ForCausalLM", **_GEMMA4),
]

"""Post-norm blocks (a norm after attention and after the MLP, none before): OLMo-2 and OLMo-3 (vLLM 0.33's
Transformers backend), whose q/k norms span all heads; EXAONE-4 (models/exaone4.py), whose q/k norms are per
head and whose layer_types window three layers in four."""
from dataclasses import replace

from tpviz.archs.base import Arch
from tpviz.archs.names import LLAMA

OLMO2 = replace(LLAMA, mixer_norms=("post_attention_layernorm",), ffn_norms=("post_feedforward_layernorm",))

RECORDS = [
    Arch("olmo2", "Olmo2ForCausalLM", OLMO2, qk_norm="full", live="olmo"),
    Arch("olmo3", "Olmo3ForCausalLM", OLMO2, qk_norm="full", live="olmo"),
    Arch("exaone4", "Exaone4ForCausalLM", OLMO2, qk_norm="head"),
]

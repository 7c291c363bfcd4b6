"""Post-norm blocks (a norm after attention and after the MLP, none before): OLMo-2 and OLMo-3 (vLLM 0.33's
Transformers backend), whose q/k norms span all heads; EXAONE-4 (models/exaone4.py), whose q/k norms are per
head and whose layer_types window three layers in four."""
from dataclasses import replace

from tpviz.archs.base import Arch
from tpviz.archs.names import LLAMA
from tpviz.archs.sgl_checks import derived_head_dim
from tpviz.rules.sglang_files import Groups

OLMO2 = replace(LLAMA, mixer_norms=("post_attention_layernorm",), ffn_norms=("post_feedforward_layernorm",))


def sgl_exaone4(spec, layout) -> str | None:
    """SGLang's exaone4.py: q/k/v/o over the attention group, heads counted over the whole tp, head_dim
    hidden_size // heads, and sliding layers read from a string pattern."""
    if layout.attn_dp > 1:
        return ("cuts q/k/v/o over the attention group but counts its heads over the whole --tp, so "
                f"--attn-dp-size {layout.attn_dp} fails its first forward; use --attn-dp-size 1")
    # transformers' Exaone4Config: the int 4 unless the config says otherwise, 0 without a window
    pattern = spec.config.get("sliding_window_pattern", 4) if spec.config.get("sliding_window") else 0
    if pattern and not isinstance(pattern, (str, list)):
        return (f"takes len() of sliding_window_pattern, which must be a string such as 'LLLG' (this "
                f"config's is {pattern!r})")
    return derived_head_dim(spec, layout)


RECORDS = [
    Arch("olmo2", "Olmo2ForCausalLM", OLMO2, qk_norm="full", live="olmo"),
    Arch("olmo3", "Olmo3ForCausalLM", OLMO2, qk_norm="full", live="olmo"),
    Arch("exaone4", "Exaone4ForCausalLM", OLMO2, qk_norm="head",
         sglang=Groups("exaone4.py", "attn_tp", lm_head="attn_tp", head_every_stage=True, check=sgl_exaone4)),
]

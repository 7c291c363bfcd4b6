"""The classic decoders (GPT-2, GPTBigCode, GPT-NeoX, BLOOM, Falcon, StarCoder2): names and their extra tensors."""
from dataclasses import replace

from tpviz.plan.core import ParamPlan, norm, replicated
from tpviz.archs.names import LLAMA, Names

_GPT = replace(LLAMA, embed="transformer.wte.weight", lm_head="lm_head.weight", final_norm="transformer.ln_f",
               layer="transformer.h.*.", mixer_norms=("ln_1",), ffn_norms=("ln_2",), norm_bias=True, attn="attn.",
               qkv_fused="c_attn", o="c_proj", up="c_fc", down="c_proj")
_NEOX = replace(LLAMA, embed="gpt_neox.embed_in.weight", lm_head="embed_out.weight",
                final_norm="gpt_neox.final_layer_norm", layer="gpt_neox.layers.*.", norm_bias=True,
                attn="attention.", qkv_fused="query_key_value", qkv_order="per_head_plain", o="dense",
                up="dense_h_to_4h", down="dense_4h_to_h")
_BLOOM = replace(_NEOX, qkv_order="per_head", embed="transformer.word_embeddings.weight", lm_head="lm_head.weight",
                 final_norm="transformer.ln_f", layer="transformer.h.*.", attn="self_attention.")
CLASSIC_NAMES = {
    "gpt2": replace(_GPT, embed="wte.weight", final_norm="ln_f", layer="h.*.", conv1d=True),
    "gpt_bigcode": _GPT,
    "gpt_neox": _NEOX,
    "bloom": _BLOOM,
    "falcon": replace(_BLOOM, qkv_order="qkv"),
    "starcoder2": replace(LLAMA, norm_bias=True, up="c_fc", down="c_proj"),
}
MAX_POSITIONS = 1 << 22


def falcon_names(variant: str, kv_heads: int) -> Names:
    """Falcon's norms and fused q/k/v order depend on the decoder variant (spec.falcon_variant)."""
    base = CLASSIC_NAMES["falcon"]
    if variant.startswith("new"):
        norms = ("ln_attn", "ln_mlp") if variant == "new-2ln" else ("input_layernorm",)
        return replace(base, qkv_order="per_kv_group", mixer_norms=norms, ffn_norms=())
    return replace(base, qkv_order="qkv" if kv_heads == 1 else "per_head",  # 7B's multi-query: [q heads | k | v]
                   ffn_norms=() if variant == "parallel" else ("post_attention_layernorm",))


def extra_globals(spec, names: Names) -> list[ParamPlan]:
    """Model-wide tensors beyond embed, lm_head and the final norm: learned positions, BLOOM's embedding norm."""
    plans = []
    if spec.model_type in ("gpt2", "gpt_bigcode"):
        plans.append(replicated(names.embed.replace("wte", "wpe"), spec.max_positions, spec.hidden_size,
                                note="learned position embeddings: every rank holds them whole"))
    if spec.model_type == "bloom":
        plans += norm("transformer.word_embeddings_layernorm", spec.hidden_size, bias=True)
    return plans

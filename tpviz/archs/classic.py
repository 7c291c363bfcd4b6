"""The classic decoders (GPT-2, GPTBigCode, GPT-NeoX, BLOOM, Falcon, StarCoder2): LayerNorm with biases, a
plain (ungated) MLP of n_inner (4 x hidden by default), fused q/k/v in their own on-disk orders, learned
positions."""
from dataclasses import replace

from tpviz.archs.base import Arch
from tpviz.archs.names import LLAMA, Names
from tpviz.archs.sgl_checks import logits_from
from tpviz.rules.sglang_files import Groups

GPT = replace(LLAMA, embed="transformer.wte.weight", lm_head="lm_head.weight", final_norm="transformer.ln_f",
              layer="transformer.h.*.", mixer_norms=("ln_1",), ffn_norms=("ln_2",),
              norm_bias=True, attn="attn.", qkv_fused="c_attn", o="c_proj", up="c_fc", down="c_proj")
NEOX = replace(LLAMA, embed="gpt_neox.embed_in.weight", lm_head="embed_out.weight",
               final_norm="gpt_neox.final_layer_norm", layer="gpt_neox.layers.*.", norm_bias=True,
               attn="attention.", qkv_fused="query_key_value", qkv_order="per_head_plain", o="dense",
               up="dense_h_to_4h", down="dense_4h_to_h")
BLOOM = replace(NEOX, qkv_order="per_head", embed="transformer.word_embeddings.weight",
                lm_head="lm_head.weight",
                final_norm="transformer.ln_f", layer="transformer.h.*.", attn="self_attention.")
FALCON = replace(BLOOM, qkv_order="qkv")


def falcon_variant(cfg: dict) -> str:
    """Falcon's norms and q/k/v order: new decoder (one or two norms), or the old parallel / serial blocks."""
    if cfg.get("new_decoder_architecture"):
        # vLLM: None means 2
        return "new-2ln" if (cfg.get("num_ln_in_parallel_attn") or 2) == 2 else "new-1ln"
    return "parallel" if cfg.get("parallel_attn", True) else "serial"


def falcon_names(variant: str, kv_heads: int) -> Names:
    """Falcon's norms and fused q/k/v order depend on the decoder variant."""
    if variant.startswith("new"):
        norms = ("ln_attn", "ln_mlp") if variant == "new-2ln" else ("input_layernorm",)
        return replace(FALCON, qkv_order="per_kv_group", mixer_norms=norms, ffn_norms=())
    # 7B's multi-query: [q heads | k | v]
    return replace(FALCON, qkv_order="qkv" if kv_heads == 1 else "per_head",
                   ffn_norms=() if variant == "parallel" else ("post_attention_layernorm",))


def per_head_kv(cfg: dict, heads: int, kv: int) -> int:
    """Multi-head attention stored per head (GPT-NeoX, BLOOM): there is no KV grouping."""
    return heads


def falcon_kv(cfg: dict, heads: int, kv: int) -> int:
    """The old Falcon blocks store q/k/v per head unless they are multi-query (7B: one KV head)."""
    return heads if falcon_variant(cfg) in ("parallel", "serial") and kv != 1 else kv


_CLASSIC = dict(gated_mlp=False, ffn_ratio=4, tied=True, bias_switch=("use_bias", True))


def sgl_gpt2(spec, layout) -> str | None:
    """SGLang's gpt2.py: its attention is told every KV head (num_kv_heads=total_num_heads) while each GPU
    computes 1/tp of them, and its logits always read wte."""
    if layout.tp > 1 and spec.num_attention_heads % layout.tp == 0:  # else its heads assert says so first
        return (f"gives its attention all {spec.num_attention_heads} KV heads while each GPU computes "
                f"{spec.num_attention_heads // layout.tp}, so its KV views do not fit above tp 1: use --tp 1")
    return logits_from("wte")(spec, layout)


RECORDS = [
    Arch("gpt2", "GPT2LMHeadModel", replace(GPT, embed="wte.weight", final_norm="ln_f",
                                            layer="h.*.", conv1d=True),
         learned_positions=True, extra=("positions",), **_CLASSIC, embed_every_stage=True,
         sglang=Groups("gpt2.py", pp=False, check=sgl_gpt2)),
    # vLLM 0.33 serves GPTBigCode through its Transformers backend, whose TP plan leaves the MLP unsplit
    Arch("gpt_bigcode", "GPTBigCodeForCausalLM", GPT, learned_positions=True, extra=("positions",),
         dense_replicated="vLLM 0.33 serves GPTBigCode through its Transformers backend, which "
                          "does not split this MLP",
         sglang=Groups("gpt_bigcode.py", pp=False, check=logits_from("wte")), **_CLASSIC),
    Arch("gpt_neox", "GPTNeoXForCausalLM", NEOX, kv_heads=per_head_kv, **{**_CLASSIC, "tied": False}),
    Arch("bloom", "BloomForCausalLM", BLOOM, kv_heads=per_head_kv, extra=("embed_norm",), **_CLASSIC,
         embed_every_stage=True),
    Arch("falcon", "FalconForCausalLM", FALCON, names_for=falcon_names,
         variant=falcon_variant, kv_heads=falcon_kv, **{**_CLASSIC, "bias_switch": ("bias", False)},
         # models/falcon.py: parallel_attn or new_decoder_architecture sums attention and MLP, reduces once
         joint_reduce=("parallel", "new-2ln", "new-1ln"), embed_every_stage=True),
    Arch("starcoder2", "Starcoder2ForCausalLM", replace(LLAMA, norm_bias=True, up="c_fc", down="c_proj"),
         window="model_wide", **_CLASSIC),
]

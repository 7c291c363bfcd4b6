"""Gemma 1-4 (vLLM 0.33 models/gemma*.py): tied embeddings, four norms a block from Gemma-2 on, sliding layers
in a fixed pattern, and Gemma-4's global layers with their own head size and K = V.

Gemma-4's MoE (26B-A4B, models/gemma4.py Gemma4DecoderLayer): when num_experts is set, every layer runs its
dense MLP (mlp.gate_proj/up_proj/down_proj) and, beside it, routed experts stored stacked as
experts.gate_up_proj [experts, 2 x moe_intermediate, hidden] and experts.down_proj [experts, hidden,
moe_intermediate], which FusedMoE cuts over tp (or places by EP). The router (router.proj, with router.scale
and router.per_expert_scale) is replicated; the block adds three norms. The MLP and the experts each
all-reduce.

Gemma-4's KV-shared layers (E2B, E4B; Gemma4Attention): the last num_kv_shared_layers attend over the KV
cache of the last earlier layer of their kind, so they build q_proj (column-parallel), q_norm and o_proj
alone, cache nothing, and with use_double_wide_mlp run an MLP twice intermediate_size (config/readers.py).
Checkpoints that still ship their k_proj / v_proj / k_norm have them dropped by vLLM's loader (the checkpoint
check names them so).

Gemma-4's per-layer input embeddings (E2B, E4B; plan/per_layer.py): embed_tokens_per_layer vocab-parallel,
per_layer_model_projection column-parallel and gathered, per_layer_projection_norm, and in every layer the
replicated per_layer_input_gate and per_layer_projection with post_per_layer_input_norm.

Gemma-3n (vLLM 0.33 models/gemma3n.py, gemma3n_mm.py): Gemma-4 E2B's ancestor: the same per-layer inputs and
KV-shared layers (their fixed targets: the layer before the shared ones for full attention, two before for
sliding), an MLP size per layer, plus AltUp and LAuReL (plan/per_layer.py). Its class lacks SupportsPP. The
wrapper's MobileNet-V5 vision tower and USM audio encoder are transformers' own modules (AutoModel), and its
embed_vision / embed_audio embedders come with them: all left out of the map, as its note says."""
from dataclasses import replace

from tpviz.archs.base import Arch
from tpviz.archs.names import LLAMA
from tpviz.archs.sgl_checks import logits_from
from tpviz.config.fields import read_int
from tpviz.errors import ConfigError
from tpviz.rules.sglang_files import Groups

GEMMA2 = replace(LLAMA, mixer_norms=("input_layernorm", "post_attention_layernorm"),
                 ffn_norms=("pre_feedforward_layernorm", "post_feedforward_layernorm"))
# the MoE block beside the MLP: the experts and router under the layer, the MLP drawn as its shared part
GEMMA4_MOE = replace(GEMMA2, mlp="", router="router.proj", expert_gate_up=("experts.gate_up_proj",),
                     expert_down="experts.down_proj", shared="mlp.", shared_size_key="intermediate_size",
                     ffn_norms=GEMMA2.ffn_norms + ("pre_feedforward_layernorm_2",
                                                   "post_feedforward_layernorm_1",
                                                   "post_feedforward_layernorm_2"))
GEMMA4_NAMES = {"": GEMMA2, "moe": GEMMA4_MOE}


def gemma4_fields(cfg: dict) -> dict:
    """Gemma-4's MoE keys under the common names: vLLM 0.33 builds the block when num_experts is not None,
    with top_k_experts, moe_intermediate_size (or expert_intermediate_size), and the layer's MLP beside it."""
    if cfg.get("num_experts") is None:
        return cfg
    for key in ("num_experts", "top_k_experts"):  # vLLM builds the block whenever num_experts is set
        if not cfg.get(key):
            raise ConfigError(f"num_experts={cfg['num_experts']!r} with {key}={cfg.get(key)!r}: vLLM 0.33's "
                              "Gemma-4 MoE block needs routed experts and a top-k")
    size = next((cfg[k] for k in ("moe_intermediate_size", "expert_intermediate_size")
                 if cfg.get(k) is not None), None)
    if size is None:  # vLLM raises: "Gemma4 MoE requires an expert intermediate size"
        raise ConfigError("num_experts is set but neither moe_intermediate_size nor expert_intermediate_size "
                          "is: vLLM 0.33's Gemma-4 MoE block needs the experts' size")
    return {**cfg, "moe_intermediate_size": size, "num_experts_per_tok": cfg.get("top_k_experts"),
            "shared_expert_intermediate_size": cfg.get("intermediate_size")}


def gemma4_variant(cfg: dict) -> str:
    return "" if cfg.get("num_experts") is None else "moe"  # "": the dense models, as before


def gemma3n_fields(cfg: dict) -> dict:
    """Gemma-3n as vLLM 0.33 gemma3n.py reads it: one MLP size per layer (transformers' class makes the list),
    the gelu_pytorch_tanh and scaled AltUp correction it requires, and KV-shared layers whose fixed cache
    target is of their own kind."""
    n = read_int(cfg, "num_hidden_layers")
    if isinstance(sizes := cfg.get("intermediate_size"), list):
        if len(sizes) != n:
            raise ConfigError(f"intermediate_size has {len(sizes)} entries but num_hidden_layers={n}")
        sizes = [read_int({"intermediate_size": v}, "intermediate_size") for v in sizes]
        cfg = {**cfg, "intermediate_size": max(sizes, default=0), "layer_intermediate_sizes": sizes}
    if (act := cfg.get("hidden_activation", "gelu_pytorch_tanh")) != "gelu_pytorch_tanh":
        raise ConfigError(f"hidden_activation={act!r}: vLLM 0.33's Gemma3nMLP requires gelu_pytorch_tanh")
    if cfg.get("altup_correct_scale") is False:
        raise ConfigError("altup_correct_scale=false: vLLM 0.33's Gemma3nDecoderLayer asserts it is set")
    inputs = read_int(cfg, "altup_num_inputs", default=4, minimum=1, maximum=64)
    if not 0 <= read_int(cfg, "altup_active_idx", default=0, minimum=0) < inputs:
        raise ConfigError(f"altup_active_idx={cfg['altup_active_idx']} is not one of the "
                          f"altup_num_inputs={inputs} streams")
    for key in ("vocab_size_per_layer_input", "hidden_size_per_layer_input"):  # read as given: no default
        read_int(cfg, key, minimum=0)
    if isinstance(sparsity := cfg.get("activation_sparsity_pattern"), list) and len(sparsity) != n:
        raise ConfigError(f"activation_sparsity_pattern has {len(sparsity)} entries but "
                          f"num_hidden_layers={n}: vLLM 0.33's Gemma-3n reads one a layer")
    shared, types = read_int(cfg, "num_kv_shared_layers", minimum=0), cfg.get("layer_types")
    first = n - shared
    for i, kind in enumerate(types[first:] if shared and isinstance(types, list) and len(types) == n else ()):
        target = first - (2 if kind == "sliding_attention" else 1)
        if target < 0 or types[target] != kind:  # vLLM picks the target by offset, not by kind
            raise ConfigError(f"num_kv_shared_layers={shared}: vLLM 0.33's Gemma-3n gives shared layer "
                              f"{first + i} ({kind}) the KV cache of layer {target}, "
                              + (f"a {types[target]} layer" if target >= 0 else "which does not exist"))
    return cfg


SPARSE_NOTE = ("Gemma-3n: layers with activation_sparsity_pattern above 0 cut gate_proj's outputs at a "
               "Gaussian top-k whose mean and std vLLM 0.33 takes over each GPU's own slice (ir/ops/"
               "activation.py keeps the statistics local to each shard), so at tp > 1 their outputs differ "
               "from one GPU's by more than rounding")
_GEMMA3N = dict(names=GEMMA2, tied=True, qk_norm="head", kv_sharing=True, adapt=gemma3n_fields, pp=False,
                extra=("per_layer_inputs", "altup_laurel"), note=SPARSE_NOTE)
_GEMMA3 = dict(names=GEMMA2, tied=True, embed_every_stage=True, qk_norm="head", sliding_pattern=6,
               length_counts_rope=False, live="gemma3",
               sglang=Groups("gemma3_causal.py", embed="replicated", pp=False))
_GEMMA4 = dict(names=GEMMA2, tied=True, embed_every_stage=True, qk_norm="head", global_attention=True,
               kv_sharing=True,
               extra=("layer_scalar", "router_scales", "per_layer_inputs"), adapt=gemma4_fields,
               variant=gemma4_variant,
               names_for=lambda variant, _kv: GEMMA4_NAMES[variant], experts="fused", shared_reduce=True)


RECORDS = [
    Arch("gemma", "GemmaForCausalLM", tied=True, embed_every_stage=True,
         sglang=Groups("gemma.py", pp=False, check=logits_from("embed_tokens"))),
    Arch("gemma2", "Gemma2ForCausalLM", GEMMA2, tied=True, sliding_pattern=2, live="gemma2",
         sglang=Groups("gemma2.py", pp=False), embed_every_stage=True),
    Arch("gemma3", "Gemma3ForConditionalGeneration", text_model="gemma3_text", tower="siglip", **_GEMMA3),
    Arch("gemma3_text", "Gemma3ForCausalLM", **_GEMMA3),
    Arch("gemma3n", "Gemma3nForConditionalGeneration", text_model="gemma3n_text", audio="gemma3n_audio",
         **_GEMMA3N),
    Arch("gemma3n_text", "Gemma3nForCausalLM", **_GEMMA3N),
    Arch("gemma4", "Gemma4ForConditionalGeneration", text_model="gemma4_text", tower="gemma4_vision",
         audio="gemma4_audio", **_GEMMA4),
    Arch("gemma4_text", "Gemma4ForCausalLM", **_GEMMA4),
]

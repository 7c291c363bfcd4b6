"""Step-3's text decoder (vLLM 0.33 models/step3_text.py), Step-3 (step3_vl.py), which builds its
text_config as that decoder under the same checkpoint names (model.*, lm_head.*), and Step-3.5 (step3p5.py).

Attention: q_proj projects to share_q_dim, k_proj and v_proj to one head_dim head each, and the three load
into one ReplicatedLinear (qkv_proj) that every GPU holds whole; inter_norm (over share_q_dim) is whole
too; wq makes the query heads from the low-rank q (column-parallel) and o_proj takes them back (row-parallel).
There is one K/V head whatever num_attention_groups says, so every GPU computes and caches it. The layers
named in moe_layers_enum (a comma-separated string) hold routed experts through FusedMoE, stored stacked per
projection (moe.gate_proj / up_proj [experts, moe_intermediate, hidden], moe.down_proj [experts, hidden,
moe_intermediate]), a replicated router (moe.gate) and a shared expert beside the block (share_expert.*, a
gated MLP of share_expert_dim); the others a gated MLP (mlp.*). The MLPs run silu whatever hidden_act says.
The config is read as vLLM's own Step3TextConfig reads it (transformers has no class for it).

Step-3.5 keeps the MoE layout and names (moe.*, share_expert.*) under plain GQA: q/k/v one QKVParallelLinear
over num_attention_groups KV heads, per-head q/k norms, a per-head sigmoid gate (g_proj, column-parallel) and
a row-parallel o_proj; its sliding layers have a head count of their own. vLLM reads its config through
transformers' Step3p7TextConfig, which moves the trailing MTP layers' entries out of the per-layer lists.
"""
from dataclasses import replace

from tpviz.archs.base import Arch
from tpviz.archs.names import LLAMA
from tpviz.config.fields import read_int
from tpviz.errors import ConfigError, MissingFieldError

STEP3 = replace(LLAMA, moe="moe.", experts="", shared="share_expert.", shared_outside=True)
# Step3TextConfig's defaults for the keys that are no model dimension (a missing dimension is refused)
DEFAULTS = {"num_attention_groups": 1, "share_q_dim": 2048, "head_dim": 256, "moe_num_experts": 48,
            "moe_top_k": 3, "share_expert_dim": 5120, "rope_theta": 500000.0}
# keys other readers take that step3_text.py never reads
IGNORED = ("num_key_value_heads", "num_experts", "num_local_experts", "n_routed_experts",
           "num_experts_per_tok", "first_k_dense_replace", "moe_layer_freq", "mlp_only_layers",
           "decoder_sparse_step", "layer_types", "sliding_window", "shared_expert_intermediate_size",
           "n_shared_experts", "kv_lora_rank")


def moe_layers(cfg: dict, n: int) -> list[int]:
    """The layers moe_layers_enum names, as step3_text.py parses it (a string of comma-separated indices;
    its own config class's tuple default, or a JSON list, fails there)."""
    enum = cfg.get("moe_layers_enum")
    if not isinstance(enum, str):
        raise ConfigError(f"moe_layers_enum={str(enum)[:40]}: vLLM 0.33's step3_text.py reads it as a "
                          "comma-separated string of layer indices, and fails on anything else")
    try:
        listed = [int(i) for i in enum.strip().split(",")]
    except ValueError:
        raise ConfigError(f"moe_layers_enum={enum[:40]!r} is not a comma-separated list of layer indices") \
            from None
    return sorted({i for i in listed if 0 <= i < n})  # an index past the layers builds nothing


def step3_fields(cfg: dict) -> dict:
    """The config as Step3TextConfig and step3_text.py read it, under the names the readers know."""
    out = {**DEFAULTS, **{k: v for k, v in cfg.items() if k not in IGNORED and v is not None}}
    if out["num_attention_groups"] != 1:
        raise ConfigError(f"num_attention_groups={out['num_attention_groups']!r}: vLLM 0.33's step3_text.py "
                          "builds one K/V head whatever it says, so wider k_proj / v_proj tensors do not "
                          "load")
    n = read_int(cfg, "num_hidden_layers")
    moe = moe_layers(cfg, n)
    if moe and cfg.get("moe_intermediate_size") is None:  # a model dimension: its class default is not taken
        raise MissingFieldError("config is missing moe_intermediate_size, the experts' width step3_text.py "
                                "reads (tpviz takes no model dimension from Step3TextConfig's defaults)",
                                "moe_intermediate_size")
    return {**out, "num_key_value_heads": 1, "hidden_act": "silu", "tie_word_embeddings": False,
            "moe_layers": moe, "num_experts_per_tok": out["moe_top_k"],
            "shared_expert_intermediate_size": out["share_expert_dim"]}


# the lm_head is its own tensor whatever tie_word_embeddings says (Step3TextForCausalLM never ties it)
# FusedMoE and the shared expert's down_proj each all-reduce (reduce_results), then their outputs are summed
_STEP3 = dict(names=STEP3, adapt=step3_fields, low_rank_q="share_q_dim", moe_tp_limit=True,
              shared_reduce=True,
              note="Step-3's q, k and v share one replicated table (qkv_proj), so every GPU computes and "
                   "caches the one K/V head; only wq and o_proj are cut over tp")

def step3p5_fields(cfg: dict) -> dict:
    """The config as step3p5.py reads it: every MoE block asserts a router bias and a float32 router, and
    builds its shared expert inside the FusedMoE (one all-reduce); the lm_head is never tied."""
    if cfg.get("att_impl_type", "GQA") != "GQA":
        raise ConfigError(f"att_impl_type={cfg['att_impl_type']!r}: vLLM 0.33's step3p5.py builds GQA alone")
    for key in ("use_moe_router_bias", "need_fp32_gate"):
        if cfg.get(key) is not True:
            raise ConfigError(f"{key}={cfg.get(key)!r}: vLLM 0.33's step3p5.py asserts it is true")
    limits = cfg.get("swiglu_limits") or []
    if not isinstance(limits, list) or any(isinstance(x, (bool, list, dict, str)) for x in limits):
        raise ConfigError(f"swiglu_limits={limits!r} is not a list of per-layer limits (numbers)")
    limits = [x for x in limits if x not in (None, 0)]
    if any(x != 7 for x in limits):
        raise ConfigError(f"swiglu_limits holds {sorted(set(limits))}: vLLM 0.33's step3p5.py runs only 7.0 "
                          "in its fused MoE")
    n = read_int(cfg, "num_hidden_layers")
    # transformers' names for the hub's, and where its class refused the config (read as given), the hub's
    # own keys as Step3p7TextConfig reads them: moe_layers_enum (layers 3 on by default), the sliding
    # layers' heads in attention_other_setting, num_attention_groups, moe_top_k
    if kinds := cfg.get("mlp_layer_types"):
        moe = [i for i, k in enumerate(kinds) if k == "sparse"]
    else:
        moe = moe_layers(cfg, n) if "moe_layers_enum" in cfg else list(range(3, n))
    other = cfg.get("attention_other_setting")
    other = other if isinstance(other, dict) else {}
    hub = {"num_key_value_heads": cfg.get("num_attention_groups"),
           "num_experts_per_tok": cfg.get("moe_top_k"),
           "num_sliding_attention_heads": other.get("num_attention_heads")}
    # per-layer rope_theta lists: rope_parameters holds each layer type's (full_rope reads the full layers')
    cfg = {k: v for k, v in cfg.items() if not (k == "rope_theta" and isinstance(v, list))}
    return {**{k: v for k, v in hub.items() if v is not None}, **cfg, "tie_word_embeddings": False,
            "moe_layers": moe, "shared_expert_intermediate_size": cfg.get("share_expert_dim")}


# Step-3.5-Flash: the router (moe.gate) and its bias (moe.router_bias) float32, as the checkpoint stores the
# bias; the q/k norms are built whatever use_qk_norm says; tp above the expert count raises
_STEP3P5 = dict(names=replace(STEP3, score_bias="router_bias"), adapt=step3p5_fields, qk_norm="head",
                score_bias="always", router_fp32=True, moe_tp_limit=True, extra=("head_gate",),
                note="its MTP layers (past num_hidden_layers) are left out: vLLM 0.33's main model skips "
                     "them")

# vLLM 0.33.0's ModelConfig asks hasattr(text_config, "num_attention_heads") (get_hf_text_config);
# transformers' Step3p7TextConfig with its own sliding head count is heterogeneous, and answers with a
# RuntimeError hasattr does not catch (checked with transformers 5.16.1 and 5.20.2, the range vLLM 0.33.0
# requires)
STEP3P7_LOAD = ("vLLM 0.33.0 as released stops while reading this config when its sliding layers have a head "
                "count of their own (Step-3.7-Flash's 96 beside 64): get_hf_text_config's "
                "hasattr(text_config, 'num_attention_heads') raises transformers' "
                "AmbiguousGlobalPerLayerAttributeError; the map is the layout its step3p7.py builds once the "
                "config is read")
RECORDS = [
    Arch("step3_text", "Step3TextForCausalLM", **_STEP3),
    # step3_vl.py: the vision tower (vision_model.*: a ViT whose qkv_proj and fc1 / fc2 it cuts over tp, or
    # keeps whole with --mm-encoder-tp-mode data) and its projector (vit_downsampler, vit_downsampler2,
    # vit_large_projector) are left out of the map, as its notes say
    Arch("step3_vl", "Step3VLForConditionalGeneration", text_model="step3_text", **_STEP3),
    Arch("step3p5", "Step3p5ForCausalLM", **_STEP3P5),
    # Step-3.7 (step3p7.py): its text_config built as Step3p5ForCausalLM under the same names; the vision
    # tower (vision_model.*) and its projector (vit_large_projector) are left out, as its notes say
    Arch("step3p7", "Step3p7ForConditionalGeneration", text_model="step3p5",
         **{**_STEP3P5, "note": STEP3P7_LOAD}),
]

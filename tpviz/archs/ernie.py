"""ERNIE-4.5-MoE (vLLM 0.33 models/ernie45_moe.py): Llama's attention (q/k/v biased by use_bias, o_proj
never), dense MLP layers outside the MoE range, and MoE layers with routed experts, shared experts of
moe_num_shared_experts x moe_intermediate_size, a float32 router and its correction bias, which the checkpoint
stores as moe_statics.e_score_correction_bias of shape [1, experts]."""
from dataclasses import replace

from tpviz.archs.base import Arch
from tpviz.archs.names import LLAMA
from tpviz.config.fields import read_int
from tpviz.errors import ConfigError
from tpviz.rules.sglang_files import Groups

ERNIE45_MOE = replace(LLAMA, shared="shared_experts.", score_bias="moe_statics.e_score_correction_bias",
                      score_bias_rows=1)


def ernie45_moe_fields(cfg: dict) -> dict:
    """The MoE keys as vLLM's decoder layer reads them: layer i holds experts when (i + 1) is a multiple of
    moe_layer_interval and moe_layer_start_index <= i <= moe_layer_end_index (transformers turns -1 into the
    last layer); the rest hold a dense MLP of intermediate_size."""
    for key in ("moe_num_experts", "moe_intermediate_size"):
        if isinstance(cfg.get(key), list):
            raise ConfigError(f"{key} is a list (one value per modality, ERNIE-4.5-VL): tpviz maps the text "
                              "model's one expert group alone")
    if cfg.get("hidden_act", "silu") != "silu":
        raise ConfigError(f"hidden_act={cfg['hidden_act']!r}: vLLM 0.33's ernie45_moe.py runs silu alone")
    n, start, end, every = moe_span(cfg)
    experts = read_int(cfg, "moe_num_experts", default=0, minimum=0)
    moe = cfg.get("use_moe", experts > 0)
    bias = cfg.get("use_bias") is True
    out = {**cfg, "moe_layers": [i for i in range(n) if moe and (i + 1) % every == 0 and start <= i <= end],
           "attention_bias": bias, "mlp_bias": bias}
    if "moe_k" in cfg:
        out["num_experts_per_tok"] = cfg["moe_k"]
    shared = read_int(cfg, "moe_num_shared_experts", default=0, minimum=0)
    out["shared_expert_intermediate_size"] = shared * read_int(cfg, "moe_intermediate_size", default=0,
                                                               minimum=0)
    return out


def moe_span(cfg: dict) -> tuple[int, int, int, int]:
    """(layers, first MoE layer, last, interval) as transformers' Ernie4_5_MoeConfig gives them to both
    engines: start 1 and end -1 (the last layer) by default."""
    n = read_int(cfg, "num_hidden_layers")
    start = read_int(cfg, "moe_layer_start_index", default=1, minimum=0)
    end = cfg.get("moe_layer_end_index", n - 1)
    end = n - 1 if end in (None, -1) else read_int({"moe_layer_end_index": end}, "moe_layer_end_index")
    return n, start, end, read_int(cfg, "moe_layer_interval", default=1)


def sgl_ernie(spec, layout) -> str | None:
    """SGLang's ernie4.py: experts wherever (layer - start) is a multiple of the interval, use_moe unread,
    and use_bias's q/k/v/o biases (llama.py's attention) with no MLP biases."""
    cfg = spec.config
    if cfg.get("use_bias") is True:
        return "builds q/k/v/o biases and no MLP biases for use_bias: not modelled"
    if not read_int(cfg, "moe_num_experts", default=0, minimum=0):
        return None
    n, start, end, every = moe_span(cfg)
    sgl = [i for i in range(n) if start <= i <= end and (i - start) % every == 0]
    if sgl != spec.moe_layers:
        shown = lambda layers: ", ".join(map(str, layers[:4])) + (", ..." if len(layers) > 4 else "")  # noqa
        return (f"puts the experts in layers {shown(sgl) or 'none'}, where vLLM puts them in "
                f"{shown(spec.moe_layers) or 'none'} (use_moe, moe_layer_interval): not modelled")
    return None


# dense MLPs whole under --moe-dense-tp-size 1, no experts-per-tp check, no PP; the router in the model dtype
SGL_ERNIE = Groups("ernie4.py", dense="switch", pp=False, router_in_model_dtype=True, check=sgl_ernie)

RECORDS = [
    # tp above moe_num_experts is refused by the MoE block; the shared experts carry no biases
    Arch("ernie4_5_moe", "Ernie4_5_MoeForCausalLM", ERNIE45_MOE, adapt=ernie45_moe_fields, o_bias=False,
         tied=True, score_bias="always", router_fp32=True, moe_tp_limit=True, sglang=SGL_ERNIE),
]

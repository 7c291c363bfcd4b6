"""ERNIE-4.5-MoE (vLLM 0.33 models/ernie45_moe.py): Llama's attention (q/k/v biased by use_bias, o_proj
never), dense MLP layers outside the MoE range, and MoE layers with routed experts, shared experts of
moe_num_shared_experts x moe_intermediate_size, a float32 router and its correction bias, which the checkpoint
stores as moe_statics.e_score_correction_bias of shape [1, experts]."""
from dataclasses import replace

from tpviz.archs.base import Arch
from tpviz.archs.names import LLAMA
from tpviz.config.fields import read_int
from tpviz.errors import ConfigError

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
    n = read_int(cfg, "num_hidden_layers")
    experts = read_int(cfg, "moe_num_experts", default=0, minimum=0)
    start = read_int(cfg, "moe_layer_start_index", default=0, minimum=0)
    end = cfg.get("moe_layer_end_index", n - 1)
    end = n - 1 if end in (None, -1) else read_int({"moe_layer_end_index": end}, "moe_layer_end_index")
    every = read_int(cfg, "moe_layer_interval", default=1)
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


RECORDS = [
    # tp above moe_num_experts is refused by the MoE block; the shared experts carry no biases
    Arch("ernie4_5_moe", "Ernie4_5_MoeForCausalLM", ERNIE45_MOE, adapt=ernie45_moe_fields, o_bias=False,
         tied=True, score_bias="always", router_fp32=True, moe_tp_limit=True),
]

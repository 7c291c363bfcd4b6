"""Falcon-H1 (vLLM 0.33 models/falcon_h1.py): every layer runs attention and a Mamba2 mixer side by side on
the same normed input and adds their outputs (each out-projection all-reduces apart), then a gated MLP under
feed_forward.

Its muP multipliers (embedding, lm_head, key, attention and SSM in / out, the MLP's gate and down, the
in_proj mup_vector) scale activations and logits only: no weight changes shape or count. The mup_vector is a
float32 buffer of one in_proj row per layer, not a checkpoint tensor, left out of the memory figures."""
from dataclasses import replace

from tpviz.archs.base import Arch
from tpviz.archs.names import LLAMA
from tpviz.config.fields import read_int
from tpviz.errors import ConfigError

FALCON_H1 = replace(LLAMA, final_norm="model.final_layernorm", ffn_norms=("pre_ff_layernorm",),
                    mlp="feed_forward.", mamba="mamba.")


def falcon_h1_fields(cfg: dict) -> dict:
    """Every layer a parallel hybrid; the Mamba2 keys under the names the readers know (d_ssm, as vLLM
    sizes the mixer, must be its heads x head size); the MLP without biases, as FalconH1MLP builds it."""
    n, hidden = read_int(cfg, "num_hidden_layers"), read_int(cfg, "hidden_size")
    d_ssm = (read_int(cfg, "mamba_expand", default=2) * hidden if cfg.get("mamba_d_ssm") is None
             else read_int(cfg, "mamba_d_ssm"))
    heads, head = read_int(cfg, "mamba_n_heads", default=128), cfg.get("mamba_d_head", "auto")
    head = d_ssm // heads if head == "auto" else read_int(cfg, "mamba_d_head")
    if heads * head != d_ssm:
        raise ConfigError(f"mamba_n_heads={heads} x mamba_d_head={head} is not mamba_d_ssm={d_ssm}, the "
                          "width vLLM 0.33's Falcon-H1 sizes its Mamba2 in_proj and conv1d by")
    if cfg.get("hidden_act", "silu") != "silu":
        raise ConfigError(f"hidden_act={cfg['hidden_act']!r}: vLLM 0.33's FalconH1MLP supports silu only")
    return {**cfg, "layer_types": ["parallel_hybrid"] * n, "mamba_num_heads": heads, "mamba_head_dim": head,
            "n_groups": read_int(cfg, "mamba_n_groups", default=1), "mlp_bias": False,
            "ssm_state_size": read_int(cfg, "mamba_d_state", default=256),
            "conv_kernel": read_int(cfg, "mamba_d_conv", default=4),
            "use_conv_bias": cfg.get("mamba_conv_bias", True) is not False,
            "mamba_rms_norm": cfg.get("mamba_rms_norm") is True}


RECORDS = [
    Arch("falcon_h1", "FalconH1ForCausalLM", FALCON_H1, adapt=falcon_h1_fields, qkv_bias=False, o_bias=False,
         unmodelled=(("mamba_proj_bias", "Mamba2 in_proj/out_proj biases"),),
         config_keys=(("mamba_num_heads", "mamba_n_heads"),),
         note="Falcon-H1's muP multipliers scale activations and logits only; they change no weight"),
]

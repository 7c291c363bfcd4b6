"""Jamba (vLLM 0.33 models/jamba.py): Mamba1 layers and attention layers by attn_layer_period / offset, each
with routed experts (expert_layer_period / offset) or a dense MLP, under feed_forward.

Its attention has no positional embedding and a head size of hidden_size / num_attention_heads whatever the
config says; the Mamba1 mixer is vLLM's layers/mamba/mamba_mixer.py with its dt / B / C RMSNorms. The model
file builds embed_tokens on every pipeline stage and its own lm_head, never tied."""
from dataclasses import replace

from tpviz.archs.base import Arch
from tpviz.archs.hybrid import NEMOTRON_H
from tpviz.archs.names import LLAMA
from tpviz.config.fields import read_int
from tpviz.errors import ConfigError

JAMBA = replace(LLAMA, final_norm="model.final_layernorm", ffn_norms=("pre_ff_layernorm",),
                mlp="feed_forward.", router="router", mamba="mamba.")


def _period(cfg: dict, key: str, default: int, offset_key: str, offset_default: int) -> tuple[int, int]:
    period = read_int(cfg, key, default=default)
    offset = read_int(cfg, offset_key, default=offset_default, minimum=0)
    if offset >= period:
        raise ConfigError(f"{offset_key}={offset} must be smaller than {key}={period}")
    return period, offset


def jamba_fields(cfg: dict) -> dict:
    """Jamba's layer kinds (JambaConfig.layers_block_type), MoE layers (layers_num_experts: experts where
    the count is above one) and Mamba1 dims under the names the readers know."""
    n, hidden = read_int(cfg, "num_hidden_layers"), read_int(cfg, "hidden_size")
    attn = _period(cfg, "attn_layer_period", 8, "attn_layer_offset", 4)
    moe = _period(cfg, "expert_layer_period", 2, "expert_layer_offset", 1)
    experts = read_int(cfg, "num_experts", default=16, minimum=0)
    rank = cfg.get("mamba_dt_rank", "auto")
    # vLLM: hidden_size / num_attention_heads; mamba_dt_norms is the Mamba record's reading, never Jamba's
    out = {k: v for k, v in cfg.items() if k not in ("head_dim", "mamba_dt_norms")}
    out.update(
        layer_types=["attention" if i % attn[0] == attn[1] else "mamba1" for i in range(n)],
        moe_layers=[i for i in range(n) if i % moe[0] == moe[1]] if experts > 1 else [],
        no_rope_layers=[0] * n, tie_word_embeddings=False,
        mamba_inner=read_int(cfg, "mamba_expand", default=2) * hidden,
        ssm_state_size=read_int(cfg, "mamba_d_state", default=16),
        time_step_rank=-(-hidden // 16) if rank == "auto" else read_int(cfg, "mamba_dt_rank"),
        conv_kernel=read_int(cfg, "mamba_d_conv", default=4),
        use_conv_bias=cfg.get("mamba_conv_bias", True) is not False)
    if experts <= 1:  # JambaMoE only where a layer has more than one expert: every layer's MLP is dense
        out.update(num_experts=0, num_local_experts=0, num_experts_per_tok=0)
    return out


def mamba_fields(cfg: dict) -> dict:
    """MambaForCausalLM / FalconMambaForCausalLM (vLLM 0.33 models/mamba.py): every layer a Mamba1 mixer alone
    under backbone.layers.*.mixer, with no dt / B / C norm weights; MambaConfig's keys under the names the
    readers know. No layer attends: the attention counts normalize asks for are one head of hidden_size, which
    no plan reads."""
    n, hidden = read_int(cfg, "num_hidden_layers"), read_int(cfg, "hidden_size")
    rank = cfg.get("time_step_rank", "auto")
    inner = read_int(cfg, "intermediate_size", default=read_int(cfg, "expand", default=2) * hidden)
    return {**{k: v for k, v in cfg.items() if k not in ("head_dim", "num_key_value_heads")},
            "layer_types": ["mamba1"] * n, "mamba_dt_norms": False, "mamba_inner": inner,
            "ssm_state_size": read_int(cfg, "state_size", default=16),
            "time_step_rank": -(-hidden // 16) if rank == "auto" else read_int(cfg, "time_step_rank"),
            "conv_kernel": read_int(cfg, "conv_kernel", default=4), "num_attention_heads": 1}


# mamba.py: embeddings, lm_head and norm_f on every pipeline stage (no is_first_rank / is_last_rank guard)
MAMBA = dict(adapt=mamba_fields, mixer_only=True,
             unmodelled=(("use_bias", "Mamba1 in_proj / out_proj biases"),), embed_every_stage=True,
             head_every_stage=True, config_keys=(("mamba_inner", "intermediate_size"),))

RECORDS = [
    Arch("mamba", "MambaForCausalLM", NEMOTRON_H, **MAMBA),
    Arch("falcon_mamba", "FalconMambaForCausalLM", NEMOTRON_H, **MAMBA),
    Arch("jamba", "JambaForCausalLM", JAMBA, adapt=jamba_fields, qkv_bias=False, o_bias=False,
         unmodelled=(("mamba_proj_bias", "Mamba1 in_proj/out_proj biases"),), embed_every_stage=True,
         head_every_stage=True),
]

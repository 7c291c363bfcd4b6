"""gpt-oss (vLLM 0.33 models/gpt_oss.py): biases everywhere, attention sinks, even layers sliding, a biased
router and stacked experts, MXFP4 checkpoints."""
from dataclasses import replace

from tpviz.archs.base import Arch
from tpviz.archs.names import LLAMA

GPT_OSS = replace(LLAMA, router="router", experts="experts.", expert_gate_up=("gate_up_proj",))

RECORDS = [
    Arch("gpt_oss", "GptOssForCausalLM", GPT_OSS, qkv_bias=True, o_bias=True, mxfp4=True, sliding_even=True,
         extra=("sinks", "router_bias"), experts="stacked", live="gpt_oss", live_moe=True,
         embed_every_stage=True),
]

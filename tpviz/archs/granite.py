"""Granite-MoE (vLLM 0.33 models/granitemoe.py): a Llama decoder whose experts lie stacked on disk, the gate
and up halves of input_linear [experts, 2 x intermediate, hidden] and output_linear [experts, hidden,
intermediate]; FusedMoE chunks input_linear into gate and up, then cuts each over tp like any merged
gate/up. Its multipliers (embedding, attention, residual, logits) change no layout."""
from dataclasses import replace

from tpviz.archs.base import Arch
from tpviz.archs.names import LLAMA

GRANITEMOE = replace(LLAMA, mlp="block_sparse_moe.", router="router.layer",
                     expert_gate_up=("input_linear",), expert_down="output_linear")

RECORDS = [
    Arch("granitemoe", "GraniteMoeForCausalLM", GRANITEMOE, qkv_bias=False, o_bias=False, experts="halves",
         needs_experts=True),
]

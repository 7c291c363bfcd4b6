"""The architecture registry: one Arch record per model_type (base.py), one module per model line.

To add an architecture, add its record to a family module (or a new one listed in MODULES) with its tests;
every stage reads it from here through arch_of.
"""
from tpviz.archs import (backend, classic, deepseek, ernie, falcon_h1, gemma, glm, gpt_oss, granite, hybrid,
                         internlm, jamba, kimi_linear, llama, minicpm, minimax, olmo, qwen, refused, step3,
                         vision, zamba2)
from tpviz.archs.base import Arch
from tpviz.archs.names import LLAMA, Names

MODULES = (llama, qwen, gemma, deepseek, gpt_oss, olmo, classic, hybrid, internlm, granite, minimax, ernie,
           glm, minicpm, step3, vision, kimi_linear, jamba, falcon_h1, zamba2, backend, refused)
REGISTRY: dict[str, Arch] = {}
for _module in MODULES:
    for _record in _module.RECORDS:
        assert _record.model_type not in REGISTRY, f"two records for {_record.model_type}"
        REGISTRY[_record.model_type] = _record


def arch_of(model_type: str) -> Arch:
    """The record of a model_type; one tpviz does not know reads as a Llama-like decoder (known=False)."""
    return REGISTRY.get(model_type) or Arch(str(model_type), known=False)


def arch_of_class(cls: str) -> Arch | None:
    """The record whose checkpoint class is cls (vLLM builds a model by its architectures entry)."""
    return next((a for a in REGISTRY.values() if a.known and a.hf_class == cls), None) if cls else None


def known_types() -> list[str]:
    """The model_types tpviz maps, in registry order."""
    return [t for t, a in REGISTRY.items() if a.known]


__all__ = ["Arch", "Names", "LLAMA", "REGISTRY", "arch_of", "arch_of_class", "known_types"]

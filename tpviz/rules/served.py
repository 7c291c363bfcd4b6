"""What vLLM 0.33's model registry says about an architecture class (the config's `architectures` entry),
read from vllm_registry.json (regenerated from the wheel by scripts/vllm_registry.py): which model file
serves it, or the last version that did."""
import json
from functools import lru_cache
from pathlib import Path

# vLLM builds these model files' classes as a Llama decoder (Llama's names, shapes and splits)
BACKEND = "vLLM 0.33 serves {} through its Transformers backend"  # how such a record's note begins
LLAMA_FILES = ("llama", "mistral")


@lru_cache(maxsize=1)
def registry() -> dict:
    return json.loads((Path(__file__).with_name("vllm_registry.json")).read_text())


def version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split(".") if p.isdigit())


def architecture(cfg: dict) -> str:
    """The config's first architectures entry ('' when it names none)."""
    archs = cfg.get("architectures")
    return str(archs[0]) if isinstance(archs, list) and archs and isinstance(archs[0], str) else ""


def retired_in(cls: str, version: str) -> str | None:
    """The last vLLM version that served cls, when it is older than `version` (that vLLM refuses cls)."""
    last = registry()["retired"].get(cls)
    return last if last and version_tuple(last) < version_tuple(version) else None


def backend_served(cls: str) -> bool:
    """Whether vLLM 0.33 serves cls through its Transformers backend."""
    return registry()["models"].get(cls, ("", ""))[0] == "transformers"


def serves(cls: str) -> bool:
    """Whether vLLM 0.33's registry builds cls at all."""
    return cls in registry()["models"]


def retired(cls: str) -> str | None:
    """The last vLLM version that served cls, where vLLM 0.33's registry lists it as no longer served."""
    return registry()["retired"].get(cls)


def unserved(cls: str) -> str | None:
    """Why tpviz cannot read cls as a Llama decoder, or None when vLLM 0.33 builds it as one (or cls is not in
    its registry, where vLLM would try its Transformers backend)."""
    reg = registry()
    if last := retired(cls):
        return (f"vLLM served {cls} until {last} and {reg['version']} refuses it "
                "(\"not supported anymore\"); tpviz follows the architectures vLLM 0.33 serves")
    module, _ = reg["models"].get(cls, ("", ""))
    if not module or module in LLAMA_FILES:
        return None
    if module == "transformers":
        return (f"vLLM 0.33 serves {cls} through its Transformers backend (the model's own TP plan), "
                "which tpviz does not model for this architecture yet")
    return (f"vLLM 0.33 serves {cls} with its own model file (models/{module.split('.')[-1]}.py), "
            "which tpviz does not model yet")

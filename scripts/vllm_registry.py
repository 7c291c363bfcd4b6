"""Regenerate tpviz/rules/vllm_registry.json from a vLLM wheel's model registry (read with ast: vLLM is
never imported or installed).

    pip download vllm==0.33.0 --no-deps -d /tmp/w && unzip -q /tmp/w/vllm-*.whl \\
        vllm/model_executor/models/registry.py -d /tmp/w && python scripts/vllm_registry.py /tmp/w 0.33.0
"""
import ast
import json
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "tpviz" / "rules" / "vllm_registry.json"
# the registry's tables of architectures that generate text (pooling, reward and speculative ones are not
# models a user serves for generation)
# (the Transformers-backend table names architectures vLLM routes to TransformersForCausalLM on purpose)
SERVED = ("_TEXT_GENERATION_MODELS", "_MULTIMODAL_MODELS", "_TRANSFORMERS_SUPPORTED_MODELS")


def tables(source: str) -> dict[str, dict]:
    """The registry module's top-level dict literals, by name."""
    found = {}
    for node in ast.parse(source).body:
        target = node.targets[0] if isinstance(node, ast.Assign) else getattr(node, "target", None)
        if isinstance(target, ast.Name) and isinstance(node.value, ast.Dict):
            try:
                found[target.id] = ast.literal_eval(node.value)
            except ValueError:
                pass
    return found


def main(root: str, version: str) -> None:
    t = tables((Path(root) / "vllm/model_executor/models/registry.py").read_text())
    models = {arch: list(where) for name in SERVED for arch, where in t[name].items()}
    retired = t["_PREVIOUSLY_SUPPORTED_MODELS"]
    lines = [f"{json.dumps(k)}: {json.dumps(v)}" for k, v in sorted(models.items())]
    gone = [f"{json.dumps(k)}: {json.dumps(v)}" for k, v in sorted(retired.items())]
    OUT.write_text(f'{{"version": {json.dumps(version)},\n"models": {{\n' + ",\n".join(lines)
                   + '},\n"retired": {\n' + ",\n".join(gone) + "}}\n")
    json.loads(OUT.read_text())
    print(f"{OUT}: {len(models)} served architectures, {len(t['_PREVIOUSLY_SUPPORTED_MODELS'])} retired")


if __name__ == "__main__":
    main(*sys.argv[1:3])

"""Regenerate tpviz/rules/sglang_registry.json from an SGLang wheel: the architecture classes its model
registry serves natively (each top-level module of sglang/srt/models with an EntryClass, read with ast: SGLang
is never imported or installed). A class it lacks falls back to its Transformers backend
(model_loader/utils.py get_model_architecture), which tpviz does not model under SGLang rules.

    pip download sglang==0.5.23 --no-deps -d /tmp/w && unzip -q /tmp/w/sglang-*.whl 'sglang/srt/models/*' \\
        'sglang/srt/configs/*' -d /tmp/w && python scripts/sglang_registry.py /tmp/w 0.5.23
"""
import ast
import json
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "tpviz" / "rules" / "sglang_registry.json"


def entry_classes(source: str) -> set[str]:
    """The class names a module's EntryClass lists (an imported alias read back to its class's own name, the
    registry's key)."""
    tree = ast.parse(source)
    alias = {a.asname: a.name for node in tree.body if isinstance(node, ast.ImportFrom)
             for a in node.names if a.asname}
    found = set()
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "EntryClass"
                                                for t in node.targets):
            found |= {alias.get(n.id, n.id) for n in ast.walk(node.value)
                      if isinstance(n, ast.Name) and n.id[:1].isupper()}  # classes, not a condition's flags
    return found


def renames(source: str) -> dict[str, list[str]]:
    """model_type -> the architectures SGLang's own config class for it sets (sglang/srt/configs:
    DeepSeek-VL2's DeepseekVLV2ForCausalLM is built as DeepseekVL2ForCausalLM)."""
    out = {}
    for cls in (n for n in ast.parse(source).body if isinstance(n, ast.ClassDef)):
        kind = next((n.value.value for n in cls.body if isinstance(n, ast.Assign)
                     and isinstance(n.value, ast.Constant)
                     and any(isinstance(t, ast.Name) and t.id == "model_type" for t in n.targets)), None)
        archs = [e.value for n in ast.walk(cls)
                 if isinstance(n, ast.Assign) and isinstance(n.value, ast.List)
                 and any(isinstance(t, ast.Attribute) and t.attr == "architectures"
                         and isinstance(t.value, ast.Name) and t.value.id == "self" for t in n.targets)
                 for e in n.value.elts if isinstance(e, ast.Constant)]
        if isinstance(kind, str) and archs:
            out[kind] = archs
    return out


def main(root: str, version: str) -> None:
    srt = Path(root) / "sglang/srt"
    models = sorted({cls for path in (srt / "models").glob("*.py")
                     for cls in entry_classes(path.read_text())})
    renamed = {k: v for path in sorted((srt / "configs").glob("*.py"))
               for k, v in renames(path.read_text()).items()}
    OUT.write_text(json.dumps({"version": version, "models": models, "renamed": renamed}, indent=0) + "\n")
    print(f"wrote {OUT}: {len(models)} classes, {len(renamed)} renamed model types")


if __name__ == "__main__":
    main(*sys.argv[1:3])

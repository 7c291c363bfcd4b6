"""The code's own shape: architecture and engine facts live in their folders, modules import without cycles,
imports stay at the top (but for start-up, said beside them), and no module reaches into another's private
names."""
import ast
from pathlib import Path

import pytest

from tests.paths import ROOT
from tpviz.rules import RULES

LIBRARY = sorted((ROOT / "tpviz").rglob("*.py"))
VIEWS = sorted([ROOT / "app.py", *(ROOT / "explorer").glob("*.py"), *(ROOT / "app_pages").glob("*.py")])
OWNERS = (ROOT / "tpviz" / "archs", ROOT / "tpviz" / "rules")  # the only places that may name them
# transformers' own registry of config classes, looked up by model_type as vLLM does: a registry, not a branch
REGISTRIES = (ROOT / "tpviz" / "config" / "hf.py",)


def module(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def mentions(node: ast.AST, name: str) -> bool:
    return any(isinstance(n, ast.Name) and n.id == name or isinstance(n, ast.Attribute) and n.attr == name
               for n in ast.walk(node))


def constants(node: ast.AST) -> set:
    return {n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)}


def branches(path: Path) -> list[str]:
    """Where a module tests a model_type (directly, or through a name assigned from one) or a rule-set name:
    comparisons and membership, lookups keyed by it, startswith / endswith / get on it."""
    tree, out = ast.parse(path.read_text()), []
    derived = set()  # names bound to a model_type: kind = spec.model_type; s, kind = spec, spec.model_type
    for n in ast.walk(tree):
        if isinstance(n, ast.Assign):
            for target in n.targets:
                pairs = zip(target.elts, n.value.elts) if isinstance(target, ast.Tuple) and isinstance(
                    n.value, ast.Tuple) else [(target, n.value)]
                derived |= {t.id for t, v in pairs if isinstance(t, ast.Name) and (
                    isinstance(v, ast.Attribute) and v.attr == "model_type" or isinstance(v, ast.Name) and
                    v.id == "model_type")}

    def typed(node):
        return mentions(node, "model_type") or any(mentions(node, name) for name in derived)
    for node in ast.walk(tree):
        where = f"{path.relative_to(ROOT)}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(typed(s) for s in sides):
                out.append(f"{where}: compares model_type")
            if names := set().union(*map(constants, sides)) & set(RULES):
                out.append(f"{where}: compares with rule-set names {sorted(names)}")
        elif isinstance(node, ast.Subscript) and typed(node.slice):
            out.append(f"{where}: looks up by model_type")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in (
                "startswith", "endswith", "get") and (typed(node.func.value)
                                                      or any(typed(a) for a in node.args)):
            out.append(f"{where}: {node.func.attr} on model_type")
    return out


@pytest.mark.parametrize("path", [p for p in LIBRARY + VIEWS if not any(o in p.parents for o in OWNERS)
                                  and p not in REGISTRIES],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_no_model_type_or_rule_set_branches_outside_their_folders(path):
    assert not branches(path)


def test_the_check_catches_a_branch(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text('def f(spec, rules):\n    if spec.model_type == "gpt_oss" or rules == '
                   '"nano-vllm":\n        pass\n    x = TABLE[spec.model_type]\n    return '
                   'spec.model_type.startswith("qwen")\n')
    original = ROOT
    try:
        globals()["ROOT"] = tmp_path
        found = branches(bad)
    finally:
        globals()["ROOT"] = original
    assert len(found) == 4, found


def top_level_imports(path: Path) -> set[str]:
    """The tpviz modules a module imports when it is imported (not those inside functions or
    TYPE_CHECKING)."""
    out, known = set(), {module(p) for p in LIBRARY}
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("tpviz"):
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                out.add(full if full in known else node.module)
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("tpviz")}
    return {m for m in out if m in known}


def test_no_import_cycles():
    graph = {module(p): top_level_imports(p) for p in LIBRARY}
    state, cycles = {}, []

    def visit(node, path):
        state[node] = "open"
        for dep in sorted(graph.get(node, ())):
            if state.get(dep) == "open":
                cycles.append(" -> ".join(path[path.index(dep):] + [dep]))
            elif dep not in state:
                visit(dep, path + [dep])
        state[node] = "done"
    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    assert not cycles, cycles[:5]


def local_imports(path: Path) -> list[str]:
    """Imports inside functions that do not say, on their line or in the comment above, that they keep
    start-up fast."""
    lines, out = path.read_text().split("\n"), []
    for node in ast.walk(ast.parse("\n".join(lines))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for sub in ast.walk(node):
                if isinstance(sub, (ast.Import, ast.ImportFrom)):
                    # the import's line, the one above and the comment lines above that
                    top = max(0, sub.lineno - 2)
                    while top > 0 and lines[top - 1].strip().startswith("#"):
                        top -= 1
                    said = " ".join(lines[top:sub.lineno]).lower()
                    if "start-up" not in said:
                        out.append(f"{path.relative_to(ROOT)}:{sub.lineno}: {lines[sub.lineno - 1].strip()}")
    return out


def test_imports_inside_functions_say_they_keep_start_up_fast():
    found = [line for p in LIBRARY + VIEWS for line in local_imports(p)]
    assert not found, "\n".join(found)


def test_no_module_uses_another_modules_private_names():
    found = []
    for path in LIBRARY + VIEWS:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("tpviz"):
                found += [f"{path.relative_to(ROOT)}: {node.module}.{a.name}" for a in node.names
                          if a.name.startswith("_") and not a.name.startswith("__")]
    assert not found, found



WIDTH = 110  # characters, not bytes: a '·' or '→' in a note counts once


def long_lines(paths, root=ROOT) -> list[str]:
    return [f"{p.relative_to(root)}:{i}: {len(line)} characters" for p in paths
            for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1) if len(line) > WIDTH]


def test_code_lines_fit_the_width():
    rest = sorted(p for folder in ("bench", "scripts", "tests") for p in (ROOT / folder).rglob("*.py"))
    found = long_lines(LIBRARY + VIEWS + rest)
    assert not found, "\n".join(found)


def test_the_width_check_catches_a_long_line(tmp_path):
    (tmp_path / "ok.py").write_text("x = '" + "·" * (WIDTH - 6) + "'\n", encoding="utf-8")  # 110 characters
    (tmp_path / "long.py").write_text("x = 1  # " + "y" * WIDTH + "\n", encoding="utf-8")
    found = long_lines([tmp_path / "ok.py", tmp_path / "long.py"], tmp_path)
    assert found == [f"long.py:1: {WIDTH + 9} characters"]

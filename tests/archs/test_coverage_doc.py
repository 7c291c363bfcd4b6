"""docs/architectures.md is the registry's own account: regenerating it changes nothing."""
import importlib.util
from pathlib import Path

from tpviz.archs import REGISTRY

ROOT = Path(__file__).resolve().parents[2]


def test_the_coverage_page_is_generated_from_the_registry():
    spec = importlib.util.spec_from_file_location("architectures", ROOT / "scripts" / "architectures.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    page = script.page()
    assert (ROOT / "docs" / "architectures.md").read_text() == page, "run python scripts/architectures.py"
    assert all(f"| `{t}` |" in page for t in REGISTRY)
    assert "| `QWenLMHeadModel` | 0.23.0 |" in page

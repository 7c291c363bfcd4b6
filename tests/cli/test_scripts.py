"""The shell scripts run modules that exist and run as __main__ (gpu_check.sh once called a module without
one, and every row of its table read ERROR)."""
import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CALLS = sorted({(p.name, m) for p in (ROOT / "scripts").glob("*.sh")
                for m in re.findall(r"-m ([\w.]+)", p.read_text())})


def test_the_scripts_call_modules():
    assert ("gpu_check.sh", "tpviz") in CALLS


@pytest.mark.parametrize("script,module", CALLS)
def test_each_module_runs_as_main(script, module):
    spec = importlib.util.find_spec(module)
    assert spec is not None, f"{script} runs -m {module}, which does not exist"
    if spec.submodule_search_locations:  # a package runs its __main__
        spec = importlib.util.find_spec(f"{module}.__main__")
        assert spec is not None, f"{script} runs -m {module}, a package without __main__"
    assert '__name__ == "__main__"' in Path(spec.origin).read_text(), \
        f"{script} runs -m {module}, which has no __main__ guard: it would do nothing"

"""The seed article's demos (sections 3-5), verbatim but for the import line, print the seed's output."""
import os
import subprocess
import sys
from pathlib import Path

import pytest
from tests.paths import ROOT

DEMOS = sorted((Path(__file__).parent / "seed_demos").glob("demo*.py"))


def normalize(text: str) -> list[str]:
    # the article's extraction collapsed runs of spaces, so compare lines with whitespace normalized
    return [" ".join(line.split()) for line in text.strip().splitlines()]


@pytest.mark.parametrize("demo", DEMOS, ids=lambda p: p.stem)
def test_seed_demo_prints_seed_output(demo):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, str(demo)], capture_output=True, text=True, cwd=ROOT, env=env,
                         check=True).stdout
    assert normalize(out) == normalize(demo.with_suffix(".out").read_text())


def test_all_three_seed_sections_present():
    assert [p.stem for p in DEMOS] == ["demo3_column", "demo4_row", "demo5_merged"]

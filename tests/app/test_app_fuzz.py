"""Fuzz through the explorer: a mutated real config, opened by a link (?model=path&tp=...), gives a view or
one clean error line, never a traceback; the page keeps working after it."""
import json
import tempfile
from pathlib import Path

from app_harness import errors, heading, run_app
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.config.test_properties import mutated_configs


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cfg=mutated_configs(), tp=st.sampled_from(["1", "2", "3", "8", "64", "0", "²", "9" * 40]))
def test_mutated_config_links_give_a_view_or_one_line(cfg, tp):
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "config.json"
        path.write_text(json.dumps(cfg))
        at = run_app({"model": str(path), "tp": tp})
        lines = errors(at)  # asserts no traceback
        assert len(lines) <= 2 and all("\n" not in line for line in lines)  # a bad tp link, then the config
        if not lines:
            assert " on " in heading(at) and heading(at).endswith(("GPU", "GPUs"))
        at.text_input(key="path").input("").run()  # and the page still answers
        assert not at.exception

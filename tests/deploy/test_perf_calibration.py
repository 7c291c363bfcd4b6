"""The speed bound against published measurements (bench/data/perf_measurements.json): none beats it, and the
efficiency the UI states is theirs."""
import pytest

from tpviz.deploy.calibration import HIGHER_IS_BETTER, check, efficiency, measurements
from tpviz.deploy.hardware import catalog
from tpviz.deploy.perf import EFFICIENCY
from tpviz.config.sources import presets

FIELDS = {"id", "model", "dtype", "kv_dtype", "gpu", "gpus", "engine", "tp", "pp", "dp", "ep", "input_len",
          "output_len", "concurrency", "metric", "value", "source", "quote"}


@pytest.fixture(scope="module")
def checked():
    return [check(m) for m in measurements()]


def test_the_data_names_its_sources():
    data = measurements()
    assert len(data) >= 20 and len({m["id"] for m in data}) == len(data)
    for m in data:
        assert FIELDS <= set(m), m["id"]
        assert m["source"].startswith("http") and m["quote"] and m["value"] > 0
        assert m["gpu"] in catalog() and m["model"] in presets()
        assert m["metric"] in HIGHER_IS_BETTER | {"tpot_ms", "ttft_ms"}
    assert len({m["gpu"] for m in data}) >= 3 and {"trtllm", "vllm", "sglang"} <= {m["engine"] for m in data}


def test_no_measurement_beats_the_bound(checked):
    beaten = [(c.m["id"], round(c.ratio, 2)) for c in checked if c.ratio > 1]
    assert not beaten


def test_the_stated_efficiency_is_the_measurements_median(checked):
    assert EFFICIENCY == pytest.approx(efficiency(checked), abs=0.03)

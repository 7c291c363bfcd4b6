"""The explorer's view state: query parameters <-> controls (explorer/state.py, no Streamlit needed)."""
import pytest

from explorer.state import DEFAULT_VIEW, controls_from_query, query_from_controls, with_fit
from tpviz.config.sources import presets

QWEN8, LLAMA8 = "Qwen/Qwen3-8B", "meta-llama/Llama-3.1-8B"

KEYS = list(presets())


@pytest.mark.parametrize("params, expected", [
    ({}, {"source": "Preset", "preset": QWEN8, "tp": 4, "rules": "vllm"}),
    ({"model": LLAMA8, "tp": "16", "rules": "nano-vllm"}, {"preset": LLAMA8, "tp": 16, "rules": "nano-vllm"}),
    ({"model": "qwen/qwen3-8b"}, {"source": "Preset", "preset": QWEN8}),
    ({"model": "someone/some-model"}, {"source": "Hub repo id", "hub": "someone/some-model"}),
    ({"model": "/models/x/config.json"}, {"source": "Local path", "path": "/models/x/config.json"}),
    ({"model": "./cfg.json"}, {"source": "Local path", "path": "./cfg.json"}),
])
def test_controls_from_query(params, expected):
    values, problems = controls_from_query(params, KEYS)
    assert problems == []
    assert {k: values[k] for k in expected} == expected


@pytest.mark.parametrize("params, word", [({"tp": "abc"}, "tp='abc'"), ({"tp": "0"}, "from 1 to 64"),
                                           ({"tp": "65"}, "showing tp=4"),
                                          ({"rules": "trtllm"}, "vllm, vllm-0.28, sglang, nano-vllm")])
def test_controls_from_query_problems(params, word):
    values, problems = controls_from_query(params, KEYS)
    assert len(problems) == 1 and word in problems[0]
    assert values["tp"] == 4 and values["rules"] == "vllm"


def test_query_round_trip():
    for params in ({"model": LLAMA8, "tp": "16", "rules": "vllm"},
                   {"model": "a/b", "tp": "2", "rules": "nano-vllm"},
                   {"model": "/x/config.json", "tp": "8", "rules": "vllm"}):
        values, _ = controls_from_query(params, KEYS)
        assert query_from_controls(values) == params
    upload = dict(DEFAULT_VIEW, source="Upload config.json", tp=8)
    assert query_from_controls(upload) == {"tp": "8", "rules": "vllm"}


@pytest.mark.parametrize("tp", ["²", "①", "٣", "4" * 5000, "-4", "4.0"])
def test_odd_tp_in_a_link_is_one_problem(tp):
    values, problems = controls_from_query({"tp": tp}, KEYS)
    assert values["tp"] == 4 and len(problems) == 1 and "\n" not in problems[0] and len(problems[0]) < 200


def test_pasted_hub_url_opens_the_repo():
    values, _ = controls_from_query({"model": "https://huggingface.co/someone/some-model/tree/main"}, KEYS)
    assert values["source"] == "Hub repo id" and values["hub"] == "someone/some-model"
    values, _ = controls_from_query({"model": "https://huggingface.co/Qwen/Qwen3-8B"}, KEYS)
    assert values["source"] == "Preset" and values["preset"] == "Qwen/Qwen3-8B"


def test_pp_dp_ep_travel_in_the_link_and_plain_tp_links_stay_short():
    params = {"model": "Qwen/Qwen3-30B-A3B", "tp": "4", "rules": "vllm", "pp": "2", "dp": "2", "ep": "1"}
    values, problems = controls_from_query(params, KEYS)
    assert problems == [] and (values["pp"], values["dp"], values["ep"]) == (2, 2, True)
    assert query_from_controls(values) == params
    assert "pp" not in query_from_controls(DEFAULT_VIEW) and "ep" not in query_from_controls(DEFAULT_VIEW)
    # a Plan row's link: the layout row's own tp / pp / dp / ep
    row = {"layout": "TP 2 × PP 2 × DP 2 + EP", "tp": 2, "pp": 2, "dp": 2, "ep": True, "valid": True}
    assert query_from_controls({"source": "Hub repo id", "hub": "a/b", **row, "rules": "vllm-0.28"}) == {
        "model": "a/b", "tp": "2", "rules": "vllm-0.28", "pp": "2", "dp": "2", "ep": "1"}


@pytest.mark.parametrize("params, word", [({"pp": "0"}, "pp='0'"), ({"dp": "x"}, "showing dp=1"),
                                           ({"ep": "maybe"}, "ep='maybe'")])
def test_odd_pp_dp_ep_in_a_link_is_one_problem(params, word):
    values, problems = controls_from_query(params, KEYS)
    assert (len(problems) == 1 and word in problems[0]
            and (values["pp"], values["dp"], values["ep"]) == (1, 1, False))


def test_the_rest_of_the_view_travels_in_the_link():
    params = {"model": QWEN8, "tp": "8", "rules": "sglang", "dtype": "bfloat16", "kv": "fp8", "gpu": "141",
              "util": "0.92", "ctx": "131072", "conc": "256", "group": "all", "tab": "gate_up"}
    values, problems = controls_from_query(params, KEYS)
    assert problems == [] and values["layer_group"] == -1 and values["gpu_mem"] == 141.0
    assert query_from_controls(values) == params
    assert query_from_controls({**values, "gpu_mem": 80.0, "layer_group": None, "tab": None}) == {
        k: v for k, v in params.items() if k not in ("gpu", "group", "tab")}  # defaults stay out
    # a Plan row's link carries the fit inputs, so the explorer opens to the row's verdict
    row = {"tp": 8, "pp": 1, "dp": 1, "ep": False, "rules": "vllm", "gpu_mem": 141.0, "gpu_util": 0.9,
           "context": 8192}
    assert query_from_controls({"source": "Hub repo id", "hub": "a/b", **row}) == {
        "model": "a/b", "tp": "8", "rules": "vllm", "gpu": "141"}
    assert with_fit({"model": "a/b", "gpu": "141", "ctx": "10"}, {"gpu_mem": 80.0, "context": 4096}) == {
        "model": "a/b", "ctx": "4096"}


@pytest.mark.parametrize("params, word", [({"gpu": "nan"}, "from 1 to 10,000"), ({"ctx": "1e3"}, "ctx='1e3'"),
                                          ({"conc": "0"}, "showing 16"),
                                          ({"dtype": "int8"}, "auto, bfloat16"),
                                          ({"group": "-2"}, "group number"), ({"tab": "a b"}, "figure name")])
def test_bad_view_values_are_one_problem_each(params, word):
    values, problems = controls_from_query(params, KEYS)
    assert len(problems) == 1 and word in problems[0] and len(problems[0]) < 200

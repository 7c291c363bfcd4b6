"""The Plan page's link (explorer/plan_state.py, no Streamlit needed): query parameters <-> its controls."""
import random

import pytest

from explorer.plan_state import PLAN_FIELDS, plan_from_query, plan_of_view, plan_query

DSV3, QWEN8 = "deepseek-ai/DeepSeek-V3", "Qwen/Qwen3-8B"
DEFAULTS = {key: default for key, (_, default) in PLAN_FIELDS.items()}


def opened(params: dict) -> dict:
    """The controls a fresh page holds after opening a link: the link's values over the defaults."""
    values, problems = plan_from_query(params)
    assert problems == []
    return {**DEFAULTS, **values}


@pytest.mark.parametrize("query", [
    {"model": DSV3, "gpus": "8"},
    {"model": QWEN8, "gpus": "4", "rules": "sglang", "gpu": "79.6", "util": "0.95", "ctx": "32768"},
    {"model": "someone/some-model", "gpus": "1024", "rules": "vllm+sglang"},
    {"model": DSV3, "gpus": "16", "gpu": "140.4", "hw": "h200", "in": "2048", "out": "256", "conc": "32",
     "goal": "latency", "tpot": "12.5", "node": "4"},
])
def test_a_link_reads_back_to_itself(query):
    assert plan_query(opened(query)) == query


def test_the_defaults_make_the_shortest_link():
    assert plan_query(DEFAULTS) == {"model": DSV3, "gpus": "8"}
    assert plan_query({**DEFAULTS, "plan_gib": 123.456789})["gpu"] == "123.456789"  # exact, not 6 digits


def test_a_workload_travels_only_with_a_gpu_type_and_a_context_only_without():
    workload = {**DEFAULTS, "plan_in": 4096, "plan_goal": "latency", "plan_context": 4096}
    assert plan_query(workload) == {"model": DSV3, "gpus": "8", "ctx": "4096"}
    with_gpu = plan_query({**workload, "plan_gpu": "h100"})
    assert with_gpu == {"model": DSV3, "gpus": "8", "hw": "h100", "in": "4096", "goal": "latency"}


def test_presets_any_case_pasted_hub_urls_and_other_pages_names():
    assert opened({"model": "qwen/qwen3-8b"})["plan_model"] == QWEN8
    assert opened({"model": "https://huggingface.co/Qwen/Qwen3-8B/tree/main"})["plan_model"] == QWEN8
    assert opened({"model": "https://huggingface.co/a/b"})["plan_model"] == "a/b"
    assert opened({"RULES": "sglang"})["plan_rules"] == "vllm"  # names are exact; values are not
    assert opened({"rules": "SGLang", "hw": "H100"})["plan_rules"] == "sglang"
    assert opened({"rules": "vllm sglang"})["plan_rules"] == "vllm+sglang"  # '+' typed in an address
    # an explorer link's own names (tp, tab) mean nothing here and are no problem
    assert opened({"model": QWEN8, "tp": "4", "tab": "experts", "gpu": "80"})["plan_gib"] == 80.0


@pytest.mark.parametrize("params, says", [
    ({"gpus": "0"}, "gpus='0' in the link is not a number from 1 to 1,024; showing 8"),
    ({"gpus": "4.5"}, "gpus='4.5'"), ({"gpus": "²"}, "gpus='²'"), ({"gpus": "9" * 400}, "showing 8"),
    ({"gpu": "nan"}, "from 1 to 10,000"), ({"gpu": "inf"}, "showing 141.0"),
    ({"util": "2"}, "from 0.5 to 0.98; showing 0.9"),
    ({"rules": "trtllm"}, "one of vllm, vllm-0.28, sglang, nano-vllm, vllm+sglang; showing vllm"),
    ({"goal": "fast"}, "one of throughput, latency"), ({"hw": "tpu-v9"}, "hw='tpu-v9'"),
    ({"hw": "tpu-v9"}, "showing no GPU type"), ({"conc": "-1"}, "from 0 to 1,000,000"),
    ({"node": "73"}, "from 1 to 72"), ({"model": ""}, "not a preset or a hub repo id"),
    ({"model": "a b"}, "model='a b'"), ({"model": "x" * 300}, "showing deepseek-ai/DeepSeek-V3"),
    ({"model": "owner/na\nme"}, "not a preset"),
])
def test_a_bad_value_is_one_line_and_keeps_its_default(params, says):
    values, problems = plan_from_query(params)
    assert values == {} and len(problems) == 1, problems
    assert says in problems[0] and "\n" not in problems[0] and len(problems[0]) < 300


def test_junk_in_every_field_never_raises():
    rng = random.Random(7)
    junk = ["", " ", "-0", "1e309", "0x10", "١٢", "None", "[]", "%00", "../..", "8" * 30, "\x00", "nan",
            "1_0"]
    for _ in range(300):
        params = {name: rng.choice(junk) + rng.choice(["", "1", "a"]) for name, _ in PLAN_FIELDS.values()
                  if rng.random() < 0.5}
        values, problems = plan_from_query(params)
        assert len(problems) + len(values) == len(params)
        assert all("\n" not in p and len(p) < 300 for p in problems)  # hw= lists the GPU types
        plan_query({**DEFAULTS, **values})  # what it restored makes a link again


def test_an_explorer_view_asks_the_plan_page_the_same_question():
    fit = {"gpu_mem": 141.0, "gpu_util": 0.9, "context": 8192, "concurrency": 16, "gpu_type": "",
           "output_len": 1024}
    assert plan_of_view(QWEN8, 4, "sglang", fit) == {"model": QWEN8, "gpus": "4", "rules": "sglang"}
    asked = {**fit, "gpu_type": "h200", "context": 4096, "output_len": 512, "gpu_mem": 140.4}
    speed = plan_of_view(DSV3, 16, "vllm", asked)
    assert speed == {"model": DSV3, "gpus": "16", "gpu": "140.4", "hw": "h200", "in": "3584", "out": "512",
                     "conc": "16"}
    assert opened(speed)["plan_in"] + opened(speed)["plan_out"] == 4096  # the same context

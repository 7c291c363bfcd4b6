"""AppTest of the Plan page: layouts of N GPUs ranked, rejected ones with their rule, a row opens its map."""
import importlib.util
from urllib.parse import parse_qsl

import streamlit as st
from streamlit.testing.v1 import AppTest

from explorer.state import controls_from_query
from tpviz.config.sources import presets
from tests.paths import ROOT

PAGE = str(ROOT / "app_pages" / "2_Plan.py")


def run(**values) -> AppTest:
    at = AppTest.from_file(PAGE, default_timeout=120)
    at.run()
    for key, value in values.items():
        widget = at.selectbox(key=key) if key == "plan_model" else at.radio(key=key) if key == "plan_rules" \
            else at.number_input(key=key)
        widget.set_value(value)
        at.run()
    return at


def test_plan_lists_layouts_and_rejects_the_reported_failure():
    at = run(plan_model="Qwen/Qwen3-235B-A22B-FP8", plan_gpus=8, plan_gib=80.0, plan_rules="vllm-0.28")
    assert not at.exception and not at.error
    table = at.dataframe[0].value
    rows = dict(zip(table["layout"], table["verdict"]))
    assert rows["TP 8 × PP 1 × DP 1"] == "rejected" and rows["TP 8 × PP 1 × DP 1 + EP"] == "fits"
    assert rows["TP 4 × PP 2 × DP 1"] == "fits"
    why = dict(zip(table["layout"], table["why"]))
    assert "= 192 is not divisible by weight quantization block_n = 128" in why["TP 8 × PP 1 × DP 1"]
    assert list(table["verdict"])[0] == "fits"  # ranked: what fits first


def test_plan_of_a_dense_model_has_no_expert_parallel_rows():
    at = run(plan_model="meta-llama/Llama-3.1-8B", plan_gpus=4, plan_gib=24.0)
    assert not at.exception and not at.error
    layouts = list(at.dataframe[0].value["layout"])
    # 4 = 1x1x4 ... 4x1x1: six layouts
    assert len(layouts) == 6 and not any(x.endswith("+ EP") for x in layouts)


def test_plan_under_nano_vllm_rules_keeps_tensor_parallelism_alone():
    at = run(plan_model="Qwen/Qwen3-30B-A3B", plan_gpus=4, plan_gib=80.0, plan_rules="nano-vllm")
    assert not at.exception and not at.error
    table = at.dataframe[0].value
    assert list(zip(table["layout"], table["verdict"])) == [("TP 4 × PP 1 × DP 1", "fits")]
    assert any(c.value.startswith("Note: nano-vllm runs tensor parallelism alone") for c in at.caption)


def test_plan_ranks_both_engines_each_row_naming_its_engine_and_launch():
    at = run(plan_model="Qwen/Qwen3-235B-A22B-FP8", plan_gpus=8, plan_gib=80.0, plan_rules="vllm+sglang")
    assert not at.exception and not at.error
    table = at.dataframe[0].value
    engines = set(table["engine"])
    assert engines == {"vLLM 0.33", "SGLang 0.5.23"}
    rows = list(zip(table["engine"], table["layout"], table["verdict"], table["launch"]))
    assert ("SGLang 0.5.23", "TP 8 × PP 1 × DP 1 · EP 2", "fits",
            "python -m sglang.launch_server --model-path Qwen/Qwen3-235B-A22B-FP8 "
            "--tp-size 8 --ep-size 2") in rows
    assert ("vLLM 0.33", "TP 8 × PP 1 × DP 1", "fits",
            "vllm serve Qwen/Qwen3-235B-A22B-FP8 --tensor-parallel-size 8") in rows  # refined MoE scales
    sglang_tp8 = [v for e, lay, v, _ in rows if e == "SGLang 0.5.23" and lay == "TP 8 × PP 1 × DP 1"]
    assert sglang_tp8 == ["rejected"]  # no refinement in SGLang
    assert list(table["verdict"])[0] == "fits"


def test_both_engines_show_the_same_deployment_side_by_side():
    at = run(plan_model="Qwen/Qwen3-30B-A3B", plan_gpus=8, plan_gib=80.0, plan_rules="vllm+sglang")
    assert not at.exception and not at.error
    pairs = at.dataframe[1].value
    rows = list(zip(pairs["vLLM 0.33"], pairs["SGLang 0.5.23"]))
    assert ("TP 8 × PP 1 × DP 1 + EP", "TP 8 × PP 1 × DP 1 · EP 8") in rows
    assert ("—", "TP 8 × PP 1 × DP 1 · EP 2") in rows  # partial EP: no vLLM flags say it


def speed_run(gpu: str, **values) -> AppTest:
    at = AppTest.from_file(PAGE, default_timeout=120)
    at.run()
    at.selectbox(key="plan_model").set_value(values.pop("plan_model", "meta-llama/Llama-3.1-8B"))
    at.number_input(key="plan_gpus").set_value(values.pop("plan_gpus", 8))
    at.selectbox(key="plan_gpu").set_value(gpu)
    at.run()
    for key, value in values.items():
        (at.radio(key=key) if key == "plan_goal" else at.number_input(key=key)).set_value(value)
        at.run()
    return at


def test_a_gpu_type_ranks_by_the_speed_bound_and_the_goal_changes_it():
    at = speed_run("h100")
    assert not at.exception and not at.error
    assert at.number_input(key="plan_gib").value == 79.6  # the GPU type brings its memory
    table = at.dataframe[0].value
    tokens = [t for t in table["tok/s per GPU ≤"] if t == t]
    assert tokens == sorted(tokens, reverse=True) and len(tokens) == 10
    assert table["bottleneck"][0].split(",")[0] in ("weights read", "KV cache read", "FLOPs")
    assert table["launch"][0].startswith("vllm serve meta-llama/Llama-3.1-8B")  # each row its launch line
    assert any("a bound, not a promise" in c.value for c in at.caption)
    first = table["layout"][0]
    at.radio(key="plan_goal").set_value("latency")
    at.run()
    table = at.dataframe[0].value
    tpot = [t for t in table["TPOT ms ≥"] if t == t]
    assert tpot == sorted(tpot) and table["layout"][0] == "TP 8 × PP 1 × DP 1" != first


def test_a_moe_model_names_its_routing_and_nodes_crossed():
    at = speed_run("h200", plan_model="deepseek-ai/DeepSeek-V3", plan_gpus=16, plan_tpot=50.0)
    assert not at.exception and not at.error
    table = at.dataframe[0].value
    said = " ".join(table["bottleneck"])
    assert "experts read" in said and "crosses nodes (tp)" in said
    assert all(t <= 50 for t in table["TPOT ms ≥"] if t == t)  # the largest batch within the limit
    assert any("uniformly at random" in c.value for c in at.caption)


def test_a_picked_speed_row_links_to_the_same_view_and_draws_its_terms(monkeypatch):
    """The row view (a table selection, which AppTest cannot make): run in bare mode with Streamlit's calls
    recorded, its link carries the GPU type and workload, and its terms and device grid are drawn."""
    spec = importlib.util.spec_from_file_location("plan_page", PAGE)
    page = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(page)
    drawn, said = [], []
    monkeypatch.setattr(st, "plotly_chart", lambda fig, **kw: drawn.append(fig))
    monkeypatch.setattr(st, "markdown", lambda text, **kw: said.append(text))
    cfg_json, name = page.model_config("meta-llama/Llama-3.1-70B")
    speed = ("h100", 8, 1024, 512, None, "throughput", None)
    rows = page.cached_plan(cfg_json, name, 8, 79.6, "vllm", 0.9, 1536, speed)
    page.show_row(rows[0], cfg_json, name, 79.6, 0.9, 1536, speed)
    assert drawn[0].layout.title.text.startswith(f"Speed bound · {rows[0]['layout']}")
    assert "step ≥" in drawn[1].data[0].text[0][0]
    link = said[0].split("](/?")[1].split(")")[0]
    values, problems = controls_from_query(dict(parse_qsl(link)), list(presets()))
    assert not problems and values["gpu_type"] == "h100" and values["output_len"] == 512
    assert values["context"] == 1536 and values["concurrency"] == rows[0]["perf"]["batch"]


def test_both_engines_pair_a_vision_model_on_its_decoder_and_say_so():
    at = run(plan_model="Qwen/Qwen3-VL-30B-A3B-Instruct", plan_gpus=4, plan_gib=80.0,
             plan_rules="vllm+sglang")
    assert not at.exception and not at.error
    pairs = at.dataframe[1].value
    tp4 = "TP 4 × PP 1 × DP 1"
    assert (tp4, tp4) in list(zip(pairs["vLLM 0.33"], pairs["SGLang 0.5.23"]))
    said = "Pairs are checked GPU by GPU without the vision tower"
    assert any(c.value.startswith(said) for c in at.caption)

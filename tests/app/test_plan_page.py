"""AppTest of the Plan page: layouts of N GPUs ranked, rejected ones with their rule, a row opens its map."""

from streamlit.testing.v1 import AppTest
from tests.paths import ROOT

PAGE = str(ROOT / "pages" / "2_Plan.py")


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

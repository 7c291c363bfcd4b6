"""The Plan page's link is its question: a link opens the same table, the address follows every control, bad
values are one st.error each over the defaults, and the explorer's "Plan a deployment" asks the same thing."""
from urllib.parse import parse_qsl

from streamlit.testing.v1 import AppTest

from tests.app.app_harness import errors, run_app, shown
from tests.app.test_plan_page import PAGE

QWEN8, DSV3 = "Qwen/Qwen3-8B", "deepseek-ai/DeepSeek-V3"


def open_plan(query: dict) -> AppTest:
    at = AppTest.from_file(PAGE, default_timeout=120)
    for key, value in query.items():
        at.query_params[key] = value
    return at.run()


def gpus(layout: str) -> int:
    """The GPUs of a layout label, 'TP 2 × PP 2 × DP 1 · attention DP 2' -> 4."""
    tp, pp, dp = (int(part.split()[1]) for part in layout.split(" · ")[0].split(" + ")[0].split(" × "))
    return tp * pp * dp


def own_link(at: AppTest) -> dict:
    """The query of the page's "Link to this plan"."""
    text = next(m.value for m in at.markdown if m.value.startswith("[Link to this plan]"))
    return dict(parse_qsl(text.split("](?")[1].rstrip(")")))


def test_a_link_opens_its_question_and_stays_in_the_address():
    query = {"model": QWEN8, "gpus": "4", "rules": "sglang", "gpu": "24", "util": "0.95", "ctx": "32768"}
    at = open_plan(query)
    assert not at.exception and not at.error
    assert (at.selectbox(key="plan_model").value, at.number_input(key="plan_gpus").value,
            at.radio(key="plan_rules").value, at.number_input(key="plan_gib").value,
            at.slider(key="plan_util").value, at.number_input(key="plan_context").value) == (
        QWEN8, 4, "sglang", 24.0, 0.95, 32768)
    assert dict(at.query_params) == query == own_link(at)
    table = at.dataframe[0].value
    assert "sequences of 32,768" in table.columns and all(gpus(x) == 4 for x in table["layout"])
    plain = open_plan({"model": QWEN8, "gpus": "4", "rules": "sglang"})
    assert list(plain.dataframe[0].value["KV tokens"]) != list(table["KV tokens"])  # the link's GPU memory


def test_a_speed_link_opens_the_same_ranking():
    query = {"model": "meta-llama/Llama-3.1-8B", "gpus": "8", "gpu": "79.6", "hw": "h100", "in": "2048",
             "out": "512", "goal": "latency"}
    at = open_plan(query)
    assert not at.exception and not at.error and dict(at.query_params) == query
    assert at.selectbox(key="plan_gpu").value == "h100" and at.radio(key="plan_goal").value == "latency"
    table = at.dataframe[0].value
    tpot = [t for t in table["TPOT ms ≥"] if t == t]
    assert tpot == sorted(tpot) and table["layout"][0] == "TP 8 × PP 1 × DP 1"  # lowest TPOT first


def test_the_address_follows_each_control():
    at = open_plan({})
    assert dict(at.query_params) == {"model": DSV3, "gpus": "8"}  # the defaults, said in the link
    at.number_input(key="plan_gpus").set_value(16).run()
    at.selectbox(key="plan_gpu").set_value("h200").run()
    assert at.number_input(key="plan_gib").value == 140.4  # the GPU type brings its memory
    at.number_input(key="plan_tpot").set_value(50.0).run()
    assert dict(at.query_params) == {"model": DSV3, "gpus": "16", "gpu": "140.4", "hw": "h200", "tpot": "50"}
    assert own_link(at) == dict(at.query_params)
    again = open_plan(dict(at.query_params))  # the link opens the same table
    assert list(again.dataframe[0].value["layout"]) == list(at.dataframe[0].value["layout"])


def test_bad_link_values_are_one_error_each_over_the_defaults():
    at = open_plan({"model": QWEN8, "gpus": "0", "rules": "trtllm", "util": "nan", "tp": "4"})
    assert not at.exception
    said = [shown(e.value) for e in at.error]
    assert len(said) == 3 and said[0].startswith("gpus='0' in the link is not a number from 1 to 1,024")
    assert "rules='trtllm'" in said[1] and "util='nan'" in said[2]
    assert at.number_input(key="plan_gpus").value == 8 and at.radio(key="plan_rules").value == "vllm"
    assert len(at.dataframe[0].value) > 1 and dict(at.query_params) == {"model": QWEN8, "gpus": "8"}
    at.number_input(key="plan_gpus").set_value(2).run()
    assert not at.error  # said once: the page goes on


def test_an_unreachable_hub_id_is_one_error_and_the_link_keeps_it():
    at = open_plan({"model": "someone/unknown-model", "gpus": "2"})
    assert not at.exception and len(at.error) == 1
    said = shown(at.error[0].value)
    assert "someone/unknown-model is not in the local" in said
    assert said.endswith("pick a preset, or plan a local config.json with python -m tpviz plan PATH --gpus N "
                         "--gpu-mem GIB")  # the page reads no local file: it says what does
    assert at.selectbox(key="plan_model").value == "someone/unknown-model"
    assert dict(at.query_params) == {"model": "someone/unknown-model", "gpus": "2"}
    at.selectbox(key="plan_model").set_value(QWEN8).run()
    assert not at.error and at.query_params["model"] == QWEN8


def test_the_explorers_plan_link_asks_the_same_question():
    view = run_app({"model": DSV3, "tp": "8", "pp": "2", "gpu": "141", "ctx": "32768", "hw": "h200",
                    "out": "512", "conc": "4"})
    assert errors(view) == []
    text = next(c.value for c in view.caption if c.value.startswith("[Plan a deployment](/Plan?"))
    assert "every layout of 16 GPUs" in text
    query = dict(parse_qsl(text.split("](/Plan?")[1].split(")")[0]))
    at = open_plan(query)
    assert not at.exception and not at.error
    assert (at.number_input(key="plan_gpus").value, at.selectbox(key="plan_gpu").value,
            at.number_input(key="plan_in").value + at.number_input(key="plan_out").value,
            at.number_input(key="plan_conc").value) == (16, "h200", 32768, 4)
    assert "TP 8 × PP 2 × DP 1" in list(at.dataframe[0].value["layout"])  # the view's own layout is ranked
    preset = run_app({"tp": "4"})  # the default preset, in the link though not in the address
    assert any(c.value.startswith("[Plan a deployment](/Plan?model=Qwen/Qwen3-8B&gpus=4")
               for c in preset.caption)

"""AppTest of app_pages/1_Run_live.py beyond plain tp: SGLang's attention DP and EP, pipeline stages with
expert parallelism, a greedy continuation from a prompt, and a result that says it is old once the choices
change. Each runs real ranks on CPU."""
import json

import pytest

from tests.live.test_page import _page, local_root  # noqa: F401 - local_root: the autouse opt-in to folders


@pytest.mark.slow
def test_page_runs_sglangs_attention_dp_and_ep(tiny_moe):
    at = _page(tiny_moe["qwen3_moe"][0])
    at.radio(key="live_rules").set_value("sglang").run()
    assert "live_ep" not in [c.key for c in at.checkbox]  # vLLM's EP is not an SGLang layout
    at.number_input(key="live_tp").set_value(4).run()
    assert at.selectbox(key="live_attn_dp").options == ["1", "2", "4"]
    at.selectbox(key="live_attn_dp").set_value(2)
    at.selectbox(key="live_ep_size").set_value(2)
    at.button(key="live_run").click().run()
    assert not at.exception and not at.error
    assert at.success[0].value.startswith("PASS: tp=4 × attn-dp=2 × ep=2 vs tp=1 float32")
    ranks = at.dataframe[0].value
    assert list(ranks["experts"]) == ["0–1"] * 2 + ["2–3"] * 2
    at.multiselect(key="live_inject").set_value(["wrong-dp-rows"])
    at.button(key="live_run").click().run()
    assert not at.exception and at.error[0].value.startswith("MISMATCH")


@pytest.mark.slow
def test_page_runs_pipeline_stages_with_expert_parallelism(tiny_moe, tiny):
    at = _page(tiny_moe["qwen3_moe"][0])
    assert at.radio(key="live_placement").disabled  # placement means something only with EP on
    at.number_input(key="live_tp").set_value(2)
    at.number_input(key="live_pp").set_value(2)
    at.checkbox(key="live_ep").check().run()
    at.radio(key="live_placement").set_value("round_robin")
    at.button(key="live_run").click().run()
    assert not at.exception and not at.error
    assert at.success[0].value.startswith("PASS: tp=2 × pp=2 + EP vs tp=1 float32")
    ranks = at.dataframe[0].value
    assert list(ranks["stage"]) == [0, 0, 1, 1] and list(ranks["layers"]) == ["0", "0", "1", "1"]
    assert list(ranks["experts"]) == ["0, 2", "1, 3"] * 2
    at.checkbox(key="live_ep").uncheck()
    at.text_input(key="live_folder").set_value(str(tiny["qwen3"][0]))
    at.number_input(key="live_pp").set_value(3)
    at.button(key="live_run").click().run()
    assert (not at.exception
            and [e.value for e in at.error] == ["pp=3 is more pipeline stages than the model's 2 "
                                                                "layers"])
    at.number_input(key="live_pp").set_value(1)
    at.checkbox(key="live_ep").check()
    at.button(key="live_run").click().run()
    assert not at.exception and "expert parallelism needs a MoE model" in at.error[0].value


@pytest.mark.slow
def test_page_generates_from_a_prompt_and_shows_where_tp_and_tp1_part(tiny, tmp_path):
    import shutil

    from tests.live.checks import add_tokenizer
    at = _page(tiny["qwen2"][0]).run()  # no tokenizer: token ids, saying why
    assert at.text_input(key="live_ids") and not at.text_area
    assert ("Token ids, not text: this folder has no "
            "tokenizer.json or tokenizer.model.") in [c.value for c in at.caption]
    folder = tmp_path / "qwen3"
    shutil.copytree(tiny["qwen3"][0], folder)
    add_tokenizer(folder, 1001)
    at.text_input(key="live_folder").set_value(str(folder)).run()
    at.text_area(key="live_prompt").set_value("t7 t100 t3")  # the folder's tokenizer: a prompt
    at.number_input(key="live_tp").set_value(2)
    at.number_input(key="live_generate").set_value(4)
    at.multiselect(key="live_inject").set_value(["skip-allreduce"])
    at.button(key="live_run").click().run()
    assert not at.exception and [e.value[:8] for e in at.error] == ["MISMATCH"]
    tp_text, ref_text = (c.value for c in at.code)
    assert tp_text != ref_text and tp_text.split()[0] == ref_text.split()[0]  # the second token differs
    line = next(w.value for w in at.warning if w.value.startswith("First differ"))
    assert "new token #2 of 4" in line and "NOT explained by float noise" in line
    assert any(c.value == "Prompt (3 tokens): t7 t100 t3" for c in at.caption)
    counts = [c.value for c in at.caption if c.value.startswith(("tp=2:", "tp=1:"))]
    assert counts == [f"tp=2: {len(tp_text.split())} new tokens", f"tp=1: {len(ref_text.split())} new tokens"]
    charts = [json.loads(c.proto.spec) for c in at.get("plotly_chart")]
    title = charts[1]["layout"]["title"]["text"]
    assert len(charts) == 3 and title.startswith("New token #2: TP vs tp=1 on the same 4 tokens<br>")
    assert title.endswith("first beyond tolerance at layer 0</span>")  # its own line: never clipped


@pytest.mark.slow
def test_an_old_result_says_so_once_the_choices_change(tiny):
    at = _page(tiny["qwen2"][0])
    at.number_input(key="live_tp").set_value(2)
    at.button(key="live_run").click().run()
    assert at.success[0].value.startswith("PASS: tp=2") and not [i for i in at.info if "last run" in i.value]
    at.number_input(key="live_tp").set_value(4).run()
    note = next(i.value for i in at.info if "last run's result" in i.value)
    assert "at tp=2; the choices have changed since: press Run to check them." in note
    assert at.success[0].value.startswith("PASS: tp=2")  # still shown, labelled

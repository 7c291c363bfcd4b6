"""AppTest of app_pages/1_Run_live.py: a tp=2 run on CPU shows the verdict, chart, per-rank table and
environment."""
import json

from tests.paths import ROOT
import pytest
import torch
from streamlit.testing.v1 import AppTest

from tpviz.errors import TpvizError

PAGE = str(ROOT / "app_pages" / "1_Run_live.py")


@pytest.fixture(autouse=True)
def local_root(monkeypatch):
    """The server's owner opts in to local folders (the web app refuses them otherwise)."""
    monkeypatch.setenv("TPVIZ_LOCAL_ROOT", "/")


def _page(folder) -> AppTest:
    at = AppTest.from_file(PAGE, default_timeout=120).run()
    assert not at.exception
    at.radio(key="live_source").set_value("Local folder").run()
    at.text_input(key="live_folder").set_value(str(folder))
    at.selectbox(key="live_device").set_value("cpu")
    at.number_input(key="live_seq_len").set_value(8)
    return at


@pytest.mark.slow
def test_page_runs_tp2_on_cpu(tiny):
    folder, hf_model = tiny["qwen2"]
    at = _page(folder)
    at.number_input(key="live_tp").set_value(2)
    at.text_input(key="live_ids").set_value("1 2 3 4 5 1002")  # no tokenizer in the folder: token ids
    at.button(key="live_run").click().run()
    assert not at.exception and not at.error
    assert at.success[0].value.startswith("PASS: tp=2 vs tp=1 float32")
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["first beyond tolerance"] == "none" and len(metrics["max |Δlogit|"]) <= 7  # e.g. 1.2e-6
    labels = [s.proto.label for s in at.get("status")]
    assert [label.split(" (")[0] for label in labels] == [
        "Spawn ranks and join the process group", "Load each rank's weight slices",
        "Forward pass on every rank", "Compare against tp=1"]
    charts = at.get("plotly_chart")
    assert len(charts) == 2
    stage = json.loads(charts[0].proto.spec)
    assert stage["data"][0]["x"][0] == "embed" and stage["data"][0]["x"][-1] == "logits"
    ranks = at.dataframe[0].value
    assert list(ranks["rank"]) == [0, 1] and (ranks["read % of checkpoint"] < 75).all()
    assert "device" not in ranks.columns  # one device for all ranks: it is in the environment table
    env = at.dataframe[1].value
    assert "gloo" in " ".join(env["value"]) and "GPUs found" in list(env["what"])
    assert any("Backend: **gloo**" in c.value for c in at.caption)


@pytest.mark.slow
def test_page_shows_an_injected_bug_and_user_errors_in_one_line(tiny):
    at = _page(tiny["qwen2"][0])
    at.number_input(key="live_tp").set_value(2)
    at.multiselect(key="live_inject").set_value(["skip-allreduce"])
    at.button(key="live_run").click().run()
    assert not at.exception and len(at.error) == 1  # a caught bug is red, like any failure
    assert at.error[0].value.startswith("MISMATCH") and "diverges at layer 0" in at.error[0].value
    assert {m.label: m.value for m in at.metric}["first beyond tolerance"] == "layer 0"
    at.number_input(key="live_tp").set_value(3)
    at.button(key="live_run").click().run()
    assert not at.exception
    errors = [e.value for e in at.error]
    assert (len(errors) == 2 and "not divisible by tp_size=3" in errors[0] and "\n" not in errors[0])
    assert any(w.value.startswith("As chosen, this cannot run: ") for w in at.warning)  # said before Run too
    assert errors[1].startswith("MISMATCH")  # the last result stays visible, below the new error
    at.text_input(key="live_folder").set_value("/no/such/folder")
    at.button(key="live_run").click().run()
    assert not at.exception and "no such file" in at.error[0].value


def test_page_user_errors_are_one_line(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    at = AppTest.from_file(PAGE, default_timeout=60).run()
    at.radio(key="live_source").set_value("Hub repo id").run()
    at.button(key="live_run").click().run()
    assert not at.exception and "give a model" in at.error[0].value
    at.text_input(key="live_hub").set_value("nobody/nothing-here")
    at.button(key="live_run").click().run()
    assert not at.exception and len(at.error) == 1 and "nobody/nothing-here" in at.error[0].value
    if not torch.cuda.is_available():
        at.selectbox(key="live_device").set_value("cuda").run()
        assert not at.exception and "no CUDA GPU" in at.error[0].value
    assert all("\n" not in e.value for e in at.error)


@pytest.mark.parametrize("root", ["off", None])
def test_page_hides_local_folder_unless_the_server_opts_in(monkeypatch, root):
    if root is None:
        monkeypatch.delenv("TPVIZ_LOCAL_ROOT")
    else:
        monkeypatch.setenv("TPVIZ_LOCAL_ROOT", root)
    at = AppTest.from_file(PAGE, default_timeout=60).run()
    assert not at.exception
    assert "Local folder" not in at.radio(key="live_source").options
    assert any(c.value.startswith("Local folders are off in the web app; start it with TPVIZ_LOCAL_ROOT=")
               for c in at.caption)
    at.radio(key="live_source").set_value("Hub repo id").run()
    for probe in ("/etc", "~/x", "tests/..", "tests/live"):  # paths, not hub ids: never looked up as files
        at.text_input(key="live_hub").set_value(probe).run()
        assert (not at.exception and len(at.error) == 1
                and "is not a Hugging Face repo id" in at.error[0].value)


def test_page_turns_an_unexpected_error_into_one_line(monkeypatch):
    def boom(*args, **kwargs):
        raise RuntimeError("something broke\nTraceback details")
    monkeypatch.setattr("tpviz.live.check.verify.verify", boom)
    at = AppTest.from_file(PAGE, default_timeout=60).run()
    at.selectbox(key="live_device").set_value("cpu")
    at.button(key="live_run").click().run()
    assert not at.exception
    assert [e.value for e in at.error] == ["unexpected RuntimeError: something broke"]


def test_page_refuses_a_huge_preset_in_one_line():
    at = AppTest.from_file(PAGE, default_timeout=60).run()
    at.selectbox(key="live_preset").set_value("meta-llama/Llama-3.1-405B")
    at.selectbox(key="live_device").set_value("cpu")
    at.button(key="live_run").click().run()
    assert not at.exception and len(at.error) == 1
    assert "parameters on CPU (limit 2.0B)" in at.error[0].value and "\n" not in at.error[0].value


def test_a_second_visitor_is_queued_until_the_running_one_ends(monkeypatch, tiny):
    import threading

    from tpviz.live.run.slot import one_run_at_a_time
    held, release = threading.Event(), threading.Event()

    def other_visitor():
        with one_run_at_a_time():
            held.set()
            release.wait(30)
    t = threading.Thread(target=other_visitor)
    t.start()
    held.wait(5)
    threading.Timer(1.0, release.set).start()
    at = _page(tiny["qwen3"][0])
    at.number_input(key="live_tp").set_value(1)
    at.button(key="live_run").click().run()
    t.join()
    assert not at.exception and not at.error
    assert ([i.value for i in at.info][:1]
            == ["Another run is in progress on this server; yours starts when it ends "
                                              "(one live run at a time)."])
    assert at.success[0].value.startswith("PASS: tp=1")
    assert any("runs at most" in c.value and "one live run at a time" in c.value for c in at.caption)


def test_a_stopped_run_is_reported_on_the_next_run(monkeypatch):
    from streamlit.runtime.scriptrunner_utils.exceptions import StopException

    def stopped(*args, progress=None, tick=None, **kwargs):
        progress("spawn")
        raise StopException()  # what Streamlit raises at a yield point (tick's update) after Stop
    monkeypatch.setattr("tpviz.live.check.verify.verify", stopped)
    at = AppTest.from_file(PAGE, default_timeout=60).run()
    at.selectbox(key="live_device").set_value("cpu")
    at.button(key="live_run").click().run()
    assert not at.exception
    at.run()
    assert ([w.value for w in at.warning]
            == ["The last run was stopped during “spawn ranks and join the process "
                                             "group”; its ranks were ended."])
    at.run()
    assert not at.warning  # said once


def test_stop_during_a_run_reruns_the_page_and_says_where(monkeypatch):
    from streamlit.runtime.scriptrunner_utils.exceptions import RerunException
    from streamlit.runtime.scriptrunner_utils.script_requests import RerunData

    def clicked(*args, progress=None, tick=None, **kwargs):
        progress("load")
        raise RerunException(RerunData())  # what the page's Stop button (a rerun request) raises at a tick
    monkeypatch.setattr("tpviz.live.check.verify.verify", clicked)
    at = AppTest.from_file(PAGE, default_timeout=60).run()
    assert "live_stop" not in [b.key for b in at.button]
    at.selectbox(key="live_device").set_value("cpu")
    at.button(key="live_run").click().run()
    assert not at.exception
    assert [w.value for w in at.warning] == ["The last run was stopped during “load each rank's weight "
                                             "slices”; its ranks were ended."]
    assert "live_stop" not in [b.key for b in at.button]  # drawn only while ranks work


def test_a_first_failed_run_shows_its_error_alone(monkeypatch):
    def offline(*args, **kwargs):
        raise TpvizError("the hub is offline")
    monkeypatch.setattr("tpviz.live.check.verify.verify", offline)
    at = AppTest.from_file(PAGE, default_timeout=60).run()
    assert at.number_input(key="live_generate_ids").value == 0  # an empty prompt box: random ids, none
    at.selectbox(key="live_device").set_value("cpu")
    at.button(key="live_run").click().run()
    assert not at.exception and [e.value for e in at.error] == ["the hub is offline"]
    assert not at.info and not any("nothing to continue" in c.value for c in at.caption)


def test_a_first_run_with_the_defaults_generates_only_from_a_typed_prompt(monkeypatch):
    asked = []

    def offline(*args, **kwargs):
        asked.append((kwargs["prompt"], kwargs["input_ids"], kwargs["generate"]))
        raise TpvizError("the hub is offline")
    monkeypatch.setattr("tpviz.live.check.verify.verify", offline)
    at = AppTest.from_file(PAGE, default_timeout=60).run()
    at.selectbox(key="live_device").set_value("cpu")
    at.button(key="live_run").click().run()  # the defaults: real weights, an empty prompt box (random ids)
    assert not at.exception and asked == [(None, None, 0)]  # nothing to continue, so nothing asked for
    at.text_area(key="live_prompt").set_value("Tensor parallelism").run()
    assert at.number_input(key="live_generate").value == 8  # a typed prompt continues by 8
    at.button(key="live_run").click().run()
    assert asked[1] == ("Tensor parallelism", None, 8)
    assert not any("nothing to continue" in c.value for c in at.caption)


def test_injections_say_up_front_whether_they_can_bite(tiny):
    at = _page(tiny["qwen3"][0])  # qwen3: no biases anywhere; 2 KV heads
    at.number_input(key="live_tp").set_value(2).run()
    options = at.multiselect(key="live_inject").options
    assert "bias-all-ranks (no effect here)" in options and "skip-allreduce" in options
    # 2 KV heads split evenly over tp=2: nothing replicated
    assert "wrong-kv-head (no effect here)" in options
    at.multiselect(key="live_inject").set_value(["bias-all-ranks"]).run()
    hint = next(c.value for c in at.caption if "has no effect here" in c.value).replace("\\", "")  # unescaped
    assert hint.startswith("bias-all-ranks has no effect here (no row-parallel layer here has a bias")
    assert "Try skip-allreduce" in hint and "--" not in hint
    at.number_input(key="live_tp").set_value(4).run()  # now each KV head is on two ranks: wrong-kv-head bites
    assert "wrong-kv-head" in at.multiselect(key="live_inject").options


def test_a_choice_that_cannot_run_is_said_before_run(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    at = AppTest.from_file(PAGE, default_timeout=60).run()
    at.selectbox(key="live_device").set_value("cpu").run()
    at.number_input(key="live_tp").set_value(3).run()  # Qwen3-0.6B has 16 heads
    assert not at.exception and not at.error
    warning = next(w.value for w in at.warning if w.value.startswith("As chosen, this cannot run: "))
    assert "=16 is not divisible by tp\\_size=3. Valid tp sizes for this model: 1, 2, 4, 8, 16" in warning
    assert "\n" not in warning
    at.selectbox(key="live_preset").set_value("openai-community/gpt2").run()
    at.number_input(key="live_tp").set_value(2).run()
    warning = next(w.value for w in at.warning if w.value.startswith("As chosen, this cannot run: "))
    assert "gpt2" in warning and "--" not in warning  # no CLI flag names on the page

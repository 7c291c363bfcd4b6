"""AppTest: every bad input shows one st.error line with what would work, and the last good view stays."""
import json

import pytest
from app_harness import errors, figure_tabs, heading, run_app
from huggingface_hub import constants
from huggingface_hub.errors import GatedRepoError, LocalEntryNotFoundError, RepositoryNotFoundError

from tpviz.config import hub
from tpviz.config.sources import presets

LLAMA = presets()["meta-llama/Llama-3.2-1B"]


def upload(at, name: str, content: bytes):
    at.radio(key="source").set_value("Upload config.json").run()
    at.file_uploader(key="upload").set_value((name, content, "application/json"))
    return at.run()


def one_error(at) -> str:
    lines = errors(at)
    assert len(lines) == 1, lines
    assert "\n" not in lines[0]
    return lines[0]


def still_showing_last_good(at, title: str = "Qwen/Qwen3-8B on 4 GPUs") -> None:
    assert heading(at) == title and len(figure_tabs(at)) >= 7 and at.get("plotly_chart")


def test_upload_a_valid_config():
    at = upload(run_app(), "my-llama.json", json.dumps(LLAMA).encode())
    assert errors(at) == [] and heading(at) == "my-llama on 4 GPUs"
    assert "model" not in at.query_params and at.query_params["tp"] == "4"  # an upload can't travel in a link
    assert any("cannot travel in a link" in c.value for c in at.caption)


def test_upload_invalid_json():
    at = upload(run_app(), "config.json", b'{"hidden_size": 4096,,}')
    line = one_error(at)
    assert ("is not valid JSON" in line and "line 1 column" in line
            and "Upload the model's config.json" in line)
    still_showing_last_good(at)


def test_upload_too_large_is_one_red_line_and_the_file_is_dropped():
    at = upload(run_app(), "big.json", b'{"pad": "' + b"x" * 1_050_000 + b'"}')
    line = one_error(at)
    assert line == "uploaded big.json is 1.1 MB; a config.json is a few KB (limit 1 MB)"
    assert [u.key for u in at.file_uploader] == ["upload_1"] and at.file_uploader[0].value is None  # dropped
    still_showing_last_good(at)
    at.file_uploader(key="upload_1").set_value(("ok.json", json.dumps(LLAMA).encode(),
                                                "application/json")).run()
    assert errors(at) == [] and "on 4 GPUs" in heading(at)  # a good file in the fresh uploader works


def test_upload_missing_fields():
    cfg = {k: v for k, v in LLAMA.items() if k != "hidden_size"}
    line = one_error(upload(run_app(), "config.json", json.dumps(cfg).encode()))
    assert (line.startswith("config is missing hidden_size")
            and "a decoder config.json needs hidden_size" in line)


def test_upload_not_an_object_and_not_utf8():
    assert "must be a JSON object" in one_error(upload(run_app(), "c.json", b"[1, 2]"))
    assert "not UTF-8" in one_error(upload(run_app(), "c.json", b"\xff\xfe\x00garbage"))


def test_empty_sources_give_a_hint_not_an_error():
    at = run_app()
    for source, words in (("Upload config.json", "Upload a model's config.json"),
                          ("Hub repo id", "Type a Hugging Face"), ("Local path", "Type the path")):
        at.radio(key="source").set_value(source).run()
        assert errors(at) == [] and words in at.info[0].value
        still_showing_last_good(at)


def test_hub_id_of_a_preset_works_offline():
    at = run_app()
    at.radio(key="source").set_value("Hub repo id").run()
    at.text_input(key="hub").input("meta-llama/Llama-3.1-70B").run()
    assert errors(at) == [] and heading(at) == "meta-llama/Llama-3.1-70B on 4 GPUs"


def test_hub_offline():
    at = run_app()
    at.radio(key="source").set_value("Hub repo id").run()
    at.text_input(key="hub").input("someone/offline-model").run()
    line = one_error(at)
    assert "HF_HUB_OFFLINE is set" in line and "pick a preset or a local config.json" in line
    still_showing_last_good(at)


def test_hub_not_a_repo_id():
    at = run_app()
    at.radio(key="source").set_value("Hub repo id").run()
    at.text_input(key="hub").input("not a repo id!").run()
    assert "is not a Hugging Face repo id" in one_error(at)


def fake_hub(monkeypatch, error):
    """An online hub that answers every download with `error`; returns the list of calls."""
    import httpx2
    calls = []

    def download(**kwargs):
        calls.append(kwargs)
        if kwargs.get("local_files_only"):
            raise LocalEntryNotFoundError("not cached")
        raise error(httpx2.Response(403 if error is GatedRepoError else 404,
                                    request=httpx2.Request("GET", "https://huggingface.co/x")))
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(hub, "hf_hub_download", download)
    monkeypatch.setattr(hub, "_reachable", lambda endpoint, limit: True)
    return calls


@pytest.mark.parametrize("error, words", [(RepositoryNotFoundError, ["was not found", "check the id"]),
                                          (GatedRepoError, ["is gated", "HF_TOKEN", "hf auth login"])])
def test_hub_unknown_or_gated(monkeypatch, error, words):
    def make(response):
        return error("refused", response=response)
    calls = fake_hub(monkeypatch, make)
    at = run_app()
    at.radio(key="source").set_value("Hub repo id").run()
    at.text_input(key="hub").input(f"someone/{error.__name__}").run()
    line = one_error(at)
    assert all(w in line for w in words), line
    still_showing_last_good(at)
    asked = len(calls)
    at.selectbox(key="tp").select(8).run()  # a rerun does not ask the failing hub again
    assert len(calls) == asked and one_error(at) == line


def test_local_path_confined_and_disabled(monkeypatch, tmp_path):
    folder = tmp_path / "models" / "tiny-llama"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(LLAMA))
    monkeypatch.setenv("TPVIZ_LOCAL_ROOT", str(tmp_path / "models"))
    at = run_app()
    at.radio(key="source").set_value("Local path").run()
    at.text_input(key="path").input(str(folder)).run()
    assert errors(at) == [] and heading(at) == "tiny-llama on 4 GPUs"
    assert at.query_params["model"] == str(folder)
    at.text_input(key="path").input("/etc/passwd").run()
    assert "local paths are limited to" in one_error(at)
    still_showing_last_good(at, "tiny-llama on 4 GPUs")
    at.text_input(key="path").input(str(tmp_path / "models" / "missing")).run()
    assert "no such file or folder" in one_error(at)
    for root in ("off", None):  # the web app needs the owner's opt-in: a link cannot probe the server's files
        if root is None:
            monkeypatch.delenv("TPVIZ_LOCAL_ROOT")
        else:
            monkeypatch.setenv("TPVIZ_LOCAL_ROOT", root)
        for probe in (str(folder), "/etc/passwd", "/no/such/file"):
            off = run_app({"model": probe})
            assert one_error(off).startswith("local paths are off in the web app; start it "
                                             "with TPVIZ_LOCAL_ROOT=")
            assert off.text_input(key="path").disabled
            assert heading(off) == "Qwen/Qwen3-8B on 4 GPUs"


def test_unexpected_failure_is_one_line_not_a_traceback(monkeypatch):
    import tpviz.render.plots

    def boom(m):
        raise RuntimeError("figure exploded\nwith details")
    at = run_app()
    monkeypatch.setattr(tpviz.render.plots, "all_figures", boom)
    cfg = dict(LLAMA, rms_norm_eps=1.2345e-5)  # a config no earlier test cached
    at = upload(at, "fresh.json", json.dumps(cfg).encode())
    assert one_error(at) == "unexpected RuntimeError: figure exploded"
    still_showing_last_good(at)


def test_even_a_failing_fallback_is_no_traceback(monkeypatch):
    import tpviz.render.plots
    import tpviz.config.sources
    monkeypatch.setattr(tpviz.render.plots, "all_figures", lambda m: 1 / 0)
    # uncached
    monkeypatch.setitem(tpviz.config.sources.presets(), "Qwen/Qwen3-8B", dict(LLAMA, rms_norm_eps=2.5e-5))
    at = run_app()
    assert errors(at) == ["unexpected ZeroDivisionError: division by zero"] * 2


def test_markdown_in_a_link_or_upload_is_shown_literally():
    hostile = "![x](http://host/p.png) [Session expired, log in](http://host/login)"
    at = run_app({"model": hostile})
    raw = [e.value for e in at.error]
    assert len(raw) == 1 and "](" not in raw[0] and "http://" not in raw[0]  # no live image or link
    assert hostile in errors(at)[0]  # the reader still sees exactly what was in the link
    at = run_app()
    at.radio(key="source").set_value("Upload config.json").run()
    name = "**bold** <img src=x> [a](http://h)"
    at = upload(at, "x.json", json.dumps(dict(LLAMA, _name_or_path=name)).encode())
    title = next(m.value for m in at.markdown if m.value.startswith("## "))
    assert "**bold**" not in title and "](" not in title and heading(at) == f"{name} on 4 GPUs"


def test_hub_offline_with_local_paths_off_says_upload(monkeypatch):
    monkeypatch.delenv("TPVIZ_LOCAL_ROOT", raising=False)  # the web app's default: no local paths
    at = run_app()
    at.radio(key="source").set_value("Hub repo id").run()
    at.text_input(key="hub").input("someone/offline-model").run()
    line = one_error(at)
    assert "upload a config.json" in line and "local config.json" not in line

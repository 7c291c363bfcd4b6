"""The Run live page with real weights: cached ones, offline with nothing cached, a download with its
progress, and a shrunk model from a cache holding only the shards it needs."""
from tests.paths import ROOT
import pytest
from streamlit.testing.v1 import AppTest

from tests.live.load.test_download import checkpoint, fake_fetch, fake_listing, fill_cache, hf_cache, online
from tests.live.load.test_download_layers import REPO, SECOND, split

__all__ = ["hf_cache", "online", "split"]  # fixtures, used by name
PAGE = str(ROOT / "app_pages" / "1_Run_live.py")


def page(timeout: float = 120) -> AppTest:
    return AppTest.from_file(PAGE, default_timeout=timeout).run()


def hub_page(repo_id: str, seq_len: int, layers: int | None = None, at: AppTest | None = None) -> AppTest:
    """The page (loaded here unless given) set to run `repo_id` at tp=1 on the CPU; Run not clicked yet."""
    at = at or page()
    at.radio(key="live_source").set_value("Hub repo id").run()
    at.text_input(key="live_hub").set_value(repo_id)
    at.selectbox(key="live_device").set_value("cpu")
    at.number_input(key="live_tp").set_value(1)
    at.number_input(key="live_seq_len").set_value(seq_len)
    if layers is not None:
        at.number_input(key="live_layers").set_value(layers)
    return at


def run(at: AppTest) -> AppTest:
    """Click Run; the run must pass with the model's own weights."""
    at.button(key="live_run").click().run()
    assert not at.exception and not at.error
    assert at.success[0].value.startswith("PASS: tp=1") and "random weights" not in at.success[0].value
    return at


@pytest.mark.slow
def test_the_page_runs_cached_real_weights_and_random_ones_on_request(tiny, hf_cache):
    fill_cache(hf_cache, "tpviz-test/tiny-qwen3", checkpoint(tiny["qwen3"][0]))
    at = page()
    assert not at.exception and not at.checkbox(key="live_random").value
    assert "downloaded from the Hugging Face hub" in at.selectbox(key="live_preset").label
    assert "random" not in at.selectbox(key="live_preset").label
    run(hub_page("tpviz-test/tiny-qwen3", 6, at=at))
    assert any(c.value == "Weights: the checkpoint's own (real weights)." for c in at.caption)
    at.checkbox(key="live_random").check().run()
    assert "random weights from the seed" in at.text_input(key="live_hub").label
    at.button(key="live_run").click().run()
    assert not at.exception and not at.error
    assert at.success[0].value.endswith("random weights (seed 0)")
    assert any(c.value.startswith("Weights: random, from seed 0") for c in at.caption)


def test_the_page_says_offline_in_one_line_without_naming_flags(hf_cache):
    at = page(60)
    at.selectbox(key="live_device").set_value("cpu")
    at.number_input(key="live_layers").set_value(1)
    at.button(key="live_run").click().run()
    assert not at.exception and len(at.error) == 1
    msg = at.error[0].value
    assert "HF_HUB_OFFLINE" in msg and "the Random weights box" in msg and "--" not in msg and "\n" not in msg


def test_the_page_shows_the_download_and_its_progress(tiny, monkeypatch, online):
    files = checkpoint(tiny["qwen3"][0])
    fill_cache(online, "tpviz-test/tiny-qwen3", {"config.json": files["config.json"]})
    fake_listing(monkeypatch, {name: path.stat().st_size for name, path in files.items()})
    fake_fetch(monkeypatch, files)
    at = run(hub_page("tpviz-test/tiny-qwen3", 4))
    labels = [st.proto.label.split(" (")[0] for st in at.get("status")]
    assert labels == ["Download the checkpoint", "Spawn ranks and join the process group",
                      "Load each rank's weight slices", "Forward pass on every rank", "Compare against tp=1"]
    bar = at.get("progress")[0].proto
    size = files["model.safetensors"].stat().st_size + files["generation_config.json"].stat().st_size
    assert bar.value == 100 and bar.text == f"{size / 1e3:.1f} KB of {size / 1e3:.1f} KB"
    assert any(c.value.startswith("Note: real weights: tpviz-test/tiny-qwen3") and "downloaded" in c.value
               for c in at.caption)


def test_the_page_runs_a_shrunk_model_from_a_cache_without_later_layers(split, hf_cache):
    fill_cache(hf_cache, REPO, {k: v for k, v in split.items() if k != SECOND})
    at = run(hub_page(REPO, 4, layers=1))
    assert any(c.value.startswith("Note: only the first 1 of 2 layers are read: 1 of 2 shard files")
               for c in at.caption), [c.value for c in at.caption]

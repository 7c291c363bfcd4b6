"""Real weights of a preset / hub id: downloaded into the Hugging Face cache, or found there offline.

No test touches the network: the cache is filled by hand in huggingface_hub's layout
(models--owner--name/{blobs, snapshots/<commit>, refs/main}), and the hub calls that would go online
are replaced by fakes raising huggingface_hub's own exception types.
"""
import errno
import hashlib
import json
import shutil
from pathlib import Path

import httpx2
import pytest
import torch
from huggingface_hub.utils import hf_raise_for_status
from streamlit.testing.v1 import AppTest

from tpviz.errors import HubError, TpvizError, WeightsError
from tpviz.live import download, verify
from tpviz.live.source import resolve_model
from tpviz.verify import main

COMMIT = "0123456789abcdef0123456789abcdef01234567"
IDS = [[1, 2, 3, 4, 5, 6], [7, 8, 9, 10, 11, 998]]
PAGE = "../../pages/1_Run_live.py"


def fill_cache(cache: Path, repo_id: str, files: dict[str, Path | bytes], commit: str = COMMIT) -> Path:
    """Put files into the hub cache as huggingface_hub 2.x does: content in blobs/, the snapshot's names
    linking to them, refs/main naming the commit. Returns the snapshot folder."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / commit
    (repo / "blobs").mkdir(parents=True, exist_ok=True)
    snapshot.mkdir(parents=True, exist_ok=True)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(commit)
    for name, content in files.items():
        data = content.read_bytes() if isinstance(content, Path) else content
        blob = hashlib.sha256(data).hexdigest()
        (repo / "blobs" / blob).write_bytes(data)
        (snapshot / name).symlink_to(Path("../../blobs") / blob)
    return snapshot


def checkpoint(folder: Path) -> dict[str, Path]:
    return {p.name: p for p in folder.iterdir() if p.is_file()}


@pytest.fixture
def hf_cache(tmp_path, monkeypatch) -> Path:
    """An empty Hugging Face cache of this test's own, offline."""
    cache = tmp_path / "hub"
    cache.mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return cache


@pytest.fixture
def online(hf_cache, monkeypatch) -> Path:
    """The hub counts as reachable (every call that would reach it must be faked by the test); the cache."""
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr("tpviz.hub.constants.HF_HUB_OFFLINE", False)
    monkeypatch.setattr("tpviz.hub._reachable", lambda endpoint, limit: True)
    return hf_cache


def fake_listing(monkeypatch, files: dict[str, int], commit: str = COMMIT, error: Exception | None = None):
    """HfApi.model_info answers with these files (name -> size), or raises `error`."""
    def listing(repo_id, revision, endpoint):
        if error is not None:
            raise error
        return commit, dict(files)
    monkeypatch.setattr(download, "_listing", listing)


def hub_error(status: int, code: str, repo_id: str = "meta-llama/Llama-3.2-1B") -> Exception:
    """The exception huggingface_hub raises for this hub answer (GatedRepoError, RepositoryNotFoundError...)."""
    url = f"https://huggingface.co/api/models/{repo_id}"
    response = httpx2.Response(status, headers={"X-Error-Code": code}, request=httpx2.Request("GET", url))
    try:
        hf_raise_for_status(response)
    except Exception as e:  # noqa: BLE001 - the real type is what the test wants
        return e
    raise AssertionError("hf_raise_for_status raised nothing")


def never(*args, **kwargs):
    raise AssertionError("must not be called")


def one_line(e) -> str:
    text = str(e.value) if hasattr(e, "value") else str(e)
    assert "\n" not in text and "Traceback" not in text
    return text


@pytest.mark.slow
def test_a_hub_id_runs_its_real_weights_from_the_cache_offline(tiny, hf_cache, monkeypatch):
    folder, hf_model = tiny["llama"]  # sharded: an index and four safetensors files, all linked into blobs/
    fill_cache(hf_cache, "tpviz-test/tiny-llama", checkpoint(folder))
    monkeypatch.setattr(download, "_listing", never)  # offline: the hub is never asked
    result, logits = verify("tpviz-test/tiny-llama", 2, device="cpu", input_ids=IDS, timeout=120)
    assert result.passed and not result.random_weights, result.summary()
    assert "random weights" not in result.headline() and "(real weights)" in result.summary()
    assert any(n.startswith(f"real weights: tpviz-test/tiny-llama at {COMMIT[:12]}") and "HF_HUB_OFFLINE" in n
               for n in result.notes)
    with torch.no_grad():
        assert (logits - hf_model(torch.tensor(IDS)).logits).abs().max() < 1e-4
    assert all(0 < r.bytes_read < r.checkpoint_bytes for r in result.ranks)


@pytest.mark.slow
def test_the_cli_runs_cached_real_weights_offline(tiny, hf_cache, tmp_path, capsys):
    folder, hf_model = tiny["qwen3"]
    fill_cache(hf_cache, "tpviz-test/tiny-qwen3", checkpoint(folder))
    (tmp_path / "ids.json").write_text(json.dumps(IDS))
    out_logits = tmp_path / "logits.safetensors"
    code = main(["tpviz-test/tiny-qwen3", "--tp", "2", "--device", "cpu", "--input-ids", str(tmp_path / "ids.json"),
                 "--dump-logits", str(out_logits), "--timeout", "120"])
    out, err = capsys.readouterr()
    assert code == 0 and err == "" and out.startswith("PASS") and "random weights" not in out.splitlines()[0]
    assert "model tpviz-test/tiny-qwen3 (real weights)" in out
    from safetensors.torch import load_file
    with torch.no_grad():
        assert (load_file(str(out_logits))["logits"] - hf_model(torch.tensor(IDS)).logits).abs().max() < 1e-4


def test_the_shrunk_model_reads_only_its_layers_of_the_cached_weights(tiny, hf_cache):
    folder, _ = tiny["llama"]
    fill_cache(hf_cache, "tpviz-test/tiny-llama", checkpoint(folder))
    source = resolve_model("tpviz-test/tiny-llama", layers=1)
    assert not source.random_weights and source.cfg.spec.num_hidden_layers == 1
    assert source.checkpoint.parent.name == "snapshots" and source.checkpoint.name == COMMIT
    from tpviz.live.weights import param_target
    assert param_target("model.layers.1.mlp.down_proj.weight", 1) is None  # the loader skips layer 1


def test_offline_with_nothing_cached_says_so_in_one_line(hf_cache, capsys):
    with pytest.raises(HubError) as e:
        resolve_model("Qwen/Qwen3-0.6B", layers=1)  # a preset: its config is built in, its weights are not
    msg = one_line(e)
    assert "Qwen/Qwen3-0.6B" in msg and "HF_HUB_OFFLINE" in msg and "--random-weights" in msg
    assert main(["Qwen/Qwen3-0.6B", "--tp", "2", "--layers", "1", "--device", "cpu"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and err.startswith("tpviz verify: error: ") and "HF_HUB_OFFLINE" in err
    assert "use --random-weights to run without downloading" in err and "box" not in err  # the CLI's words only


def test_a_cached_config_without_weights_is_no_checkpoint(tiny, hf_cache):
    """The explorer caches config.json alone: offline, that is no checkpoint (and no random weights either)."""
    fill_cache(hf_cache, "tpviz-test/tiny-qwen3", {"config.json": tiny["qwen3"][0] / "config.json"})
    with pytest.raises(WeightsError) as e:
        resolve_model("tpviz-test/tiny-qwen3")
    msg = one_line(e)
    assert "weights of tpviz-test/tiny-qwen3 are not in the local Hugging Face cache (only config.json)" in msg
    assert "HF_HUB_OFFLINE" in msg and "--random-weights" in msg


def test_a_cached_snapshot_missing_a_shard_is_refused(tiny, hf_cache):
    files = checkpoint(tiny["llama"][0])
    shard = sorted(n for n in files if n.startswith("model-"))[-1]
    fill_cache(hf_cache, "tpviz-test/tiny-llama", {k: v for k, v in files.items() if k != shard})
    with pytest.raises(WeightsError, match=f"lacks {shard}"):
        resolve_model("tpviz-test/tiny-llama")


def test_a_pickle_only_repo_is_refused_before_downloading(monkeypatch, online):
    fake_listing(monkeypatch, {"config.json": 700, "pytorch_model.bin": 5_000_000, "README.md": 10})
    monkeypatch.setattr(download, "snapshot_download", never)
    with pytest.raises(WeightsError) as e:
        download.download_checkpoint("tpviz-test/pickles")
    msg = one_line(e)
    assert "only pickle weights (pytorch_model.bin)" in msg and "never loads" in msg and "--random-weights" in msg


def test_a_cached_snapshot_linking_out_of_its_repo_is_refused(tiny, hf_cache, tmp_path):
    """Snapshot files may link into their own repo's blobs/, nowhere else."""
    files = checkpoint(tiny["qwen3"][0])
    snapshot = fill_cache(hf_cache, "tpviz-test/escape", {"config.json": files["config.json"]})
    (snapshot / "model.safetensors").symlink_to(files["model.safetensors"])  # outside the cache
    with pytest.raises(WeightsError, match="points outside") as e:
        resolve_model("tpviz-test/escape")
    one_line(e)


def test_a_cached_pickle_only_snapshot_is_refused_and_never_loaded(tiny, hf_cache, monkeypatch):
    monkeypatch.setattr(torch, "load", never)
    config = tiny["qwen3"][0] / "config.json"
    fill_cache(hf_cache, "tpviz-test/pickles", {"config.json": config, "pytorch_model.bin": b"\x80\x04not really"})
    with pytest.raises(WeightsError, match="only pickle weights") as e:
        resolve_model("tpviz-test/pickles")
    one_line(e)


def test_a_repo_with_safetensors_outside_transformers_layout_is_refused(monkeypatch, online):
    fake_listing(monkeypatch, {"config.json": 700, "consolidated.safetensors": 10**9})
    monkeypatch.setattr(download, "snapshot_download", never)
    with pytest.raises(WeightsError, match="no model.safetensors or model.safetensors.index.json") as e:
        download.download_checkpoint("mistralai/Mistral-7B-Instruct-v0.3")
    one_line(e)


def test_a_gated_repo_says_to_accept_the_licence(monkeypatch, online):
    fake_listing(monkeypatch, {"config.json": 800, "model.safetensors": 2_000_000})  # gated repos list their files
    error = hub_error(403, "GatedRepo")
    assert type(error).__name__ == "GatedRepoError"

    def gated(*args, **kwargs):
        raise error
    monkeypatch.setattr(download, "snapshot_download", gated)
    with pytest.raises(HubError) as e:
        resolve_model("meta-llama/Llama-3.2-1B", layers=1)
    msg = one_line(e)
    assert "meta-llama/Llama-3.2-1B is gated: accept the licence" in msg and "HF_TOKEN" in msg


def test_a_missing_repo_is_one_line(monkeypatch, online, capsys):
    error = hub_error(404, "RepoNotFound", "Qwen/Qwen3-0.6B")
    assert type(error).__name__ == "RepositoryNotFoundError"
    fake_listing(monkeypatch, {}, error=error)
    monkeypatch.setattr(download, "snapshot_download", never)
    with pytest.raises(HubError) as e:
        resolve_model("Qwen/Qwen3-0.6B", layers=1)
    assert "Qwen/Qwen3-0.6B was not found on the Hugging Face hub" in one_line(e)
    assert main(["Qwen/Qwen3-0.6B", "--tp", "2", "--layers", "1", "--device", "cpu"]) == 2
    out, err = capsys.readouterr()
    assert err.count("\n") == 1 and "was not found on the Hugging Face hub" in err


def test_an_unreachable_hub_falls_back_to_the_cache_or_says_so(tiny, hf_cache, monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setattr("tpviz.hub.constants.HF_HUB_OFFLINE", False)
    monkeypatch.setattr("tpviz.hub._reachable", lambda endpoint, limit: False)
    monkeypatch.setattr(download, "_listing", never)
    with pytest.raises(HubError) as e:
        resolve_model("Qwen/Qwen3-0.6B", layers=1)
    msg = one_line(e)
    assert "cannot reach" in msg and "--random-weights" in msg
    fill_cache(hf_cache, "tpviz-test/tiny-qwen3", checkpoint(tiny["qwen3"][0]))
    source = resolve_model("tpviz-test/tiny-qwen3")
    assert not source.random_weights and any("cannot reach" in n for n in source.cfg.notes)


def test_a_download_the_disk_cannot_hold_is_refused_first(monkeypatch, online):
    fake_listing(monkeypatch, {"config.json": 800, "model.safetensors": 3 * 10**9})
    monkeypatch.setattr(download, "snapshot_download", never)
    monkeypatch.setattr(shutil, "disk_usage", lambda path: shutil._ntuple_diskusage(10**10, 10**10 - 10**9, 10**9))
    with pytest.raises(WeightsError) as e:
        download.download_checkpoint("tpviz-test/big")
    msg = one_line(e)
    assert "needs 3.0 GB but only 1.0 GB is free" in msg and "HF_HUB_CACHE" in msg


def test_an_os_error_while_downloading_is_one_line(monkeypatch, online):
    fake_listing(monkeypatch, {"config.json": 800, "model.safetensors": 1000})

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(download, "snapshot_download", full)
    with pytest.raises(WeightsError) as e:
        download.download_checkpoint("tpviz-test/big")
    assert "No space left on device" in one_line(e)


def test_a_download_fetches_only_safetensors_and_reports_progress(tiny, hf_cache, monkeypatch, online):
    """What is asked of snapshot_download (no pickles, no stray files), and progress from the caller's thread."""
    import threading
    files = checkpoint(tiny["qwen3"][0])
    fill_cache(hf_cache, "tpviz-test/tiny-qwen3", {"config.json": files["config.json"]})  # as the explorer left it
    sizes = {name: path.stat().st_size for name, path in files.items()}
    fake_listing(monkeypatch, {**sizes, "pytorch_model.bin": 10**6, "tokenizer.json": 10, "README.md": 5,
                               "original/consolidated.pth": 10**6})
    asked, caller = {}, threading.current_thread()

    def fetch(repo_id, *, revision, cache_dir, endpoint, allow_patterns, tqdm_class):
        asked.update(repo_id=repo_id, revision=revision, files=list(allow_patterns))
        bar = tqdm_class(name="huggingface_hub.snapshot_download", total=0, disable=True)
        for name in allow_patterns:
            data = files[name].read_bytes() if name in files else b"{}"
            if name != "config.json":
                fill_cache(Path(cache_dir), repo_id, {name: data})
                bar.update(len(data))
        return str(Path(cache_dir) / "models--tpviz-test--tiny-qwen3" / "snapshots" / revision)
    monkeypatch.setattr(download, "snapshot_download", fetch)
    calls = []

    def progress(message, done, total):
        assert threading.current_thread() is caller  # the page may draw from here
        calls.append((message, done, total))
    source = resolve_model("tpviz-test/tiny-qwen3", layers=1, download=progress)
    assert asked == {"repo_id": "tpviz-test/tiny-qwen3", "revision": COMMIT,
                     "files": ["config.json", "model.safetensors", "tokenizer.json", "generation_config.json"]}
    assert not source.random_weights and source.tokenizer_dir == source.checkpoint
    need = sizes["model.safetensors"] + sizes["generation_config.json"] + 10
    assert calls[0][0].startswith("downloading tpviz-test/tiny-qwen3 (4 files") and calls[-1][1:] == (need, need)
    assert [d for _, d, _ in calls] == sorted(d for _, d, _ in calls)
    assert any(n.startswith("real weights: tpviz-test/tiny-qwen3") and "downloaded" in n for n in source.cfg.notes)


def test_stopping_the_progress_callback_cancels_the_download(monkeypatch, online):
    import threading
    fake_listing(monkeypatch, {"config.json": 800, "model.safetensors": 10**6})
    ended = threading.Event()

    def slow(repo_id, *, tqdm_class, **kwargs):
        bar = tqdm_class(name="huggingface_hub.snapshot_download", total=0, disable=True)
        try:
            while True:
                bar.update(1000)
                threading.Event().wait(0.01)
        finally:
            ended.set()
    monkeypatch.setattr(download, "snapshot_download", slow)

    class Stop(Exception):
        pass

    def progress(message, done, total):
        if done > 0:
            raise Stop()
    with pytest.raises(Stop):
        download.download_checkpoint("tpviz-test/slow", progress=progress)
    assert ended.wait(5)  # the download thread stopped at its next chunk


def test_random_weights_are_asked_for_and_labelled(hf_cache, monkeypatch, capsys):
    monkeypatch.setattr(download, "download_checkpoint", never)
    source = resolve_model("Qwen/Qwen3-0.6B", layers=1, random_weights=True)
    assert source.random_weights and source.cfg.spec.num_hidden_layers == 1
    code = main(["Qwen/Qwen3-0.6B", "--tp", "1", "--layers", "1", "--random-weights", "--device", "cpu", "--seq-len",
                 "4", "--quiet"])
    out, err = capsys.readouterr()
    assert code == 0 and err == "" and out.startswith("PASS") and out.strip().endswith("random weights (seed 0)")


def test_a_local_checkpoint_can_run_random_weights_instead(tiny):
    folder, _ = tiny["qwen3"]
    assert not resolve_model(folder).random_weights
    source = resolve_model(folder, random_weights=True, seed=5)
    assert source.random_weights and source.checkpoint != folder and source.tokenizer_dir is None


def test_a_quantized_preset_is_refused_before_downloading(hf_cache, monkeypatch):
    monkeypatch.setattr(download, "download_checkpoint", never)
    with pytest.raises(TpvizError) as e:
        resolve_model("Qwen/Qwen3-30B-A3B-FP8", layers=1)
    assert "quantized" in one_line(e) and "--random-weights" in str(e.value)


def test_the_parameter_cap_comes_before_any_download(hf_cache, monkeypatch):
    monkeypatch.setattr(download, "download_checkpoint", never)
    with pytest.raises(TpvizError, match=r"parameters on CPU \(limit 2.0B\)"):
        resolve_model("meta-llama/Llama-3.1-405B")


@pytest.mark.slow
def test_the_page_runs_cached_real_weights_and_random_ones_on_request(tiny, hf_cache):
    fill_cache(hf_cache, "tpviz-test/tiny-qwen3", checkpoint(tiny["qwen3"][0]))
    at = AppTest.from_file(PAGE, default_timeout=120).run()
    assert not at.exception and not at.checkbox(key="live_random").value
    assert "downloaded from the Hugging Face hub" in at.selectbox(key="live_preset").label
    assert "random" not in at.selectbox(key="live_preset").label
    at.radio(key="live_source").set_value("Hub repo id").run()
    at.text_input(key="live_hub").set_value("tpviz-test/tiny-qwen3")
    at.selectbox(key="live_device").set_value("cpu")
    at.number_input(key="live_tp").set_value(1)
    at.number_input(key="live_seq_len").set_value(6)
    at.button(key="live_run").click().run()
    assert not at.exception and not at.error
    assert at.success[0].value.startswith("PASS: tp=1") and "random weights" not in at.success[0].value
    assert any(c.value == "Weights: the checkpoint's own (real weights)." for c in at.caption)
    at.checkbox(key="live_random").check().run()
    assert "random weights from the seed" in at.text_input(key="live_hub").label
    at.button(key="live_run").click().run()
    assert not at.exception and not at.error
    assert at.success[0].value.endswith("random weights (seed 0)")
    assert any(c.value.startswith("Weights: random, from seed 0") for c in at.caption)


def test_the_page_says_offline_in_one_line_without_naming_flags(hf_cache):
    at = AppTest.from_file(PAGE, default_timeout=60).run()
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

    def fetch(repo_id, *, revision, cache_dir, endpoint, allow_patterns, tqdm_class):
        bar = tqdm_class(name="huggingface_hub.snapshot_download", total=0, disable=True)
        for name in allow_patterns:
            if name != "config.json":
                fill_cache(Path(cache_dir), repo_id, {name: files[name]})
                bar.update(files[name].stat().st_size)
        return str(Path(cache_dir) / "models--tpviz-test--tiny-qwen3" / "snapshots" / revision)
    monkeypatch.setattr(download, "snapshot_download", fetch)
    at = AppTest.from_file(PAGE, default_timeout=120).run()
    at.radio(key="live_source").set_value("Hub repo id").run()
    at.text_input(key="live_hub").set_value("tpviz-test/tiny-qwen3")
    at.selectbox(key="live_device").set_value("cpu")
    at.number_input(key="live_tp").set_value(1)
    at.number_input(key="live_seq_len").set_value(4)
    at.button(key="live_run").click().run()
    assert not at.exception and not at.error
    labels = [st.proto.label.split(" (")[0] for st in at.get("status")]
    assert labels == ["Download the checkpoint", "Spawn ranks and join the process group",
                      "Load each rank's weight slices", "Forward pass on every rank", "Compare against tp=1"]
    bar = at.get("progress")[0].proto
    size = files["model.safetensors"].stat().st_size + files["generation_config.json"].stat().st_size
    assert bar.value == 100 and bar.text == f"{size / 1e3:.1f} KB of {size / 1e3:.1f} KB"
    assert at.success[0].value.startswith("PASS: tp=1") and "random weights" not in at.success[0].value
    assert any(c.value.startswith("Note: real weights: tpviz-test/tiny-qwen3") and "downloaded" in c.value
               for c in at.caption)

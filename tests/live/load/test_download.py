"""Real weights of a preset / hub id: downloaded into the Hugging Face cache, or found there offline.

No test touches the network: the cache is filled by hand in huggingface_hub's layout
(models--owner--name/{blobs, snapshots/<commit>, refs/main}), and the hub calls that would go online
are replaced by fakes raising huggingface_hub's own exception types. The helpers and fixtures here are
shared with test_download_errors.py and test_download_page.py.
"""
import hashlib
import json
import threading
from pathlib import Path

import httpx2
import pytest
import torch
from huggingface_hub.utils import hf_raise_for_status

from tpviz.live import verify
from tpviz.live.load import download
from tpviz.live.load.source import resolve_model
from tpviz.cli.verify import main

COMMIT = "0123456789abcdef0123456789abcdef01234567"
IDS = [[1, 2, 3, 4, 5, 6], [7, 8, 9, 10, 11, 998]]


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
    monkeypatch.setattr("tpviz.config.hub.constants.HF_HUB_OFFLINE", False)
    monkeypatch.setattr("tpviz.config.hub._reachable", lambda endpoint, limit: True)
    return hf_cache


def fake_listing(monkeypatch, files: dict[str, int], commit: str = COMMIT, error: Exception | None = None):
    """HfApi.model_info answers with these files (name -> size), or raises `error`."""
    def listing(repo_id, revision, endpoint):
        if error is not None:
            raise error
        return commit, dict(files)
    monkeypatch.setattr(download, "_listing", listing)


def fake_fetch(monkeypatch, files: dict[str, Path], asked: list | None = None):
    """snapshot_download fills the cache with the allowed files it lacks (b"{}" for those not in `files`),
    counting their bytes on its bytes bar; each call's allow_patterns go to `asked`."""
    def fetch(repo_id, *, revision, cache_dir, endpoint, allow_patterns, tqdm_class):
        if asked is not None:
            asked.append(dict(repo_id=repo_id, revision=revision, files=list(allow_patterns)))
        bar = tqdm_class(name="huggingface_hub.snapshot_download", total=0, disable=True)
        snapshot = Path(cache_dir) / f"models--{repo_id.replace('/', '--')}" / "snapshots" / revision
        for name in allow_patterns:
            if not (snapshot / name).exists():
                data = files[name].read_bytes() if name in files else b"{}"
                fill_cache(Path(cache_dir), repo_id, {name: data})
                bar.update(len(data))
        return str(snapshot)
    monkeypatch.setattr(download, "snapshot_download", fetch)


def hub_error(status: int, code: str, repo_id: str = "meta-llama/Llama-3.2-1B") -> Exception:
    """The exception huggingface_hub raises for this hub answer (GatedRepoError,
    RepositoryNotFoundError...)."""
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
    code = main(["tpviz-test/tiny-qwen3", "--tp", "2", "--device", "cpu", "--input-ids",
                 str(tmp_path / "ids.json"), "--dump-logits", str(out_logits), "--timeout", "120"])
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
    from tpviz.live.load.targets import LoadingMap
    # it skips layer 1
    assert LoadingMap(source.cfg.spec).target("model.layers.1.mlp.down_proj.weight") is None
    # every shard is cached: nothing was saved
    assert not any("were not fetched" in n for n in source.cfg.notes)


def test_a_download_fetches_only_safetensors_and_reports_progress(tiny, hf_cache, monkeypatch, online):
    """What is asked of snapshot_download (no pickles, no stray files), and progress from the caller's
    thread."""
    files = checkpoint(tiny["qwen3"][0])
    # as the explorer left it
    fill_cache(hf_cache, "tpviz-test/tiny-qwen3", {"config.json": files["config.json"]})
    sizes = {name: path.stat().st_size for name, path in files.items()}
    fake_listing(monkeypatch, {**sizes, "pytorch_model.bin": 10**6, "tokenizer.json": 10, "README.md": 5,
                               "original/consolidated.pth": 10**6})
    asked, caller = [], threading.current_thread()
    fake_fetch(monkeypatch, files, asked)
    calls = []

    def progress(message, done, total):
        assert threading.current_thread() is caller  # the page may draw from here
        calls.append((message, done, total))
    source = resolve_model("tpviz-test/tiny-qwen3", layers=1, download=progress)
    assert asked == [{"repo_id": "tpviz-test/tiny-qwen3", "revision": COMMIT,
                      "files": ["config.json", "model.safetensors", "tokenizer.json",
                                "generation_config.json"]}]
    assert not source.random_weights and source.tokenizer_dir == source.checkpoint
    need = sizes["model.safetensors"] + sizes["generation_config.json"] + 10
    assert (calls[0][0].startswith("downloading tpviz-test/tiny-qwen3 (4 files")
            and calls[-1][1:] == (need, need))
    assert [d for _, d, _ in calls] == sorted(d for _, d, _ in calls)
    assert any(n.startswith("real weights: tpviz-test/tiny-qwen3") and "downloaded" in n
               for n in source.cfg.notes)
    assert not any("were not fetched" in n for n in source.cfg.notes)  # one file: nothing to skip


def test_stopping_the_progress_callback_cancels_the_download(monkeypatch, online):
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

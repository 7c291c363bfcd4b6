"""Offline tests for tpviz.hub: a fake Hugging Face cache in tmp_path, fake hub errors, closed ports."""

import hashlib
import json
import os
import socket
import time

import pytest
from huggingface_hub import constants
from huggingface_hub.errors import (
    GatedRepoError,
    HfHubHTTPError,
    LocalEntryNotFoundError,
    RemoteEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)

from tpviz import hub
from tpviz.errors import HubError, SourceError, TpvizError

# Whichever HTTP package huggingface_hub uses (httpx2 for 2.x, httpx before); needed to build fake responses.
httpx = hub._httpx or pytest.importorskip("httpx2")

REPO = "tpviz-test/tiny-model"
COMMIT = "0123456789abcdef0123456789abcdef01234567"
CONFIG = {"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2}


def closed_port() -> int:
    """A localhost port with nothing listening (bound then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def hub_env(tmp_path, monkeypatch):
    """Empty cache under tmp_path, online mode, endpoint on a closed localhost port, no proxies."""
    cache = tmp_path / "hf" / "hub"
    cache.mkdir(parents=True)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{closed_port()}")
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HUGGINGFACE_HUB_CACHE", "HF_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    for name in ("http_proxy", "https_proxy", "all_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)
    # huggingface_hub reads these at import time; pin them so the test machine's settings do not leak in.
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "elsewhere"))
    return cache


def add_to_cache(cache, repo_id, files, commit=COMMIT, missing=()):
    """Lay files out as the hub cache does: blobs + snapshot symlinks + refs/main (+ .no_exist markers)."""
    repo_dir = cache / ("models--" + repo_id.replace("/", "--"))
    (repo_dir / "refs").mkdir(parents=True, exist_ok=True)
    (repo_dir / "refs" / "main").write_text(commit)
    snap = repo_dir / "snapshots" / commit
    snap.mkdir(parents=True, exist_ok=True)
    (repo_dir / "blobs").mkdir(exist_ok=True)
    for name, content in files.items():
        data = content if isinstance(content, bytes) else content.encode()
        blob = repo_dir / "blobs" / hashlib.sha1(data).hexdigest()
        blob.write_bytes(data)
        try:
            os.symlink(os.path.relpath(blob, snap), snap / name)
        except OSError:  # no symlinks (some filesystems): the hub then stores copies
            (snap / name).write_bytes(data)
    for name in missing:
        marker = repo_dir / ".no_exist" / commit / name
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.touch()


def fake_response(status: int, url: str = "https://huggingface.co/x/y/resolve/main/config.json"):
    return httpx.Response(status, request=httpx.Request("HEAD", url))


def no_network(*args, **kwargs):
    raise AssertionError("the network must not be tried")


def one_line(exc: BaseException) -> bool:
    return "\n" not in str(exc) and str(exc).strip() != ""


# --- cache hits -------------------------------------------------------------------------------


def test_cached_config_is_returned_without_network(hub_env, monkeypatch):
    add_to_cache(hub_env, REPO, {"config.json": json.dumps(CONFIG)})
    monkeypatch.setattr(hub, "_reachable", no_network)
    assert hub.fetch_config(REPO) == CONFIG
    assert hub.fetch_config(REPO, revision=COMMIT) == CONFIG


def test_cache_found_through_hf_home_alone(hub_env, monkeypatch):
    monkeypatch.delenv("HF_HUB_CACHE")
    add_to_cache(hub_env, REPO, {"config.json": json.dumps(CONFIG)})
    monkeypatch.setattr(hub, "_reachable", no_network)
    assert hub.fetch_config(REPO)["hidden_size"] == 64


def test_cached_index_and_cached_absence(hub_env, monkeypatch):
    index = {"metadata": {"total_size": 8}, "weight_map": {"lm_head.weight": "model.safetensors"}}
    add_to_cache(hub_env, REPO, {"config.json": "{}", "model.safetensors.index.json": json.dumps(index)})
    add_to_cache(hub_env, "tpviz-test/single-file", {"config.json": "{}"}, missing=["model.safetensors.index.json"])
    monkeypatch.setattr(hub, "_reachable", no_network)
    assert hub.fetch_index(REPO) == index
    assert hub.fetch_index("tpviz-test/single-file") is None


def test_cached_absent_config_is_a_hub_error(hub_env, monkeypatch):
    add_to_cache(hub_env, REPO, {}, missing=["config.json"])
    monkeypatch.setattr(hub, "_reachable", no_network)
    with pytest.raises(HubError, match="has no config.json"):
        hub.fetch_config(REPO)


@pytest.mark.parametrize(
    "content, words",
    [
        ('{"hidden_size": 64,', "not valid JSON"),
        ("[1, 2]", "not a JSON object"),
        (b"\xff\xfe{}", "not valid JSON"),
        ("[" * 100_000 + "]" * 100_000, "not valid JSON"),
    ],
)
def test_malformed_cached_json(hub_env, content, words):
    add_to_cache(hub_env, REPO, {"config.json": content})
    with pytest.raises(SourceError, match=words) as info:
        hub.fetch_config(REPO)
    assert not isinstance(info.value, HubError) and one_line(info.value)
    assert REPO in str(info.value)


# --- offline and unreachable ------------------------------------------------------------------


@pytest.mark.parametrize("how", ["env", "constant"])
@pytest.mark.parametrize("fetch", [hub.fetch_config, hub.fetch_index])
def test_offline_and_not_cached_fails_fast(hub_env, monkeypatch, how, fetch):
    if how == "env":
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    else:  # the library's own flag, read from the environment at its import
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(hub, "_reachable", no_network)
    start = time.monotonic()
    with pytest.raises(HubError, match="HF_HUB_OFFLINE") as info:
        fetch(REPO)
    assert time.monotonic() - start < 1.0
    assert "not in the local Hugging Face cache" in str(info.value) and one_line(info.value)


def test_unreachable_endpoint_fails_within_three_seconds(hub_env):
    start = time.monotonic()
    with pytest.raises(HubError, match="cannot reach http://127.0.0.1:") as info:
        hub.fetch_config(REPO)
    assert time.monotonic() - start < 3.0
    assert REPO in str(info.value) and "preset" in str(info.value) and one_line(info.value)


def test_unreachable_via_endpoint_constant(hub_env, monkeypatch):
    monkeypatch.delenv("HF_ENDPOINT")
    monkeypatch.setattr(constants, "ENDPOINT", f"http://127.0.0.1:{closed_port()}")
    start = time.monotonic()
    with pytest.raises(HubError, match="cannot reach"):
        hub.fetch_config(REPO)
    assert time.monotonic() - start < 3.0


def test_reachable_probe_sees_a_listening_port():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        port = server.getsockname()[1]
        assert hub._reachable(f"http://127.0.0.1:{port}", 1.0)
    assert not hub._reachable(f"http://127.0.0.1:{closed_port()}", 1.0)


# --- hub errors mapped to one line ------------------------------------------------------------


def install_fake_download(monkeypatch, online_error=None, online_path=None):
    """hf_hub_download that misses the cache, then raises online_error (or returns online_path)."""
    calls = []

    def fake(**kwargs):
        calls.append(kwargs)
        if kwargs.get("local_files_only"):
            raise LocalEntryNotFoundError("not in cache")
        if online_error is not None:
            raise online_error
        return online_path

    monkeypatch.setattr(hub, "hf_hub_download", fake)
    monkeypatch.setattr(hub, "_reachable", lambda endpoint, limit: True)
    return calls


@pytest.mark.parametrize(
    "error, words",
    [
        (GatedRepoError("gated", response=fake_response(403)), ["gated", "licence", "HF_TOKEN", "hf auth login"]),
        (RepositoryNotFoundError("nope", response=fake_response(404)), ["not found", "check the id"]),
        (RemoteEntryNotFoundError("no entry", response=fake_response(404)), ["has no config.json"]),
        (RevisionNotFoundError("no rev", response=fake_response(404)), ["revision", "not found"]),
        (HfHubHTTPError("boom\nsecond line", response=fake_response(500)), ["HTTP 500"]),
        (HfHubHTTPError("unauthorised", response=fake_response(401)), ["HTTP 401", "HF_TOKEN"]),
        (LocalEntryNotFoundError("connection\nproblem"), ["cannot reach", "preset"]),
        (OSError("network is down\nmore"), ["cannot download", "network is down"]),
        (TimeoutError("timed out"), ["cannot download"]),
        (RuntimeError("weird\nthing"), ["failed", "RuntimeError"]),
    ],
    ids=lambda v: type(v).__name__ if isinstance(v, BaseException) else "",
)
def test_hub_errors_become_one_line(hub_env, monkeypatch, error, words):
    install_fake_download(monkeypatch, online_error=error)
    with pytest.raises(HubError) as info:
        hub.fetch_config(REPO, revision="main")
    message = str(info.value)
    assert one_line(info.value) and REPO in message
    for word in words:
        assert word in message, (word, message)


def test_httpx_connect_error_becomes_hub_error(hub_env, monkeypatch):
    error = httpx.ConnectError("[Errno -3] Temporary failure in name resolution")
    install_fake_download(monkeypatch, online_error=error)
    with pytest.raises(HubError, match="cannot download"):
        hub.fetch_config(REPO)


def test_missing_index_online_is_none_but_other_errors_raise(hub_env, monkeypatch):
    install_fake_download(monkeypatch, online_error=RemoteEntryNotFoundError("x", response=fake_response(404)))
    assert hub.fetch_index(REPO) is None
    install_fake_download(monkeypatch, online_error=GatedRepoError("g", response=fake_response(403)))
    with pytest.raises(HubError, match="gated"):
        hub.fetch_index(REPO)


def test_online_download_arguments(hub_env, monkeypatch, tmp_path):
    path = tmp_path / "downloaded.json"
    path.write_text(json.dumps(CONFIG))
    calls = install_fake_download(monkeypatch, online_path=str(path))
    assert hub.fetch_config(REPO, revision="v1.0", timeout=2.5) == CONFIG
    local, online = calls
    assert local["local_files_only"] is True and local["token"] is False
    assert online["etag_timeout"] == 2.5 and "token" not in online  # HF_TOKEN is the library's default
    assert online["endpoint"] == os.environ["HF_ENDPOINT"]
    assert online["revision"] == "v1.0" and online["cache_dir"] == str(hub_env)


def test_only_tpviz_errors_escape_the_cache_lookup(hub_env, monkeypatch):
    def broken(**kwargs):
        raise PermissionError("cache is read-only")

    monkeypatch.setattr(hub, "hf_hub_download", broken)
    with pytest.raises(TpvizError):
        hub.fetch_config(REPO)


# --- input validation -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "repo_id",
    ["", "noslash", "a/b/c", "-a/b", "a/b-", "a/.b", "a--b/c", "a/b..c", "a b/c", "a/\nb", "../x", None, 123,
     "a/" + "x" * 97, "a/b?c"],
)
def test_bad_repo_id_is_rejected_before_any_lookup(hub_env, monkeypatch, repo_id):
    monkeypatch.setattr(hub, "hf_hub_download", no_network)
    monkeypatch.setattr(hub, "_reachable", no_network)
    with pytest.raises(SourceError, match="not a Hugging Face repo id") as info:
        hub.fetch_config(repo_id)
    assert one_line(info.value)


@pytest.mark.parametrize("repo_id", ["Qwen/Qwen3-0.6B", "01-ai/Yi-6B-Chat", "a_b/c.d-e", "meta-llama/Llama-3.1-8B"])
def test_good_repo_ids_pass(repo_id):
    assert hub.validate_repo_id(repo_id) == repo_id
    assert hub.validate_repo_id(f"  {repo_id}\n") == repo_id  # pasted ids often carry whitespace


@pytest.mark.parametrize("revision", ["a b", "../main", "x" * 201, 5])
def test_bad_revision_is_rejected(hub_env, monkeypatch, revision):
    monkeypatch.setattr(hub, "hf_hub_download", no_network)
    with pytest.raises(SourceError, match="not a valid revision"):
        hub.fetch_config(REPO, revision=revision)


def test_malformed_endpoint_counts_as_unreachable(hub_env, monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:notaport")
    with pytest.raises(HubError, match="cannot reach"):
        hub.fetch_config(REPO)


def test_probe_goes_through_a_configured_proxy(monkeypatch):
    for name in ("no_proxy", "NO_PROXY", "http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)
    with socket.socket() as proxy:
        proxy.bind(("127.0.0.1", 0))
        proxy.listen(1)
        monkeypatch.setenv("https_proxy", f"http://127.0.0.1:{proxy.getsockname()[1]}")
        monkeypatch.delenv("HTTPS_PROXY", raising=False)
        assert hub._reachable("https://huggingface.co", 1.0)  # only the local proxy is contacted
    monkeypatch.setenv("https_proxy", f"http://127.0.0.1:{closed_port()}")
    assert not hub._reachable("https://huggingface.co", 1.0)


def test_tensor_bytes_offline_is_none_and_fast(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    t = time.monotonic()
    assert hub.fetch_tensor_bytes("someone/some-model") is None  # sized from the config instead
    assert time.monotonic() - t < 1


def test_tensor_bytes_from_the_headers(monkeypatch):
    """Online: huggingface_hub reads the safetensors headers; the bytes come from each tensor's offsets."""
    import huggingface_hub
    from types import SimpleNamespace as NS
    meta = NS(files_metadata={"model.safetensors": NS(tensors={"a.weight": NS(data_offsets=(0, 96)),
                                                               "b.weight_scale_inv": NS(data_offsets=(96, 100))})})
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(hub, "_offline", lambda: False)
    monkeypatch.setattr(hub, "_reachable", lambda endpoint, limit: True)
    monkeypatch.setattr(huggingface_hub, "get_safetensors_metadata", lambda repo, token=None: meta)
    assert hub.fetch_tensor_bytes("someone/some-model") == {"a.weight": 96, "b.weight_scale_inv": 4}
    monkeypatch.setattr(huggingface_hub, "get_safetensors_metadata", lambda repo, token=None: 1 / 0)
    assert hub.fetch_tensor_bytes("someone/some-model") is None

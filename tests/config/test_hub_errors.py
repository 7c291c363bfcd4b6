"""Offline tests for tpviz.config.hub's failures: fake hub errors mapped to one line, the online download's
arguments, and repo ids and revisions rejected before any lookup."""

import json
import os

import pytest
from huggingface_hub.errors import (
    GatedRepoError,
    HfHubHTTPError,
    LocalEntryNotFoundError,
    RemoteEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)

from tpviz.config import hub
from tpviz.errors import HubError, SourceError, TpvizError
from tests.helpers.errors import one_line
from tests.helpers.hub import CONFIG, REPO, no_network

pytest_plugins = ["tests.helpers.hub_fixtures"]  # hub_env

# Whichever HTTP package huggingface_hub uses (httpx2 for 2.x, httpx before); needed to build fake responses.
httpx = hub._httpx or pytest.importorskip("httpx2")


def fake_response(status: int, url: str = "https://huggingface.co/x/y/resolve/main/config.json"):
    return httpx.Response(status, request=httpx.Request("HEAD", url))


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
        (GatedRepoError("gated", response=fake_response(403)),
         ["gated", "licence", "HF_TOKEN", "hf auth login"]),
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
    install_fake_download(monkeypatch, online_error=RemoteEntryNotFoundError("x",
                                                                             response=fake_response(404)))
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


@pytest.mark.parametrize("repo_id", ["Qwen/Qwen3-0.6B", "01-ai/Yi-6B-Chat", "a_b/c.d-e",
                                     "meta-llama/Llama-3.1-8B"])
def test_good_repo_ids_pass(repo_id):
    assert hub.validate_repo_id(repo_id) == repo_id
    assert hub.validate_repo_id(f"  {repo_id}\n") == repo_id  # pasted ids often carry whitespace


@pytest.mark.parametrize("revision", ["a b", "../main", "x" * 201, 5])
def test_bad_revision_is_rejected(hub_env, monkeypatch, revision):
    monkeypatch.setattr(hub, "hf_hub_download", no_network)
    with pytest.raises(SourceError, match="not a valid revision"):
        hub.fetch_config(REPO, revision=revision)

"""Offline tests for tpviz.config.hub: a fake Hugging Face cache in tmp_path, offline mode, closed ports and
proxies, and the safetensors header sizes. Hub errors and input validation: test_hub_errors.py."""

import json
import socket
import time

import pytest
from huggingface_hub import constants

from tpviz.config import hub
from tpviz.errors import HubError, SourceError
from tests.helpers.errors import one_line
from tests.helpers.hub import COMMIT, CONFIG, REPO, add_to_cache, closed_port, no_network

pytest_plugins = ["tests.helpers.hub_fixtures"]  # hub_env


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
    add_to_cache(hub_env, "tpviz-test/single-file", {"config.json": "{}"},
                 missing=["model.safetensors.index.json"])
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


# --- endpoints and proxies -------------------------------------------------------------------


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


# --- tensor bytes from the safetensors headers ------------------------------------------------


def test_tensor_bytes_offline_is_none_and_fast(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    t = time.monotonic()
    assert hub.fetch_tensor_bytes("someone/some-model") is None  # sized from the config instead
    assert time.monotonic() - t < 1


def test_tensor_bytes_from_the_headers(monkeypatch):
    """Online: huggingface_hub reads the safetensors headers; the bytes come from each tensor's offsets."""
    from types import SimpleNamespace as NS
    tensors = {"a.weight": NS(data_offsets=(0, 96)), "b.weight_scale_inv": NS(data_offsets=(96, 100))}
    meta = NS(files_metadata={"model.safetensors": NS(tensors=tensors)})
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(hub, "_offline", lambda: False)
    monkeypatch.setattr(hub, "_reachable", lambda endpoint, limit: True)
    monkeypatch.setattr(hub, "get_safetensors_metadata", lambda repo, token=None: meta)
    assert hub.fetch_tensor_bytes("someone/some-model") == {"a.weight": 96, "b.weight_scale_inv": 4}
    monkeypatch.setattr(hub, "get_safetensors_metadata", lambda repo, token=None: 1 / 0)
    assert hub.fetch_tensor_bytes("someone/some-model") is None

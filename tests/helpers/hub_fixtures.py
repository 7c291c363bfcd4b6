"""The hub_env fixture, loaded by the hub tests through `pytest_plugins = ["tests.helpers.hub_fixtures"]`."""
import pytest
from huggingface_hub import constants

from tests.helpers.hub import closed_port


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

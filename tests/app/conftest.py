"""Every explorer AppTest runs offline (empty hub cache), and the server opts in to any local path."""
import pytest


@pytest.fixture(autouse=True)
def clean_env(monkeypatch, tmp_path):
    """Offline hub with an empty cache; TPVIZ_LOCAL_ROOT=/ allows local paths (the web app needs the
    opt-in)."""
    from huggingface_hub import constants
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("TPVIZ_LOCAL_ROOT", "/")
    yield

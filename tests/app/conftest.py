"""Every explorer AppTest runs offline (empty hub cache) with local paths unrestricted."""
import pytest


@pytest.fixture(autouse=True)
def clean_env(monkeypatch, tmp_path):
    """Offline hub with an empty cache, and no local-path restriction."""
    from huggingface_hub import constants
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.delenv("TPVIZ_LOCAL_ROOT", raising=False)
    yield

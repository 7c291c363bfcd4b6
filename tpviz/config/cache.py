"""Where tpviz keeps what it computes once and reads back: $TPVIZ_CACHE, else ~/.cache/tpviz (JSON and
safetensors only, never a pickle)."""
import os
from pathlib import Path


def cache_root() -> Path:
    """The folder tpviz's caches live under ($TPVIZ_CACHE, else ~/.cache/tpviz)."""
    return Path(os.environ.get("TPVIZ_CACHE") or Path.home() / ".cache" / "tpviz")

"""Turn a model source into a ModelSpec: a preset or hub repo id, a local path, a dict, or uploaded bytes.

Configs are parsed as JSON only; nothing from a source is ever executed.
"""
import json
import os
import re
from functools import lru_cache
from pathlib import Path

from tpviz.config.files import MAX_CONFIG_BYTES, QUANT_FILE, parse_config, with_quant_file
from tpviz.config.spec import ModelSpec
from tpviz.config.normalize import normalize
from tpviz.errors import SourceError

LOCAL_ROOT_ENV = "TPVIZ_LOCAL_ROOT"  # a folder confines local paths to it; "off" disables them
REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


@lru_cache(maxsize=1)
def presets() -> dict[str, dict]:
    """Built-in configs keyed by Hugging Face repo id (work offline)."""
    return json.loads((Path(__file__).parent / "presets.json").read_text())


OFF = ("off", "none", "0", "false")
WEB_LOCAL_HINT = f"start it with {LOCAL_ROOT_ENV}=/folder/of/models to allow that folder"
WEB_LOCAL_OFF = (f"local paths are off in the web app; {WEB_LOCAL_HINT}, or pick a preset, a hub id or "
                 "upload a config.json")


def web_local_root() -> str | None:
    """The web app's local-path folder: opt-in, so visitors cannot probe the server's files unless its owner
    set TPVIZ_LOCAL_ROOT to a folder (the CLI keeps full local access when it is unset)."""
    root = os.environ.get(LOCAL_ROOT_ENV, "").strip()
    return root if root and root.lower() not in OFF else None


def check_local_path(path: str | Path) -> Path:
    """Resolve a local path, refusing it when TPVIZ_LOCAL_ROOT disables or confines local access."""
    root = os.environ.get(LOCAL_ROOT_ENV, "").strip()
    if root.lower() in OFF:
        raise SourceError(f"local paths are disabled here ({LOCAL_ROOT_ENV}={root}); pick a "
                          "preset, a hub id or upload a config.json")
    try:
        resolved = Path(path).expanduser().resolve()
    except (RuntimeError, OSError) as e:  # e.g. "~user" with no such home directory
        raise SourceError(f"cannot resolve local path {path}: {e}") from None
    if root:
        base = Path(root).expanduser().resolve()
        if resolved != base and base not in resolved.parents:
            raise SourceError(f"local paths are limited to {base} ({LOCAL_ROOT_ENV}); {path} is outside it")
    return resolved


def local_config(path: str | Path) -> tuple[dict, str]:
    """Read config.json from a file or a checkpoint folder; returns (config, display name)."""
    p = check_local_path(path)
    try:
        if p.is_dir():
            if not (p / "config.json").is_file():
                odd = (p / "config.json").exists()  # a directory, FIFO or device: never opened
                raise SourceError(f"folder {path} "
                                  + ("has a config.json that is not a regular file" if odd else
                                                       "has no config.json"))
            name, p = p.name, p / "config.json"
        elif p.is_file():
            name = p.parent.name if p.name == "config.json" else p.stem
        elif p.exists():  # a FIFO, device or socket: never opened (a FIFO would block the read)
            raise SourceError(f"{path} is not a regular file; give a config.json or a checkpoint folder")
        else:
            raise SourceError(f"no such file or folder: {path}")
        size = p.stat().st_size
        if size > MAX_CONFIG_BYTES:
            raise SourceError(f"{path} is {size / 1e6:.1f} MB; expected a config.json of a few KB")
        data = p.read_bytes()
        cfg = parse_config(data, str(path))
        extra = p.parent / QUANT_FILE
        # ModelOpt's older exports, as vLLM reads them
        if "quantization_config" not in cfg and extra.is_file():
            cfg = with_quant_file(cfg, parse_config(extra.read_bytes(), str(extra)))
    except OSError as e:  # permissions, a name too long, a vanished file
        raise SourceError(f"cannot read {path}: {e.strerror or e}") from None
    return cfg, name


def looks_local(text: str) -> bool:
    """Whether a source string names a local path rather than a hub id. When local access is
    restricted, only explicit paths count, so the answer never reveals what exists on the server."""
    if text.startswith((".", "/", "~")) or text.endswith(".json"):  # a hub id names a repo, never a file
        return True
    if os.environ.get(LOCAL_ROOT_ENV, "").strip():
        return False
    try:
        return Path(text).exists()
    except OSError:  # e.g. a name longer than the filesystem allows
        return False


HUB_URL = re.compile(r"^https?://(?:www\.)?(?:huggingface\.co|hf\.co)/([^/?#\s]+/[^/?#\s]+)(?:[/?#].*)?$")


def repo_from_url(text: str) -> str:
    """'https://huggingface.co/Qwen/Qwen3-8B/tree/main' -> 'Qwen/Qwen3-8B'; anything else unchanged."""
    match = HUB_URL.match(text.strip())
    return match.group(1) if match else text


def find_preset(name: str) -> str | None:
    """The preset key matching name exactly or case-insensitively, else None."""
    table = presets()
    if name in table:
        return name
    return next((k for k in table if k.lower() == name.lower()), None)


def resolve_config(source: str | Path | dict | bytes) -> tuple[dict, str]:
    """(config dict, display name) for any supported source."""
    if isinstance(source, dict):
        return source, str(source.get("_name_or_path") or "config")
    if isinstance(source, (bytes, bytearray)):
        return parse_config(bytes(source), "uploaded config"), "uploaded config"
    if isinstance(source, (str, Path)) and not str(source).strip():
        raise SourceError("no model given: name a preset, a hub repo id (owner/name) or a local path")
    if not isinstance(source, (str, Path)):
        raise SourceError("model source must be a preset, hub id, path, dict or bytes, got "
                          f"{type(source).__name__}")
    text = repo_from_url(str(source).strip()) if isinstance(source, str) else str(source).strip()
    if isinstance(source, str) and (key := find_preset(text)):
        return presets()[key], key
    if isinstance(source, Path) or looks_local(text):
        return local_config(text)
    if REPO_ID.match(text):
        # start-up: huggingface_hub loads only when a hub id is read, not on `import tpviz` or for a preset
        from tpviz.config.hub import fetch_config
        return fetch_config(text), text
    sample = ", ".join(list(presets())[:4])
    shown = text if len(text) <= 120 else f"{text[:100]}… ({len(text)} characters)"
    raise SourceError(f"unknown model {shown!r}: not a preset, a local path or a hub repo id (owner/name); "
                      f"presets include {sample}")


def load_spec(source: str | Path | dict | bytes | ModelSpec, name: str | None = None) -> ModelSpec:
    """The normalized spec of any model source; every failure is one ValueError line."""
    if isinstance(source, ModelSpec):
        return source
    cfg, default_name = resolve_config(source)
    return normalize(cfg, name or default_name)

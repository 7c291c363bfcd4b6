"""Fetch a Hugging Face repo's config.json and safetensors index: cache first, then the hub, fast when
offline.

Only JSON is read (json.loads); nothing from the repo is ever executed. Every failure
becomes a one-line tpviz.errors.SourceError / HubError.

What is here and huggingface_hub does not do: a 2 s TCP probe before any download (offline, hf_hub_download
retries DNS for ~23 s, and a dropping network waits up to 60 s per try); the environment re-read at call time
(the library reads HF_HUB_OFFLINE / HF_HOME / HF_ENDPOINT once, at import); the repo-id check before any
request; and one line per failure (its errors, and httpx's, which are not OSErrors). Downloads, the cache
layout and the cache lookups are the library's (hf_hub_download, try_to_load_from_cache,
get_safetensors_metadata).
"""

from __future__ import annotations

import json
import os
import re
import socket
import threading
import urllib.parse
import urllib.request
from pathlib import Path

from tpviz.config.fields import json_type
from tpviz.config.files import QUANT_FILE, with_quant_file
from tpviz.errors import HubError, SourceError

try:
    from huggingface_hub import (_CACHED_NO_EXIST, constants, get_safetensors_metadata, hf_hub_download,
                                 try_to_load_from_cache)
    from huggingface_hub.errors import (
        DisabledRepoError,
        EntryNotFoundError,
        GatedRepoError,
        HfHubHTTPError,
        HFValidationError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )
except ImportError:  # pragma: no cover - the app still runs from presets and local files
    constants = None

# huggingface_hub 2.x talks through `httpx2`; older releases used `httpx`. Its errors
# (e.g. ConnectError) are not OSError, so they need catching on their own.
try:
    import httpx2 as _httpx
except ImportError:  # pragma: no cover - depends on the installed hub version
    try:
        import httpx as _httpx
    except ImportError:
        _httpx = None
_HTTP_ERRORS: tuple[type[BaseException], ...] = (_httpx.HTTPError,) if _httpx is not None else ()

CONFIG_FILE = "config.json"
INDEX_FILE = "model.safetensors.index.json"
PROBE_SECONDS = 2.0
PICK_HINT = "pick a preset or a local config.json"  # what works instead (a page that reads neither: its own)

# Hub rule: each part is letters, digits, '-', '_', '.'; no leading/trailing '-' or '.';
# no '--' or '..'; at most 96 characters.
_PART = r"[A-Za-z0-9_](?:[A-Za-z0-9_.\-]{0,94}[A-Za-z0-9_])?"
_REPO_ID = re.compile(rf"{_PART}/{_PART}")
_REVISION = re.compile(r"[A-Za-z0-9_.\-/]{1,200}")


def fetch_config(repo_id: str, revision: str | None = None, timeout: float = 3.0) -> dict:
    """Return the parsed config.json of a hub repo (cache first; HubError/SourceError on failure)."""
    path = _fetch(repo_id, CONFIG_FILE, revision, timeout, missing_ok=False)
    if path is None:  # not reached: missing_ok=False raises instead
        raise HubError(f"{repo_id} has no {CONFIG_FILE}")
    cfg = read_json(path, repo_id, CONFIG_FILE)
    if "quantization_config" not in cfg:  # ModelOpt's older exports keep it in hf_quant_config.json
        try:  # from the cache only: one more download per hub id would slow every lookup
            extra = try_to_load_from_cache(repo_id, QUANT_FILE, cache_dir=_cache_dir(), revision=revision)
        except (OSError, ValueError):
            extra = None
        if isinstance(extra, str):
            cfg = with_quant_file(cfg, read_json(extra, repo_id, QUANT_FILE))
    return cfg


def fetch_index(repo_id: str, revision: str | None = None, timeout: float = 3.0) -> dict | None:
    """Return the parsed model.safetensors.index.json of a hub repo, or None when it has none."""
    path = _fetch(repo_id, INDEX_FILE, revision, timeout, missing_ok=True)
    return None if path is None else read_json(path, repo_id, INDEX_FILE)


def validate_repo_id(repo_id: object) -> str:
    """Return repo_id stripped if it has the hub's owner/name form, else raise SourceError."""
    text = repo_id.strip() if isinstance(repo_id, str) else ""
    if not _REPO_ID.fullmatch(text) or "--" in text or ".." in text:
        shown = repr(repo_id)[:120]
        raise SourceError(
            f"{shown} is not a Hugging Face repo id: expected owner/name using letters, "
            "digits, '-', '_' or '.'"
        )
    return text


def _validate_revision(revision: object) -> str | None:
    """Return a plain ref (branch, tag or commit hash), None for none/blank, else raise SourceError."""
    if revision is None or (isinstance(revision, str) and not revision.strip()):
        return None
    text = revision.strip() if isinstance(revision, str) else ""
    if not _REVISION.fullmatch(text) or ".." in text:
        raise SourceError(f"{repr(revision)[:120]} is not a valid revision (a branch, tag or commit hash)")
    return text


def _env_true(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in {"1", "true", "yes", "on", "y", "t"}


def _offline() -> bool:
    """HF_HUB_OFFLINE as the library read it at import, or as the environment says now."""
    return bool(getattr(constants, "HF_HUB_OFFLINE", False)) or _env_true("HF_HUB_OFFLINE")


def _endpoint() -> str:
    """Hub URL: HF_ENDPOINT now, else what the library resolved at import."""
    return (os.environ.get("HF_ENDPOINT") or constants.ENDPOINT).rstrip("/")


def _cache_dir() -> str:
    """Hub cache folder, re-read from the environment because the library reads it only at import."""
    env = os.environ
    folder = env.get("HF_HUB_CACHE") or env.get("HUGGINGFACE_HUB_CACHE")
    if not folder and env.get("HF_HOME"):
        folder = os.path.join(env["HF_HOME"], "hub")
    return os.path.expandvars(os.path.expanduser(folder or constants.HF_HUB_CACHE))


def _reachable(endpoint: str, limit: float) -> bool:
    """True if a TCP connection to the endpoint (or its proxy) opens within `limit` seconds."""
    try:
        url = urllib.parse.urlsplit(endpoint)
        host = url.hostname or ""
        port = url.port or (443 if url.scheme == "https" else 80)
        proxy = None if urllib.request.proxy_bypass(host) else urllib.request.getproxies().get(url.scheme)
        if proxy:  # the download goes through the proxy, so that is what must answer
            purl = urllib.parse.urlsplit(proxy if "://" in proxy else "http://" + proxy)
            host, port = purl.hostname or host, purl.port or 8080
    except (OSError, ValueError):  # a malformed endpoint or proxy URL (e.g. a bad port)
        return False
    ok: list[bool] = []

    def attempt() -> None:
        try:
            with socket.create_connection((host, port), timeout=limit):
                ok.append(True)
        except (OSError, ValueError):
            pass

    # A thread bounds the whole probe, DNS lookup included (getaddrinfo has no timeout).
    worker = threading.Thread(target=attempt, daemon=True)
    worker.start()
    worker.join(limit)
    return bool(ok)


def _unreachable(endpoint: str, repo_id: str) -> HubError:
    return HubError(f"cannot reach {endpoint} (offline?) and {repo_id} is not in the local cache; "
                    f"{PICK_HINT}")


def _fetch(repo_id: str, filename: str, revision: str | None, timeout: float, missing_ok: bool) -> str | None:
    """Local path of `filename` in the repo: from the cache, else downloaded; None if absent and
    missing_ok."""
    repo_id = validate_repo_id(repo_id)
    revision = _validate_revision(revision)
    if constants is None:
        raise HubError(f"huggingface_hub is not installed; {PICK_HINT}")
    cache_dir = _cache_dir()
    args = dict(repo_id=repo_id, filename=filename, revision=revision, cache_dir=cache_dir)
    endpoint = _endpoint()

    try:
        # token=False: a cache lookup needs no credentials (and must not try to refresh one).
        return hf_hub_download(**args, local_files_only=True, token=False)
    except LocalEntryNotFoundError:
        pass  # not cached: decide below whether the network may be tried
    except Exception as exc:  # noqa: BLE001 - every library error becomes one line
        raise _map_error(exc, repo_id, filename, revision, endpoint) from None

    try:
        # The hub may have recorded that this file does not exist in the cached revision.
        cached = try_to_load_from_cache(repo_id, filename, cache_dir=cache_dir, revision=revision)
    except (OSError, ValueError):
        cached = None  # an unreadable cache entry just means "not cached"
    if cached is _CACHED_NO_EXIST:
        if missing_ok:
            return None
        raise HubError(f"{repo_id} has no {filename}")

    if _offline():
        raise HubError(f"{repo_id} is not in the local Hugging Face cache and HF_HUB_OFFLINE is set; "
                       f"unset it to download, or {PICK_HINT}")
    if not _reachable(endpoint, min(PROBE_SECONDS, max(timeout, 0.1))):
        raise _unreachable(endpoint, repo_id)

    try:
        return hf_hub_download(**args, endpoint=endpoint, etag_timeout=max(timeout, 0.1))
    except Exception as exc:  # noqa: BLE001 - every library error becomes one line
        if missing_ok and _is_missing_entry(exc):
            return None
        raise _map_error(exc, repo_id, filename, revision, endpoint) from None


def _is_missing_entry(exc: BaseException) -> bool:
    """True for 'the repo exists but has no such file' (not for 'cannot look')."""
    return isinstance(exc, EntryNotFoundError) and not isinstance(exc, LocalEntryNotFoundError)


def _map_error(exc: BaseException, repo_id: str, filename: str, revision: str | None,
               endpoint: str) -> SourceError:
    """Translate a huggingface_hub / network exception into one tpviz error line."""
    # Order matters: GatedRepoError is a RepositoryNotFoundError, and most hub errors are OSErrors.
    if isinstance(exc, GatedRepoError):
        return HubError(
            f"{repo_id} is gated: accept the licence on {endpoint}/{repo_id} "
            "and set HF_TOKEN or run `hf auth login`"
        )
    if isinstance(exc, RepositoryNotFoundError):
        return HubError(
            f"{repo_id} was not found on the Hugging Face hub; check the id, "
            "or set HF_TOKEN / run `hf auth login` if it is private"
        )
    if isinstance(exc, RevisionNotFoundError):
        return HubError(f"revision {revision!r} of {repo_id} was not found on the Hugging Face hub")
    if isinstance(exc, DisabledRepoError):
        return HubError(f"{repo_id} has been disabled on the Hugging Face hub")
    if _is_missing_entry(exc):
        return HubError(f"{repo_id} has no {filename}")
    if isinstance(exc, LocalEntryNotFoundError):
        return _unreachable(endpoint, repo_id)
    if isinstance(exc, HfHubHTTPError):
        status = getattr(getattr(exc, "response", None), "status_code", "?")
        if status == 401:
            return HubError(f"the Hugging Face hub refused {repo_id} (HTTP 401); set HF_TOKEN "
                            "or run `hf auth login`")
        return HubError(f"the Hugging Face hub could not serve {filename} of {repo_id} (HTTP {status})")
    if isinstance(exc, HFValidationError):
        return SourceError(f"{repo_id} / revision {revision!r} rejected by "
                           f"huggingface_hub: {_first_line(exc)}")
    if isinstance(exc, (OSError, TimeoutError) + _HTTP_ERRORS):
        return HubError(
            f"cannot download {filename} of {repo_id} from {endpoint} ({type(exc).__name__}: "
            f"{_first_line(exc)}); {PICK_HINT}"
        )
    return HubError(f"reading {filename} of {repo_id} failed: {type(exc).__name__}: {_first_line(exc)}")


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0][:200] if lines else "no details"


def read_json(path: str, repo_id: str, filename: str) -> dict:
    """Parse a downloaded JSON file as data only; it must be an object."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise SourceError(f"{filename} of {repo_id} is not valid JSON: not UTF-8 ({exc.reason})") from None
    except OSError as exc:
        raise SourceError(f"cannot read the cached {filename} of {repo_id}: {exc.strerror or exc}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SourceError(f"{filename} of {repo_id} is not valid JSON: {exc}") from None
    except RecursionError:
        raise SourceError(f"{filename} of {repo_id} is not valid JSON: nested too deeply") from None
    if not isinstance(data, dict):
        raise SourceError(f"{filename} of {repo_id} is not a JSON object (got {json_type(data)})")
    return data


def fetch_tensor_bytes(repo_id: str, timeout: float = 3.0) -> dict[str, int] | None:
    """Stored bytes of every tensor of a hub repo, from its safetensors headers (huggingface_hub's
    get_safetensors_metadata reads only the headers). None offline or on any failure: the map is then sized
    from the config alone, and says so."""
    validate_repo_id(repo_id)
    if _offline() or not _reachable(_endpoint(), min(timeout, 2.0)):
        return None
    try:
        meta = get_safetensors_metadata(repo_id, token=os.environ.get("HF_TOKEN") or None)
        return {name: info.data_offsets[1] - info.data_offsets[0] for f in meta.files_metadata.values()
                for name, info in f.tensors.items()}
    except Exception:  # noqa: BLE001 - httpx2 errors are no OSError; any failure just means "not checked"
        return None

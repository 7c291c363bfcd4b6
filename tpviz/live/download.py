"""Real weights for a live run: a hub repo's safetensors checkpoint, downloaded into the Hugging Face cache.

Only config.json, the safetensors weights (model.safetensors, or the shards its index names), the index and
the tokenizer files are fetched: pickles (*.bin, *.pt) are never downloaded or loaded, and no code from the
repo runs. With HF_HUB_OFFLINE set, or the hub out of reach, a cached snapshot is used as it is. Progress goes
to a callback called from the caller's thread (the page updates its widgets from there); every failure is one
HubError / WeightsError line.
"""
from __future__ import annotations

import json
import shutil
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from tpviz import hub
from tpviz.errors import HubError, SourceError, TpvizError, WeightsError
from tpviz.live.errors import RANDOM_FLAG

try:
    from huggingface_hub import HfApi, snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError
except ImportError:  # pragma: no cover - hub.constants is None then, and download_checkpoint says so
    HfApi = snapshot_download = None
    LocalEntryNotFoundError = ()

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "special_tokens_map.json",
                   "generation_config.json")
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
RANDOM_HINT = f"use {RANDOM_FLAG} to run without downloading"
LARGE_BYTES = 2 << 30  # a download this size earns a note (with a shrunk model: most of it is not read)
POLL_S = 0.2  # how often the caller's thread reports progress while the download runs
# what snapshot_download's bytes bar is called (the other bars count files or network transfer)
_BYTES_BAR = "huggingface_hub.snapshot_download"

Progress = Callable[[str, int, int], None]  # (what is happening, bytes done, bytes in all)


@dataclass
class Download:
    """A repo's checkpoint in the Hugging Face cache: its snapshot folder and what it cost."""
    repo_id: str
    folder: Path
    commit: str
    total_bytes: int  # the weights, config and tokenizer files of the snapshot
    fetched_bytes: int = 0  # downloaded by this call (0: everything was cached)
    offline: str | None = None  # why the hub was not asked (HF_HUB_OFFLINE, unreachable), or None

    def note(self) -> str:
        """One line for the result's notes: where the real weights came from."""
        where = f"{self.repo_id} at {self.commit[:12]}" if self.commit else self.repo_id
        how = (f"downloaded {human_size(self.fetched_bytes)} into the Hugging Face cache" if self.fetched_bytes
               else "from the Hugging Face cache" + (f"; {self.offline}" if self.offline else ""))
        return f"real weights: {where}, {human_size(self.total_bytes)}, {how}"


def human_size(n: int | float) -> str:
    """Bytes as people read them: 1.5 GB, 770.5 KB."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{int(n)} B"


def download_checkpoint(repo_id: str, revision: str | None = None, *, progress: Progress | None = None,
                        bars: bool = True) -> Download:
    """The repo's safetensors checkpoint in the Hugging Face cache (downloaded unless cached or offline).

    `progress(message, done, total)` is called from this thread while bytes are fetched (never when
    everything is cached); an exception from it stops the download. `bars` keeps huggingface_hub's own
    progress bars (on stderr, when it is a terminal).
    """
    repo_id = hub.validate_repo_id(repo_id)
    revision = hub._validate_revision(revision)
    if hub.constants is None:
        raise HubError("huggingface_hub is not installed; " + RANDOM_HINT)
    cache_dir, endpoint = hub._cache_dir(), hub._endpoint()
    if hub._offline():
        return _cached(repo_id, revision, cache_dir, "HF_HUB_OFFLINE is set (no network)")
    if not hub._reachable(endpoint, hub.PROBE_SECONDS):
        return _cached(repo_id, revision, cache_dir, f"cannot reach {endpoint} (no network?)")
    try:
        commit, sizes = _listing(repo_id, revision, endpoint)
    except Exception as exc:  # noqa: BLE001 - every library error becomes one line
        raise _error(exc, repo_id, revision, endpoint, cache_dir) from None
    ref = commit or revision  # the listed commit, so the files fetched are the files listed
    try:
        files = _choose_files(repo_id, ref, sizes)
    except TpvizError as exc:
        raise _error(exc, repo_id, revision, endpoint, cache_dir) from None
    total = sum(sizes.get(f) or 0 for f in files)
    snapshot = Path(cache_dir) / f"models--{repo_id.replace('/', '--')}" / "snapshots" / (commit or "?")
    need = sum(sizes.get(f) or 0 for f in files if not (snapshot / f).is_file())
    _check_disk(repo_id, cache_dir, need)
    message = f"downloading {repo_id} ({len(files)} files, {human_size(need)}) into {cache_dir}"
    folder = _run(lambda tqdm_class: snapshot_download(
        repo_id, revision=ref, cache_dir=cache_dir, endpoint=endpoint, allow_patterns=files,
        tqdm_class=tqdm_class), progress if need else None, message, need, bars, repo_id, revision, endpoint,
        cache_dir)
    _weights_in(repo_id, Path(folder), "the download is incomplete; run it again")
    return Download(repo_id, Path(folder), commit or Path(folder).name, total, need)


def _listing(repo_id: str, revision: str | None, endpoint: str) -> tuple[str, dict[str, int | None]]:
    """(commit, {file: size}) of the repo's top-level files, in one hub call (token from HF_TOKEN or the login)."""
    info = HfApi(endpoint=endpoint).model_info(repo_id, revision=revision, files_metadata=True)
    return info.sha or "", {s.rfilename: s.size for s in (info.siblings or [])}


def _choose_files(repo_id: str, commit: str | None, sizes: dict[str, int | None]) -> list[str]:
    """The files to fetch: config, the weights transformers would load (never pickles), the tokenizer."""
    if CONFIG_FILE not in sizes:
        raise HubError(f"{repo_id} has no {CONFIG_FILE}")
    if INDEX_FILE in sizes:
        index = hub.fetch_index(repo_id, revision=commit)
        weight_map = index.get("weight_map") if isinstance(index, dict) else None
        if not isinstance(weight_map, dict) or not weight_map:
            raise WeightsError(f"{INDEX_FILE} of {repo_id} has no weight_map")
        shards = list(dict.fromkeys(str(v) for v in weight_map.values()))
        missing = [s for s in shards if s not in sizes]
        if missing:
            raise WeightsError(f"{INDEX_FILE} of {repo_id} names {missing[0]}, which the repo does not have")
        weights = [INDEX_FILE, *shards]
    elif WEIGHTS_FILE in sizes:
        weights = [WEIGHTS_FILE]
    else:
        raise _no_safetensors(repo_id, list(sizes))
    return [CONFIG_FILE, *weights, *(f for f in TOKENIZER_FILES if f in sizes)]


def _no_safetensors(repo_id: str, names: list[str], where: str = "") -> WeightsError:
    """Why a repo (or its cached snapshot) gives no weights to load: pickles only, other files, or none."""
    pickles = sorted(n for n in names if n.lower().endswith(PICKLE_SUFFIXES))
    others = sorted(n for n in names if n.endswith(".safetensors"))
    if pickles:
        return WeightsError(f"{repo_id}{where} has only pickle weights ({pickles[0]}"
                            f"{f' and {len(pickles) - 1} more' if len(pickles) > 1 else ''}), which tpviz never "
                            f"loads; convert them to safetensors, or {RANDOM_HINT}")
    if others:
        return WeightsError(f"{repo_id}{where} has no {WEIGHTS_FILE} or {INDEX_FILE} ({others[0]} is not in "
                            f"transformers' layout); {RANDOM_HINT}")
    return WeightsError(f"{repo_id}{where} has no safetensors weights; {RANDOM_HINT}")


def _check_disk(repo_id: str, cache_dir: str, need: int) -> None:
    """Refuse, before any byte is fetched, a download the cache's disk cannot hold."""
    folder = Path(cache_dir)
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    try:
        free = shutil.disk_usage(folder).free
    except OSError:
        return  # cannot tell: the download itself will say
    if need > free:
        raise WeightsError(f"downloading {repo_id} needs {human_size(need)} but only {human_size(free)} is free in "
                           f"{cache_dir}; free some space or point HF_HUB_CACHE at a bigger disk, or {RANDOM_HINT}")


def _cached(repo_id: str, revision: str | None, cache_dir: str, reason: str) -> Download:
    """The cached snapshot, without asking the hub; one line when its weights are not all there."""
    try:
        # only config.json is required here: the weights are checked below, with a clearer message
        folder = Path(snapshot_download(repo_id, revision=revision, cache_dir=cache_dir, local_files_only=True,
                                        allow_patterns=[CONFIG_FILE]))
    except LocalEntryNotFoundError:
        raise HubError(f"{repo_id} is not in the local Hugging Face cache and {reason}: connect to download it, "
                       f"or {RANDOM_HINT}") from None
    except Exception as exc:  # noqa: BLE001 - every library error becomes one line
        raise _error(exc, repo_id, revision, hub._endpoint(), cache_dir) from None
    _weights_in(repo_id, folder, f"{reason}: connect to download them, or {RANDOM_HINT}")
    names = [p.name for p in folder.iterdir()] if folder.is_dir() else []
    total = sum(_file_size(folder / n) for n in names)
    return Download(repo_id, folder, folder.name, total, 0, reason)


def _file_size(path: Path) -> int:
    try:
        return path.stat().st_size if path.is_file() else 0
    except OSError:
        return 0


def _weights_in(repo_id: str, folder: Path, hint: str) -> None:
    """Raise one line unless the snapshot folder holds a complete safetensors checkpoint."""
    from tpviz.live.weights import checkpoint_files
    try:
        names = [p.name for p in folder.iterdir()]
    except OSError as e:
        raise WeightsError(f"cannot read the cached snapshot of {repo_id} ({e.strerror or e})") from None
    if INDEX_FILE in names:
        try:
            shards = list(dict.fromkeys(json.loads((folder / INDEX_FILE).read_text())["weight_map"].values()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            raise WeightsError(f"the cached {INDEX_FILE} of {repo_id} is not a valid safetensors index") from None
        missing = [s for s in shards if not isinstance(s, str) or not (folder / s).is_file()]
        if missing:
            raise WeightsError(f"the cached snapshot of {repo_id} lacks {missing[0]}"
                               f"{f' and {len(missing) - 1} more shards' if len(missing) > 1 else ''}; {hint}")
    elif WEIGHTS_FILE not in names:
        if any(n.lower().endswith(PICKLE_SUFFIXES) or n.endswith(".safetensors") for n in names):
            raise _no_safetensors(repo_id, names, "'s cached snapshot")
        raise WeightsError(f"the weights of {repo_id} are not in the local Hugging Face cache (only "
                           f"{', '.join(sorted(names)) or 'nothing'}) and {hint}")
    checkpoint_files(folder)  # the loader's own checks (links out of the cache, odd files): one line


def _error(exc: BaseException, repo_id: str, revision: str | None, endpoint: str, cache_dir: str) -> TpvizError:
    """One line for a failed listing or download: the hub's own mapping, or a disk / OS error."""
    if isinstance(exc, TpvizError):  # hub.py's own lines: its "pick a preset" hint does not apply here
        return type(exc)(str(exc).replace("pick a preset or a local config.json", RANDOM_HINT))
    hub_errors = tuple(t for t in (getattr(hub, "HfHubHTTPError", None), getattr(hub, "HFValidationError", None),
                                   getattr(hub, "EntryNotFoundError", None)) if t is not None)
    if isinstance(exc, OSError) and not isinstance(exc, hub_errors) and exc.errno is not None:
        return WeightsError(f"downloading {repo_id} into {cache_dir} failed ({exc.strerror or exc}); free some "
                            f"space or fix the folder's permissions (HF_HUB_CACHE picks another), or {RANDOM_HINT}")
    mapped = hub._map_error(exc, repo_id, "the checkpoint", revision, endpoint)
    text = str(mapped).replace("pick a preset or a local config.json", RANDOM_HINT)
    return type(mapped)(text) if isinstance(mapped, SourceError) else HubError(text)


class _Cancelled(Exception):
    """Raised inside the download threads once the caller stopped waiting."""


class _State:
    def __init__(self):
        self.lock, self.done, self.cancelled = threading.Lock(), 0, False


def _bar_class(state: _State, bars: bool):
    """A huggingface_hub tqdm that also counts the snapshot's written bytes, and stops once cancelled."""
    from huggingface_hub.utils import tqdm as hf_tqdm

    class Bar(hf_tqdm):
        def __init__(self, *args, **kwargs):
            self._counts = kwargs.get("name") == _BYTES_BAR
            if not bars:
                kwargs["disable"] = True
            super().__init__(*args, **kwargs)

        def update(self, n=1):
            if state.cancelled:
                raise _Cancelled()
            if self._counts:
                with state.lock:
                    state.done += int(n or 0)
            return super().update(n)

    return Bar


def _run(fetch, progress: Progress | None, message: str, total: int, bars: bool, repo_id: str,
         revision: str | None, endpoint: str, cache_dir: str) -> str:
    """fetch(tqdm_class) in a thread; this thread reports progress until it ends (and cancels it on an error)."""
    state, out = _State(), {}

    def work():
        try:
            out["folder"] = fetch(_bar_class(state, bars))
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
            out["error"] = exc

    worker = threading.Thread(target=work, name="tpviz-download", daemon=True)
    try:
        if progress:
            progress(message, 0, total)
        worker.start()
        shown = -1
        while worker.is_alive():
            worker.join(POLL_S)
            if progress and state.done != shown:
                shown = state.done
                progress(message, min(shown, total), total)
    except BaseException:  # the callback stopped us (Stop on the page, Ctrl-C): the threads stop at their next chunk
        state.cancelled = True
        raise
    if "error" in out:
        exc = out["error"]
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            raise exc
        raise _error(exc, repo_id, revision, endpoint, cache_dir) from None
    if progress:
        progress(message, total, total)
    return out["folder"]


def shrink_note(download: Download, layers: int | None, total_layers: int) -> str | None:
    """A note when most of a large download is not read because the model was shrunk."""
    if layers is None or layers >= total_layers or download.total_bytes < LARGE_BYTES:
        return None
    return (f"the whole checkpoint ({human_size(download.total_bytes)}) is in the Hugging Face cache; only the "
            f"first {layers} of {total_layers} layers are read")

"""Real weights for a live run: a hub repo's safetensors checkpoint, downloaded into the Hugging Face cache.

Only config.json, the safetensors weights (model.safetensors, or the shards its index names), the index and
the tokenizer files are fetched: pickles (*.bin, *.pt) are never downloaded or loaded, and no code from the
repo runs. A model shrunk to its first layers skips the shards holding only later ones. With HF_HUB_OFFLINE
set, or the hub out of reach, a cached snapshot is used as it is (it may lack those shards). Progress goes to
a callback called from the caller's thread (the page updates its widgets from there); every failure is one
HubError / WeightsError line.
"""
from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from tpviz.config import hub
from tpviz.errors import HubError, SourceError, TpvizError, WeightsError
from tpviz.live.errors import RANDOM_FLAG
from tpviz.live.load.weights import checkpoint_files
from tpviz.live.load.progress import Progress, run_with_progress
from tpviz.live.load.targets import layer_of

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


@dataclass
class Download:
    """A repo's checkpoint in the Hugging Face cache: its snapshot folder and what it cost."""
    repo_id: str
    folder: Path
    commit: str
    total_bytes: int  # the weights, config and tokenizer files of the snapshot
    fetched_bytes: int = 0  # downloaded by this call (0: everything was cached)
    offline: str | None = None  # why the hub was not asked (HF_HUB_OFFLINE, unreachable), or None
    shards: list[str] = field(default_factory=list)  # shard files the index names (none: a model.safetensors)
    # shards holding only layers past the kept ones, not fetched
    skipped: list[str] = field(default_factory=list)
    skipped_bytes: int | None = None  # their size per the hub's listing (None: not known offline)

    def note(self) -> str:
        """One line for the result's notes: where the real weights came from."""
        where = f"{self.repo_id} at {self.commit[:12]}" if self.commit else self.repo_id
        how = (f"downloaded {human_size(self.fetched_bytes)} into the Hugging Face cache"
               if self.fetched_bytes
               else "from the Hugging Face cache" + (f"; {self.offline}" if self.offline else ""))
        return f"real weights: {where}, {human_size(self.total_bytes)}, {how}"


def human_size(n: int | float) -> str:
    """Bytes as people read them: 1.5 GB, 770.5 KB."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{int(n)} B"


def download_checkpoint(repo_id: str, revision: str | None = None, *, layers: int | None = None,
                        progress: Progress | None = None, bars: bool = True) -> Download:
    """The repo's safetensors checkpoint in the Hugging Face cache (downloaded unless cached or offline).

    `layers` keeps the first decoder layers only: a sharded checkpoint's shards holding nothing else are not
    fetched (nor required in the cache). `progress(message, done, total)` is called from this thread while
    bytes are fetched (never when everything is cached); an exception from it stops the download. `bars`
    keeps huggingface_hub's own progress bars (on stderr, when it is a terminal).
    """
    repo_id = hub.validate_repo_id(repo_id)
    revision = hub._validate_revision(revision)
    if hub.constants is None:
        raise HubError("huggingface_hub is not installed; " + RANDOM_HINT)
    cache_dir, endpoint = hub._cache_dir(), hub._endpoint()
    if hub._offline():
        return _cached(repo_id, revision, cache_dir, "HF_HUB_OFFLINE is set (no network)", layers)
    if not hub._reachable(endpoint, hub.PROBE_SECONDS):
        return _cached(repo_id, revision, cache_dir, f"cannot reach {endpoint} (no network?)", layers)
    try:
        commit, sizes = _listing(repo_id, revision, endpoint)
        ref = commit or revision  # the listed commit, so the files fetched are the files listed
        # with a sharded checkpoint, its index is fetched first
        files = _choose_files(repo_id, ref, sizes, layers)
    except Exception as exc:  # noqa: BLE001 - every library error becomes one line
        raise _error(exc, repo_id, revision, endpoint, cache_dir) from None
    snapshot = Path(cache_dir) / f"models--{repo_id.replace('/', '--')}" / "snapshots" / (commit or "?")
    need = sum(sizes.get(f) or 0 for f in files if not (snapshot / f).is_file())
    _check_disk(repo_id, cache_dir, need)
    message = f"downloading {repo_id} ({len(files)} files, {human_size(need)}) into {cache_dir}"
    folder = run_with_progress(lambda tqdm_class: snapshot_download(
        repo_id, revision=ref, cache_dir=cache_dir, endpoint=endpoint, allow_patterns=files,
        tqdm_class=tqdm_class), progress if need else None, message, need, bars,
        lambda exc: _error(exc, repo_id, revision, endpoint, cache_dir))
    got = _snapshot(repo_id, Path(folder), "the download is incomplete; run it again", layers)
    # not needed, but cached before
    files += [s for s in got.shards if s not in files and s not in got.skipped]
    got.commit, got.total_bytes, got.fetched_bytes = (commit or got.commit,
                                                      sum(sizes.get(f) or 0 for f in files), need)
    if all(sizes.get(s) is not None for s in got.skipped):
        got.skipped_bytes = sum(sizes[s] for s in got.skipped)
    return got


def _listing(repo_id: str, revision: str | None, endpoint: str) -> tuple[str, dict[str, int | None]]:
    """(commit, {file: size}) of the repo's top-level files, in one hub call (token from HF_TOKEN or the
    login)."""
    info = HfApi(endpoint=endpoint).model_info(repo_id, revision=revision, files_metadata=True)
    return info.sha or "", {s.rfilename: s.size for s in (info.siblings or [])}


def needed_shards(weight_map: dict, layers: int | None) -> list[str]:
    """The index's shard files a model of the first `layers` layers reads (all when None): those holding a
    tensor of a kept layer or one outside the layers (embeddings, final norm, lm_head), as the loader maps
    names."""
    keep = {str(f) for n, f in weight_map.items()
            if layers is None or (i := layer_of(str(n))) is None or i < layers}
    return [s for s in dict.fromkeys(str(f) for f in weight_map.values()) if s in keep]


def _choose_files(repo_id: str, commit: str | None, sizes: dict[str, int | None],
                  layers: int | None) -> list[str]:
    """The files to fetch: config, the weights transformers would load (never pickles; with `layers`, only the
    shards those layers need), the tokenizer."""
    if CONFIG_FILE not in sizes:
        raise HubError(f"{repo_id} has no {CONFIG_FILE}")
    if INDEX_FILE in sizes:
        index = hub.fetch_index(repo_id, revision=commit)
        weight_map = index.get("weight_map") if isinstance(index, dict) else None
        if not isinstance(weight_map, dict) or not weight_map:
            raise WeightsError(f"{INDEX_FILE} of {repo_id} has no weight_map")
        shards = needed_shards(weight_map, layers)
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
                            f"{f' and {len(pickles) - 1} more' if len(pickles) > 1 else ''}), which tpviz "
                            f"never loads; convert them to safetensors, or {RANDOM_HINT}")
    if others:
        return WeightsError(f"{repo_id}{where} has no {WEIGHTS_FILE} or {INDEX_FILE} ({others[0]} is not in "
                            f"transformers' layout); {RANDOM_HINT}")
    return WeightsError(f"{repo_id}{where} has no safetensors weights; {RANDOM_HINT}")


def _check_disk(repo_id: str, cache_dir: str, need: int) -> None:
    """Refuse, before any byte is fetched, a download the cache's disk cannot hold."""
    folder = next((p for p in (Path(cache_dir), *Path(cache_dir).parents) if p.exists()), Path("."))
    try:
        free = shutil.disk_usage(folder).free
    except OSError:
        return  # cannot tell: the download itself will say
    if need > free:
        raise WeightsError(f"downloading {repo_id} needs {human_size(need)} but only "
                           f"{human_size(free)} is free in {cache_dir}; free some space or point "
                           f"HF_HUB_CACHE at a bigger disk, or {RANDOM_HINT}")


def _cached(repo_id: str, revision: str | None, cache_dir: str, reason: str, layers: int | None) -> Download:
    """The cached snapshot, without asking the hub; one line when its weights are not all there."""
    try:
        # only config.json is required here: the weights are checked below, with a clearer message
        folder = Path(snapshot_download(repo_id, revision=revision, cache_dir=cache_dir,
                                        local_files_only=True, allow_patterns=[CONFIG_FILE]))
    except LocalEntryNotFoundError:
        raise HubError(f"{repo_id} is not in the local Hugging Face cache and {reason}: "
                       f"connect to download it, or {RANDOM_HINT}") from None
    except Exception as exc:  # noqa: BLE001 - every library error becomes one line
        raise _error(exc, repo_id, revision, hub._endpoint(), cache_dir) from None
    got = _snapshot(repo_id, folder, f"{reason}: connect to download them, or {RANDOM_HINT}", layers)
    got.total_bytes, got.offline = sum(p.stat().st_size for p in folder.iterdir() if p.is_file()), reason
    return got


def _snapshot(repo_id: str, folder: Path, hint: str, layers: int | None) -> Download:
    """The snapshot folder as a Download (sizes filled in by the caller); one line unless it holds every file
    of a safetensors checkpoint that the first `layers` layers need."""
    try:
        names = [p.name for p in folder.iterdir()]
    except OSError as e:
        raise WeightsError(f"cannot read the cached snapshot of {repo_id} ({e.strerror or e})") from None
    got = Download(repo_id, folder, folder.name, 0)
    if INDEX_FILE in names:
        try:
            weight_map = json.loads((folder / INDEX_FILE).read_text())["weight_map"]
            shards, needed = needed_shards(weight_map, None), needed_shards(weight_map, layers)
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            raise WeightsError(f"the cached {INDEX_FILE} of {repo_id} is not a "
                               "valid safetensors index") from None
        missing = [s for s in needed if not (folder / s).is_file()]
        if missing:
            raise WeightsError(f"the cached snapshot of {repo_id} lacks {missing[0]}"
                               f"{f' and {len(missing) - 1} more shards' if len(missing) > 1 else ''}"
                               f"{f' (the first {layers} layers need it)' if layers else ''}; {hint}")
        got.shards, got.skipped = shards, [s for s in shards if not (folder / s).is_file()]
    elif WEIGHTS_FILE not in names:
        if any(n.lower().endswith(PICKLE_SUFFIXES) or n.endswith(".safetensors") for n in names):
            raise _no_safetensors(repo_id, names, "'s cached snapshot")
        raise WeightsError(f"the weights of {repo_id} are not in the local Hugging Face cache (only "
                           f"{', '.join(sorted(names)) or 'nothing'}) and {hint}")
    checkpoint_files(folder)  # the loader's own checks (links out of the cache, odd files): one line
    return got


def _error(exc: BaseException, repo_id: str, revision: str | None, endpoint: str,
           cache_dir: str) -> TpvizError:
    """One line for a failed listing or download: the hub's own mapping, or a disk / OS error."""
    if isinstance(exc, TpvizError):  # hub.py's own lines: its "pick a preset" hint does not apply here
        return type(exc)(str(exc).replace(hub.PICK_HINT, RANDOM_HINT))
    hub_errors = tuple(t for t in (getattr(hub, "HfHubHTTPError", None),
                                   getattr(hub, "HFValidationError", None),
                                   getattr(hub, "EntryNotFoundError", None)) if t is not None)
    if isinstance(exc, OSError) and not isinstance(exc, hub_errors) and exc.errno is not None:
        return WeightsError(f"downloading {repo_id} into {cache_dir} failed "
                            f"({exc.strerror or exc}); free some space or fix the folder's permissions "
                            f"(HF_HUB_CACHE picks another), or {RANDOM_HINT}")
    mapped = hub._map_error(exc, repo_id, "the checkpoint", revision, endpoint)
    text = str(mapped).replace(hub.PICK_HINT, RANDOM_HINT)
    return type(mapped)(text) if isinstance(mapped, SourceError) else HubError(text)


def shrink_note(download: Download, layers: int | None, total_layers: int) -> str | None:
    """What shrinking the model saved: the shard files never fetched, or why a large checkpoint is there
    whole."""
    d, read = download, f"only the first {layers} of {total_layers} layers are read"
    if d.skipped:
        size = "" if d.skipped_bytes is None else (
            f", {human_size(d.skipped_bytes)} of {human_size(d.total_bytes + d.skipped_bytes)}")
        return (f"{read}: {len(d.skipped)} of {len(d.shards)} shard files{size}, holding only later layers, "
                f"were not fetched")
    if layers is None or layers >= total_layers or d.total_bytes < LARGE_BYTES:
        return None
    whole = "a single file: nothing to skip" if not d.shards else f"all {len(d.shards)} shard files"
    return f"the whole checkpoint ({human_size(d.total_bytes)}, {whole}) is in the Hugging Face cache; {read}"

"""One request's map: a spec traced at tp under a rule set, served in a dtype, and checked against the
checkpoint's tensor list when one is at hand (a local folder's index or headers, a hub repo's index, or names
given)."""
from dataclasses import dataclass, replace
from pathlib import Path

from tpviz.config.hub import fetch_index, fetch_tensor_bytes
from tpviz.config.sources import REPO_ID, check_local_path, find_preset, looks_local
from tpviz.config.spec import ModelSpec
from tpviz.errors import ConfigError, SourceError
from tpviz.rules import Layout, RuleSet
from tpviz.trace.checkpoint import (INDEX_FILE, checkpoint_sentence, compare, local_tensor_bytes,
                                    local_tensor_names)
from tpviz.trace.shardmap import ShardMap
from tpviz.trace.tracer import trace


@dataclass(frozen=True)
class CheckpointNames:
    """A checkpoint's tensor list: its names, where they came from, and the stored bytes per tensor when
    known."""
    names: frozenset[str]
    source: str
    sizes: dict[str, int] | None = None


def local_folder(source) -> Path | None:
    """The checkpoint folder a local source names (a folder, or the folder of its config.json), else None."""
    if not isinstance(source, (str, Path)) or not (isinstance(source, Path)
                                                   or looks_local(str(source).strip())):
        return None
    path = check_local_path(str(source).strip())
    folder = path if path.is_dir() else path.parent
    return folder if (folder / INDEX_FILE).is_file() or (folder / "model.safetensors").is_file() else None


def local_checkpoint(source) -> CheckpointNames | None:
    """A local folder's tensor names (index or header) and, when its weight files are here, their stored
    bytes."""
    folder = local_folder(source)
    names = local_tensor_names(folder) if folder else None
    return CheckpointNames(frozenset(names), str(folder), local_tensor_bytes(folder)) if names else None


def hub_tensor_names(repo_id: str) -> set[str] | None:
    """A hub repo's tensor names from its safetensors index (cache first, online when reachable); None when
    the repo has no index or the hub cannot be reached (the map is still drawn, unchecked)."""
    try:
        index = fetch_index(repo_id)
    except SourceError:
        return None
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    return set(weight_map) if isinstance(weight_map, dict) else None


def is_hub_id(source) -> bool:
    """A source that names a hub repo (not a preset, not a local path)."""
    return (isinstance(source, str) and bool(REPO_ID.match(source.strip()))
            and not find_preset(source.strip()) and not looks_local(source.strip()))


def hub_checkpoint(source, sizes: bool = True) -> CheckpointNames | None:
    """A hub id's tensor names (its index) and, with sizes, its stored bytes when the hub answers."""
    if not is_hub_id(source):
        return None
    repo = source.strip()
    names = hub_tensor_names(repo)
    if not names:
        return None
    return CheckpointNames(frozenset(names), f"{repo} ({INDEX_FILE})",
                           fetch_tensor_bytes(repo) if sizes else None)


def checked(m: ShardMap, checkpoint: CheckpointNames | None) -> ShardMap:
    """Attach the comparison; an architecture tpviz does not know must verify, or it is refused."""
    if checkpoint is None or not checkpoint.names:
        return m
    m.checkpoint = compare(m, set(checkpoint.names), checkpoint.source, checkpoint.sizes)
    if not m.model.arch.known:
        if not m.checkpoint["verified"]:
            raise ConfigError(f"model_type {m.model.model_type!r} is not one tpviz knows and "
                              "its checkpoint does not match a Llama-like decoder "
                              f"({checkpoint_sentence(m.checkpoint)[:300]}); refusing to guess its layout")
        m.model = replace(m.model, notes=[n for n in m.model.notes if "not one tpviz knows" not in n] + [
            f"model_type {m.model.model_type!r} is not one tpviz knows; mapped as a "
            f"Llama-like decoder, and every tensor name was verified against {checkpoint.source}"])
    return m


def map_model(spec: ModelSpec, tp_size: int, rules: RuleSet | str = "vllm",
              checkpoint: CheckpointNames | None = None,
              dtype: str = "auto", kv_cache_dtype: str = "auto", layout: Layout | None = None) -> ShardMap:
    """The shard map of a spec at tp_size, served in dtype / kv_cache_dtype, checked against the
    checkpoint."""
    if (dtype, kv_cache_dtype) != ("auto", "auto"):
        spec = spec.served(dtype, kv_cache_dtype)
    return checked(trace(spec, tp_size, rules, layout), checkpoint)

"""tpviz: see and check how tensor parallelism splits an LLM's weights across GPUs."""
from tpviz.errors import ConfigError, HubError, SourceError, TPSizeError, TpvizError, WeightsError
from tpviz.trace.shardmap import ShardMap
from tpviz.config.sources import load_spec
from tpviz.config.spec import ModelSpec


def shard_map(config_or_source, tp_size: int, rules: str = "vllm", tensor_names: set[str] | None = None,
              checkpoint_source: str = "", dtype: str = "auto", kv_cache_dtype: str = "auto",
              tensor_bytes: dict[str, int] | None = None) -> ShardMap:
    """The shard map of a model (config dict, preset or hub id, path, bytes or ModelSpec) at tp_size.

    When a checkpoint's tensor names are at hand (given, or read from a local folder's safetensors
    index or header), the map is compared with them; an unknown architecture must match or is refused."""
    from tpviz.trace.checkpoint import checked, local_folder, local_tensor_bytes, local_tensor_names
    from tpviz.config.spec import KNOWN_TYPES
    from tpviz.trace.tracer import trace
    spec = load_spec(config_or_source)
    if (dtype, kv_cache_dtype) != ("auto", "auto"):
        spec = spec.served(dtype, kv_cache_dtype)
    sizes = tensor_bytes
    if tensor_names is None and (folder := local_folder(config_or_source)) is not None:
        tensor_names, checkpoint_source = local_tensor_names(folder), str(folder)
        sizes = local_tensor_bytes(folder)  # the headers' stored bytes, when the weight files are here
    m = trace(spec, tp_size, rules)
    return checked(m, tensor_names, checkpoint_source or "the checkpoint", spec.model_type in KNOWN_TYPES, sizes)


__all__ = ["shard_map", "load_spec", "ShardMap", "ModelSpec", "TpvizError", "TPSizeError", "ConfigError",
           "SourceError", "HubError", "WeightsError"]

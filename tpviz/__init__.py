"""tpviz: see and check how tensor parallelism splits an LLM's weights across GPUs."""
from tpviz.config.sources import load_spec
from tpviz.config.spec import ModelSpec
from tpviz.errors import ConfigError, HubError, SourceError, TPSizeError, TpvizError, WeightsError
from tpviz.trace.shardmap import ShardMap


def shard_map(config_or_source, tp_size: int, rules: str = "vllm", tensor_names: set[str] | None = None,
              checkpoint_source: str = "", dtype: str = "auto", kv_cache_dtype: str = "auto",
              tensor_bytes: dict[str, int] | None = None, layout=None) -> ShardMap:
    """The shard map of a model (config dict, preset or hub id, path, bytes or ModelSpec) at tp_size.

    When a checkpoint's tensor names are at hand (given, or read from a local folder's safetensors
    index or header), the map is compared with them; an unknown architecture must match or is refused. A
    layout (tpviz.rules.Layout) with SGLang's attention DP or EP cuts each weight over its group there."""
    # imported here for start-up: `import tpviz` stays light (no torch) until a map is asked for
    from tpviz.trace.model_map import CheckpointNames, local_checkpoint, map_model
    spec = load_spec(config_or_source)
    checkpoint = (local_checkpoint(config_or_source) if tensor_names is None else
                  CheckpointNames(frozenset(tensor_names),
                                  checkpoint_source or "the checkpoint", tensor_bytes))
    return map_model(spec, tp_size, rules, checkpoint, dtype, kv_cache_dtype, layout)


__all__ = ["shard_map", "load_spec", "ShardMap", "ModelSpec", "TpvizError", "TPSizeError", "ConfigError",
           "SourceError", "HubError", "WeightsError"]

"""tpviz: see and check how tensor parallelism splits an LLM's weights across GPUs."""
from tpviz.errors import ConfigError, HubError, SourceError, TPSizeError, TpvizError, WeightsError
from tpviz.shardmap import ShardMap
from tpviz.sources import load_spec
from tpviz.spec import ModelSpec


def shard_map(config_or_source, tp_size: int, rules: str = "vllm") -> ShardMap:
    """The shard map of a model (config dict, preset or hub id, path, bytes or ModelSpec) at tp_size."""
    from tpviz.tracer import trace
    return trace(load_spec(config_or_source), tp_size, rules)


__all__ = ["shard_map", "load_spec", "ShardMap", "ModelSpec", "TpvizError", "TPSizeError", "ConfigError",
           "SourceError", "HubError", "WeightsError"]

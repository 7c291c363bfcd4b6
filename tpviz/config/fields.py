"""Typed reads of config.json fields: each wrong type or implausible value is one line naming the key."""
from tpviz.errors import ConfigError, MissingFieldError

# plausibility limit on any one dim, far above any real model (hidden 18k, 126 layers): larger means a broken
# config, and it keeps the cost of a map bounded
MAX_DIM = 1 << 19


def pick(cfg: dict, *keys, default=None):
    """The first of these keys the config sets (not null), else default."""
    for key in keys:
        if cfg.get(key) is not None:
            return cfg[key]
    return default


def json_type(value) -> str:
    """How JSON names a value's type, for messages: 'null', 'a list', 'a string', 'a number', 'true/false'."""
    for kind, name in ((type(None), "null"), (bool, "true/false"), (dict, "an object"), (list, "a list"),
                       (str, "a string"), ((int, float), "a number")):
        if isinstance(value, kind):
            return name
    return type(value).__name__


def read_int(cfg: dict, *keys, default=None, minimum: int = 1, maximum: int = 0) -> int:
    """An integer in [minimum, maximum or MAX_DIM] from the first key the config sets; missing and no default:
    one line naming it."""
    value = pick(cfg, *keys, default=default)
    if value is None:
        also = f" (also looked for {', '.join(keys[1:])})" if len(keys) > 1 else ""
        raise MissingFieldError(f"config is missing {keys[0]}{also}", keys[0])
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"{keys[0]}={value!r} must be an integer >= {minimum}")
    if value > (maximum or MAX_DIM):
        raise ConfigError(f"{keys[0]}={value} is larger than {maximum or MAX_DIM}; "
                          "this does not look like a real model config")
    return value


def read_int_in(where: str, cfg: dict, *keys, default=None) -> int:
    """read_int of a nested object, its one line naming the object as config.json does
    ('vision_config: ...')."""
    try:
        return read_int(cfg, *keys, default=default)
    except ConfigError as e:
        raise type(e)(f"{where}: {e}") from None


def read_float(cfg: dict, key: str, default: float) -> float:
    """A number (default when absent or null)."""
    value = cfg.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{key}={value!r} must be a number")
    return float(value)


def full_rope(cfg: dict) -> dict:
    """rope_parameters, or its full-attention entry when they are given per layer type (OLMo-3, Gemma-3)."""
    rope = read_object(cfg, "rope_parameters")
    return read_object(rope, "full_attention") if isinstance(rope.get("full_attention"), dict) else rope


def read_object(cfg: dict, key: str) -> dict:
    """A nested config object ({} when absent), or one line when it is something else."""
    value = cfg.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConfigError(f"{key} must be a JSON object, got {json_type(value)}")
    return value


def read_bool(cfg: dict, key: str, default: bool) -> bool:
    """true or false (default when absent or null); 0 and 1 are refused, not guessed."""
    value = cfg.get(key, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise ConfigError(f"{key}={value!r} must be true or false")
    return value


def vision_int(cfg: dict, *keys, default=None) -> int:
    """read_int_in of vision_config: its one line names the key as the user finds it in config.json."""
    return read_int_in("vision_config", cfg, *keys, default=default)

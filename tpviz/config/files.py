"""config.json as bytes: size-checked, parsed as JSON only (nothing in it is ever executed), and a ModelOpt
hf_quant_config.json folded in as vLLM reads it."""
import json

from tpviz.config.fields import json_type
from tpviz.errors import ConfigError, NotJSONError, SourceError

MAX_CONFIG_BYTES = 1_000_000  # real config.json files are a few KB


def check_config_size(size: int, what: str = "config") -> None:
    """One line for a 'config' too big to be one (refused before it is read or parsed)."""
    if size > MAX_CONFIG_BYTES:
        raise SourceError(f"{what} is {size / 1e6:.1f} MB; a config.json is a few KB (limit 1 MB)")


def parse_config(data: bytes | str, what: str = "config") -> dict:
    """Parse config.json bytes, refusing oversize or non-JSON input with one line."""
    if isinstance(data, str):
        data = data.encode("utf-8", "surrogatepass")
    check_config_size(len(data), what)
    if isinstance(data, bytes):
        try:
            data = data.decode("utf-8-sig")
        except UnicodeDecodeError:
            raise NotJSONError(f"{what} is not UTF-8 text; give the model's config.json") from None
    try:
        cfg = json.loads(data)
    except json.JSONDecodeError as e:
        raise NotJSONError(f"{what} is not valid JSON: {e.msg} at line {e.lineno} column {e.colno}") from None
    except RecursionError:  # thousands of nested brackets: no config is built like that
        raise NotJSONError(f"{what} nests JSON too deeply to be a config.json") from None
    if not isinstance(cfg, dict):
        raise ConfigError(f"{what} must be a JSON object, got {json_type(cfg)}")
    return cfg


QUANT_FILE = "hf_quant_config.json"


def with_quant_file(cfg: dict, quant_file: dict) -> dict:
    """A config whose quantization lives in hf_quant_config.json ({"producer": ..., "quantization":
    {...}})."""
    q = quant_file.get("quantization", quant_file)
    if not isinstance(q, dict):
        raise ConfigError(f"{QUANT_FILE} has no 'quantization' object")
    return {**cfg, "quantization_config": {"quant_method": "modelopt", **q}}

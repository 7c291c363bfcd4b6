"""Configs as vLLM reads them: through transformers' config class for their model_type, built from the JSON
dict alone (never remote code), so its attribute maps (n_embd, n_embed -> hidden_size) and its defaults
(GPT-2's n_positions 1024, Mistral's sliding_window 4096) hold as they do for the engine. A model_type
transformers has no class for (ChatGLM, Llama-Nemotron's DeciLM, custom ones) is read as given, by tpviz's own
readers."""
import hashlib
import json
import logging
import os
import warnings
from contextlib import contextmanager
from functools import lru_cache
from importlib import metadata
from pathlib import Path

from tpviz.config.cache import cache_root

# what tpviz reads differently from the class, or the class drops: kept from the JSON as given
KEPT = ("quantization_config",)
# model_types vLLM 0.33 reads with another model_type's class (transformers_utils/config.py _CONFIG_REGISTRY)
READ_AS = {"deepseek_v32": "deepseek_v3"}
TOWERS = ("vision_config", "audio_config")  # sub-configs read with the class's defaults (config/tower.py)
# the model's own dimensions, under every name a config gives them: a class default for one (LlamaConfig's
# hidden_size 4096) would draw another model, so a config without them is refused, naming the field
DIMENSIONS = {"hidden_size": ("hidden_size", "n_embd", "n_embed", "d_model", "model_dim"),
              "num_attention_heads": ("num_attention_heads", "n_head", "num_heads", "n_heads"),
              "num_hidden_layers": ("num_hidden_layers", "n_layer", "num_layers"),
              "vocab_size": ("vocab_size", "padded_vocab_size", "n_vocab"),
              "intermediate_size": ("intermediate_size", "ffn_hidden_size", "n_inner"),
              "moe_intermediate_size": ("moe_intermediate_size",)}


@contextmanager
def quiet():
    """transformers' config classes log and warn about odd fields; the map says what matters, in its own
    notes."""
    logger = logging.getLogger("transformers")
    level, logger.level = logger.level, logging.ERROR
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        logger.level = level


def config_class(model_type: object):
    """transformers' config class for a model_type, or None when it has none."""
    if not isinstance(model_type, str):
        return None
    # start-up: transformers (and the torch it imports) loads only when a config is read, not on `import
    # tpviz`
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING, CONFIG_MAPPING_NAMES
    model_type = READ_AS.get(model_type, model_type)
    return CONFIG_MAPPING[model_type] if model_type in CONFIG_MAPPING_NAMES else None


def as_dict(config) -> dict:
    """A config object as the dict tpviz reads: every attribute (defaults included) and, beside the class's
    own names, the common names its attribute_map gives them (hidden_size for n_embd); sub-configs alike."""
    out = config.to_dict()
    for alias in getattr(config, "attribute_map", {}):
        value = getattr(config, alias, None)
        if alias not in out and value is not None:
            out[alias] = value
    for key, value in vars(config).items():
        if hasattr(value, "to_dict") and hasattr(value, "attribute_map"):  # text_config, vision_config
            out[key] = as_dict(value)
    return out


def through_transformers(cfg: dict) -> tuple[dict, str | None]:
    """(the config as transformers' class reads it, None), or (the config as given, why the class refused it);
    as given, too, when transformers has no class for its model_type."""
    try:
        text = json.dumps(cfg, sort_keys=True)
    except (TypeError, ValueError):  # not JSON data (a dict built in Python): read as given
        return cfg, None
    read, refusal = _read(text)
    return (dict(read) if refusal is None else cfg), refusal


@lru_cache(maxsize=256)  # the app reads the same config on every rerun
def _read(text: str) -> tuple[dict, str | None]:
    """The class's reading, kept on disk: importing transformers' config classes costs seconds (its package
    and the modules they pull in), reading a stored JSON file a millisecond. Keyed by the config, the
    transformers version and this file, so a new release or a change here reads afresh."""
    path = _stored(text)
    try:
        stored = json.loads(path.read_text())
        return stored["read"], stored["refusal"]
    except (OSError, ValueError, KeyError, TypeError):  # none yet, or unreadable: read it again
        pass
    read, refusal = _read_with_class(text)
    try:  # what is stored is what is handed out, now and later (JSON turns id2label's int keys to str)
        record = json.dumps({"read": read, "refusal": refusal})
    except (TypeError, ValueError):  # a value JSON cannot hold: not kept
        return read, refusal
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(record)
        os.replace(tmp, path)
    except OSError:  # a read-only home: read, not kept
        pass
    return json.loads(record)["read"], refusal


def _stored(text: str) -> Path:
    try:
        version = metadata.version("transformers")
    except metadata.PackageNotFoundError:
        version = "none"
    key = hashlib.sha256("\0".join((text, version, _SOURCE)).encode()).hexdigest()
    return cache_root() / "configs" / f"{key[:32]}.json"


_SOURCE = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()


def _read_with_class(text: str) -> tuple[dict, str | None]:
    cfg = json.loads(text)
    cls = config_class(cfg.get("model_type"))
    if cls is None:
        return cfg, None
    try:
        with quiet():
            read = merged(cfg, as_dict(cls(**cfg)))
            # a class read in another's stead keeps the config's own model_type
            return ({**read, "model_type": cfg["model_type"]} if cfg["model_type"] in READ_AS else read), None
    except Exception as e:  # noqa: BLE001 - any refusal of the class is the config's, said in one line below
        words = " ".join(line.strip() for line in str(e).splitlines() if line.strip()) or type(e).__name__
        # vLLM may read it with a laxer subclass of its own (DeepSeek-OCR's null kv_lora_rank)
        return cfg, f"transformers' {cls.__name__} refuses it ({words[:300]}); its keys are read as given"


def merged(given: dict, read: dict, nested: bool = False) -> dict:
    """The class's reading over the config as given, sub-configs alike: what the class turns into properties
    or moves elsewhere (Nemotron-H's hybrid_override_pattern, Gemma-4's global head sizes) stays as given. A
    dimension the config does not give is left out rather than taken from the class's defaults, but in a
    wrapper's text_config: vLLM builds that decoder from the wrapper class's reading, defaults and all
    (LLaVA-1.5's and Qwen2-Audio's leave their sizes to LlamaConfig's and Qwen2Config's), which
    class_defaults names."""
    out = {**given, **read, **{k: given[k] for k in KEPT if k in given}}
    for names in DIMENSIONS.values():
        if not nested and not any(given.get(n) is not None for n in names):
            for n in names:
                out.pop(n, None)
    for key, value in read.items():
        if key in TOWERS and isinstance(value, dict) and isinstance(given.get(key), dict):
            out[key] = {**given[key], **value}  # vLLM builds a tower from the class's defaults too
        elif isinstance(value, dict) and isinstance(given.get(key), dict) and key.endswith("_config"):
            out[key] = merged(given[key], value, nested=key == "text_config")
    return out


def class_defaults(given: dict, read: dict) -> dict:
    """The text decoder's dimensions a wrapper's text_config leaves to its class: {name: default}."""
    g, r = given.get("text_config"), read.get("text_config")
    if not isinstance(r, dict) or g is r:
        return {}
    g = g if isinstance(g, dict) else {}  # none given (null): the class's whole default decoder
    sizes = [*DIMENSIONS.values(), ("num_key_value_heads",), ("head_dim",)]  # these two shape weights too
    taken = {names[0]: r.get(names[0]) for names in sizes
             if not any(g.get(n) is not None for n in names) and r.get(names[0]) is not None}
    heads, hidden = r.get("num_attention_heads"), r.get("hidden_size")
    # what any reader derives is no class default: as many KV heads as heads, hidden / heads a head
    if taken.get("num_key_value_heads") == heads:
        taken.pop("num_key_value_heads")
    if isinstance(heads, int) and heads and isinstance(hidden, int) and \
            taken.get("head_dim") == hidden // heads:
        taken.pop("head_dim")
    return taken


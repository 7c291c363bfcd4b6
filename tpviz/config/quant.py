"""Read a checkpoint's quantization_config into one Quant: the scheme, its block or group size, and the
modules it leaves unquantized. Every malformed field is one ConfigError naming it."""
import fnmatch
import re
from dataclasses import dataclass, field
from functools import lru_cache

from tpviz.errors import ConfigError

# bytes per stored element of each scheme's weight (packed formats count a fraction of a byte per value)
SCHEMES = {
    "fp8_block": "FP8 with block scales",
    "fp8_channel": "FP8 with per-channel scales",
    "fp8_tensor": "FP8 with per-tensor scales",
    "mxfp4": "MXFP4 (4-bit, a shared scale per 32 values)",
    "nvfp4": "NVFP4 (4-bit, an FP8 scale per 16 values)",
    "int4_group": "INT4 weights with group scales",
    "int8_group": "INT8 weights with group scales",
}


@dataclass(frozen=True)
class Quant:
    """How the linear and MoE weights of a checkpoint are stored."""
    method: str  # the config's quant_method: fp8, mxfp4, modelopt, compressed-tensors, gptq, awq
    scheme: str  # one of SCHEMES
    block: tuple[int, int] | None = None  # FP8 weight_block_size (block_n, block_k)
    group: int = 0  # values per scale along the input dim (INT4/8, NVFP4, MXFP4); -1: per channel
    bits: int = 8
    desc_act: bool = False  # GPTQ act-order: the input dim is permuted (g_idx)
    packing: str = ""  # how packed values are laid out: gptq ([K/8, N]), awq ([K, N/8]), ct ([N, K/8])
    ignore: tuple[str, ...] = field(default_factory=tuple)  # modules kept at the model dtype (patterns)
    kv_cache: str = ""  # the checkpoint's KV-cache quantization (FP8), if it names one

    @property
    def label(self) -> str:
        extra = f" {self.block[0]}×{self.block[1]}" if self.block else (f", group {self.group}"
                                                                        if self.group > 0 else "")
        return f"{SCHEMES[self.scheme]}{extra} ({self.method})"

    def quantizes(self, module: str) -> bool:
        """Whether a module (checkpoint name without .weight, layer index as a number) is stored quantized."""
        return _kept(module, self.ignore)

    def to_dict(self) -> dict:
        return {"method": self.method, "scheme": self.scheme,
                "block": list(self.block) if self.block else None,
                "group": self.group, "bits": self.bits, "desc_act": self.desc_act, "label": self.label,
                "ignore": list(self.ignore), "packing": self.packing, "kv_cache": self.kv_cache}


@lru_cache(maxsize=1 << 16)  # a map asks once per layer group and module: thousands of times for Kimi-K2.5
def _kept(module: str, ignore: tuple[str, ...]) -> bool:
    return not any(_matches(module, pattern) for pattern in ignore)


def _matches(module: str, pattern: str) -> bool:
    """vLLM's rules: a 're:' prefix is a regex (compressed-tensors), '*' a wildcard (modelopt, mxfp4), else a
    name that matches the module or one of its parents / a substring of it (fp8's ignored_layers, awq)."""
    if pattern.startswith("re:"):
        return re.match(pattern[3:], module) is not None
    if "*" in pattern or "?" in pattern:
        return fnmatch.fnmatch(module, pattern) or fnmatch.fnmatch(module, pattern + ".*")
    return module == pattern or module.startswith(pattern + ".") or f".{pattern}." in f".{module}."


def _positive(q: dict, key: str, default=None, allowed: tuple = ()) -> int:
    value = q.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < -1 or value == 0:
        raise ConfigError(f"quantization_config.{key}={value!r} must be a positive integer")
    if allowed and value not in allowed:
        raise ConfigError(f"quantization_config.{key}={value!r} must be one of "
                          f"{', '.join(map(str, allowed))}")
    return value


def _patterns(q: dict, *keys: str) -> tuple[str, ...]:
    out = []
    for key in keys:
        value = q.get(key)
        if value is None:
            continue
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ConfigError(f"quantization_config.{key} must be a list of module names")
        out += [v.strip() for v in value]
    return tuple(out)


def _fp8(q: dict) -> Quant:
    block = q.get("weight_block_size")
    ignore = _patterns(q, "ignored_layers", "modules_to_not_convert")
    if block is None:
        return Quant("fp8", "fp8_tensor", ignore=ignore)
    if (not isinstance(block, list) or len(block) != 2
            or not all(isinstance(b, int) and not isinstance(b, bool) and b > 0 for b in block)):
        raise ConfigError(f"quantization_config.weight_block_size={block!r} must be two positive integers")
    return Quant("fp8", "fp8_block", block=(block[0], block[1]), ignore=ignore)


def _modelopt(q: dict) -> Quant:
    algo = str(q.get("quant_algo", "")).upper()
    ignore = _patterns(q, "exclude_modules", "ignore")
    kv = str(q.get("kv_cache_quant_algo") or "")
    if algo == "FP8":
        return Quant("modelopt", "fp8_tensor", ignore=ignore, kv_cache=kv)
    if algo == "NVFP4":
        return Quant("modelopt", "nvfp4", group=_positive(q, "group_size", 16, (16,)), bits=4, ignore=ignore,
                     kv_cache=kv)
    raise ConfigError(f"quantization_config.quant_algo={q.get('quant_algo')!r}: tpviz reads "
                      "ModelOpt FP8 and NVFP4")


# keys vLLM's from_config reads with get_from_keys, which raises when none of a tuple is present
# (auto_gptq.py, auto_awq.py in 0.33; the same in 0.28)
REQUIRED = {"gptq": (("bits",), ("group_size",), ("desc_act",), ("sym",)),
            "awq": (("w_bit", "bits"), ("q_group_size", "group_size"), ("zero_point",))}


def _gptq_awq(q: dict, method: str) -> Quant:
    for keys in REQUIRED[method]:
        if not any(k in q for k in keys):
            raise ConfigError(f"quantization_config lacks {' or '.join(keys)}, which vLLM's "
                              f"{method.upper()} config requires (it refuses to load without it)")
    bits = _positive(q, "bits", q.get("w_bit", 4), (4, 8))
    group = q.get("group_size", q.get("q_group_size", 128))
    if isinstance(group, bool) or not isinstance(group, int) or group == 0 or group < -1:
        raise ConfigError(f"quantization_config.group_size={group!r} must be a positive integer or -1")
    return Quant(method, f"int{bits}_group", group=group, bits=bits, desc_act=bool(q.get("desc_act", False)),
                 packing=method, ignore=_patterns(q, "modules_to_not_convert"))


def _compressed(q: dict) -> Quant:
    """compressed-tensors: one config group for the Linear targets (FP8 dynamic, or pack-quantized W4A16)."""
    groups = q.get("config_groups")
    parts = [q, *(g for g in groups.values() if isinstance(g, dict))] if isinstance(groups, dict) else [q]
    sparsity = q.get("sparsity_config")
    if (isinstance(sparsity, dict) and sparsity.get("targets")
        or any("sparse" in str(x.get("format")) for x in parts)):
        raise ConfigError("this compressed-tensors checkpoint is sparse (2:4 or bitmask), which "
                          "vLLM 0.33 no longer loads (\"Sparsity support has been removed from "
                          "compressed-tensors\")")
    if not isinstance(groups, dict) or not groups:
        raise ConfigError("quantization_config.config_groups must name at least one quantization scheme")
    first = next(iter(groups.values()))
    weights = first.get("weights") if isinstance(first, dict) else None
    if not isinstance(weights, dict):
        raise ConfigError("quantization_config.config_groups needs a 'weights' scheme")
    ignore = _patterns(q, "ignore")
    bits, kind = weights.get("num_bits"), weights.get("type", "int")
    strategy = weights.get("strategy", "tensor")
    if kind == "float" and bits == 8:
        scheme = {"tensor": "fp8_tensor", "channel": "fp8_channel", "block": "fp8_block"}.get(strategy)
        if scheme is None:
            raise ConfigError(f"quantization_config weights.strategy={strategy!r} is not "
                              "one tpviz reads for FP8")
        block = weights.get("block_structure") if scheme == "fp8_block" else None
        return Quant("compressed-tensors", scheme, block=tuple(block) if block else None, ignore=ignore)
    if kind == "int" and bits in (4, 8):
        group = weights.get("group_size") if strategy == "group" else -1
        if isinstance(group, bool) or not isinstance(group, int) or group == 0 or group < -1:
            raise ConfigError(f"quantization_config weights.group_size={group!r} must be a positive integer")
        return Quant("compressed-tensors", f"int{bits}_group", group=group, bits=bits,
                     packing="ct", ignore=ignore)
    raise ConfigError(f"quantization_config weights num_bits={bits!r} type={kind!r}: tpviz "
                      "reads FP8 and INT4/INT8")


READERS = {"fp8": _fp8, "modelopt": _modelopt, "modelopt_fp4": _modelopt, "compressed-tensors": _compressed,
           "gptq": lambda q: _gptq_awq(q, "gptq"), "awq": lambda q: _gptq_awq(q, "awq"),
           "mxfp4": lambda q: Quant("mxfp4", "mxfp4", group=32, bits=4,
                                    ignore=_patterns(q, "modules_to_not_convert"))}


def read_quant(q: dict | None) -> tuple[Quant | None, str]:
    """(the Quant, a note) for a quantization_config; a method tpviz does not read is refused in one line."""
    if not q:
        return None, ""
    if not isinstance(q, dict):
        raise ConfigError(f"quantization_config must be a JSON object, got {type(q).__name__}")
    method = str(q.get("quant_method") or ("modelopt" if "quant_algo" in q else "")).lower()
    if not method and "group_size" in q and "bits" in q:  # mlx_lm writes no quant_method
        raise ConfigError(f"this is an MLX checkpoint ({q.get('bits')}-bit, group {q.get('group_size')}, "
                          "no quant_method): vLLM 0.33 reads it as unquantized and cannot load its packed "
                          "weights and .scales/.biases; serve the original or an FP8/GPTQ/AWQ checkpoint")
    if method not in READERS:  # drawn at the model dtype, its stored tensors and memory would be wrong
        what = f"quant_method {method!r}" if method else "a quantization_config without a quant_method"
        raise ConfigError(f"the checkpoint has {what}, which tpviz does not model yet (it reads FP8, "
                          "MXFP4, NVFP4, GPTQ, AWQ and compressed-tensors)")
    return READERS[method](q), ""


def served_quant(outer: dict, cfg: dict, arch, model_type: str,
                 experts: int) -> tuple[Quant | None, str, str]:
    """(the Quant, its quant_method, a note) of a checkpoint as vLLM 0.33 reads it for this architecture (its
    registry record); one line for a storage tpviz does not trace."""
    # mlx_lm's older exports keep their quantization under "quantization" alone, which vLLM never reads
    mlx = outer.get("quantization")
    mlx = mlx if isinstance(mlx, dict) and {"group_size", "bits"} <= set(mlx) else None
    q, note = read_quant(outer.get("quantization_config") or cfg.get("quantization_config") or mlx)
    if q is None:
        return None, "", note
    method = q.method
    if q.scheme == "mxfp4" and not arch.mxfp4:
        return None, method, "MXFP4 is read for gpt-oss only (as vLLM does); mapped as if unquantized"
    if arch.experts == "halves":  # their scales' stacked layout is not traced
        raise ConfigError(f"{q.label} on {model_type}'s stacked experts (input_linear, output_linear) is not "
                          "modelled yet; the unquantized checkpoint maps")
    # nor these (gate_up_proj_scale_inv); a dense model of the family (Gemma-4-31B) has none
    if arch.experts in ("transposed", "fused") and experts:
        raise ConfigError(f"{q.label} on {model_type}'s fused experts (experts.gate_up_proj, "
                          "experts.down_proj) is not modelled yet; the unquantized checkpoint maps")
    if "altup_laurel" in arch.extra:  # its AltUp / LAuReL tables' storage is not traced
        raise ConfigError(f"{q.label} on {model_type} is not modelled yet (nor its AltUp and LAuReL "
                          "tables' storage); the bf16 checkpoint maps")
    # packed INT4/INT8 in a table every GPU holds whole is not traced (MiniCPM3's latents, Step3's qkv_proj)
    if q.packing and (arch.mla_as_attention or arch.low_rank_q):
        raise ConfigError(f"{q.label} on {model_type}'s replicated attention tables is not modelled yet; the "
                          "unquantized or FP8 checkpoint maps")
    return q, method, note

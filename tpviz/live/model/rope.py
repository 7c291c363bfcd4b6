"""RoPE as the config says: the rope_scaling / rope_parameters types transformers 5 computes for Llama-style
models (default, linear, dynamic NTK, llama3, YaRN, LongRoPE) and partial_rotary_factor.

`rope_parameters(raw, head_dim, theta)` reads and checks the config once (a plain dict, kept in LiveConfig);
`frequencies(p, head_dim, seq_len)` gives the inverse frequencies over the rotated dims and the cos/sin
multiplier ("attention factor") for a forward pass over seq_len positions, with transformers' formulas.
"""
import math

import torch

from tpviz.live.errors import LiveError

ROPE_TYPES = ("default", "linear", "dynamic", "llama3", "yarn", "longrope")
BY_LENGTH = ("dynamic", "longrope")  # their frequencies depend on the sequence length of the forward pass


def _number(rope: dict, key: str, kind: str, default=None, integer: bool = False):
    """rope[key] (default when absent or null) as a positive finite number, else one LiveError line."""
    v = default if rope.get(key) is None else rope[key]
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0
    if not ok or (integer and v != int(v)):
        raise LiveError(f"rope {kind!r}: {key}={v!r} must be a positive {'integer' if integer else 'number'}")
    return int(v) if integer else float(v)


def rope_parameters(raw: dict, head_dim: int, theta: float) -> dict:
    """The config's RoPE as one flat dict: rope_type, rope_theta, rotary_dim and the type's numbers, resolved
    as transformers 5 does (rope_scaling over rope_parameters, a top-level original_max_position_embeddings
    over the dict's, max_position_embeddings as the default); a one-line LiveError for anything it cannot run
    faithfully."""
    rope = raw.get("rope_scaling") or raw.get("rope_parameters") or {}
    if not isinstance(rope, dict):
        raise LiveError(f"rope_scaling={rope!r} must be an object with a rope_type")
    kind = rope.get("rope_type", rope.get("type")) or "default"
    if kind not in ROPE_TYPES:
        raise LiveError(f"rope type {kind!r} is not supported by the live check; it runs "
                        f"{', '.join(ROPE_TYPES)}")
    if any(isinstance(v, dict) for v in rope.values()):
        raise LiveError("per-layer rope parameters "
                        f"({', '.join(k for k, v in rope.items() if isinstance(v, dict))}) are not "
                        "supported by the live check")
    factor = _number({**raw, **rope}, "partial_rotary_factor", kind, 1.0)
    rotary_dim = int(head_dim * factor)
    if factor > 1 or rotary_dim < 2 or rotary_dim % 2:
        raise LiveError(f"partial_rotary_factor={factor} gives {rotary_dim} rotated dims of "
                        f"head_dim {head_dim}; they must be even and between 2 and head_dim")
    p = {"rope_type": kind, "rope_theta": _number(rope, "rope_theta", kind, theta), "rotary_dim": rotary_dim}
    mpe = raw.get("max_position_embeddings")
    if kind in ("llama3", "yarn", "longrope"):
        orig = raw["original_max_position_embeddings"] if "original_max_position_embeddings" in raw else \
            rope.get("original_max_position_embeddings", mpe)
        p["original_max_position_embeddings"] = _number({"original_max_position_embeddings": orig},
                                                        "original_max_position_embeddings", kind,
                                                        integer=True)
    if kind in ("linear", "dynamic", "llama3"):
        p["factor"] = _number(rope, "factor", kind)
    if kind == "dynamic" or (kind in ("yarn", "longrope") and rope.get("factor") is None):
        p["max_position_embeddings"] = _number(raw, "max_position_embeddings", kind, integer=True)
    if kind == "dynamic" and rotary_dim <= 2:
        raise LiveError(f"rope 'dynamic' needs more than 2 rotated dims, not {rotary_dim}")
    if kind == "llama3":
        p.update({k: _number(rope, k, kind) for k in ("low_freq_factor", "high_freq_factor")})
        if p["high_freq_factor"] <= p["low_freq_factor"]:
            raise LiveError(f"rope 'llama3': high_freq_factor={p['high_freq_factor']} must exceed "
                            f"low_freq_factor={p['low_freq_factor']}")
    if kind in ("yarn", "longrope"):
        p["factor"] = (_number(rope, "factor", kind) if rope.get("factor") is not None
                       else p["max_position_embeddings"] / p["original_max_position_embeddings"])
        if rope.get("attention_factor") is not None:
            p["attention_factor"] = _number(rope, "attention_factor", kind)
    if kind == "yarn":
        for key, default in (("beta_fast", 32.0), ("beta_slow", 1.0)):  # transformers: `or default`, so 0 too
            p[key] = _number(rope, key, kind) if rope.get(key) else default
        for key in ("mscale", "mscale_all_dim"):  # used only when both are set (and not 0)
            if rope.get(key):
                p[key] = _number(rope, key, kind)
        if p["rope_theta"] <= 1:
            raise LiveError(f"rope 'yarn': rope_theta={p['rope_theta']} must exceed 1")
        truncate = rope.get("truncate", True)
        if not isinstance(truncate, bool):
            raise LiveError(f"rope 'yarn': truncate={truncate!r} must be true or false")
        p["truncate"] = truncate
    if kind == "longrope":
        for key in ("short_factor", "long_factor"):
            v = rope.get(key)
            if not (isinstance(v, list) and len(v) == rotary_dim // 2
                    and all(isinstance(x, (int, float)) and not isinstance(x, bool)
                            and math.isfinite(x) and x > 0 for x in v)):
                raise LiveError(f"rope 'longrope': {key} must be a list of "
                                f"{rotary_dim // 2} positive numbers")
            p[key] = [float(x) for x in v]
    return p


def _powers(theta, dim: int) -> torch.Tensor:
    """theta^(2i/dim) for i < dim/2, in float32 on the CPU, as transformers computes it."""
    return theta ** (torch.arange(0, dim, 2, dtype=torch.int64, device="cpu").float() / dim)


def _base_inv_freq(theta, dim: int) -> torch.Tensor:
    return 1.0 / _powers(theta, dim)


def _mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def frequencies(p: dict, head_dim: int, seq_len: int | None = None) -> tuple[torch.Tensor, float]:
    """(inv_freq [rotary_dim/2] float32 on the CPU, cos/sin multiplier) for a pass over seq_len positions
    (None: as built, before any forward pass). An empty p is plain RoPE over head_dim with theta 10000."""
    kind, theta = p.get("rope_type", "default"), p.get("rope_theta", 10000.0)
    dim = p.get("rotary_dim", head_dim)
    if kind == "default":
        return _base_inv_freq(theta, dim), 1.0
    if kind == "linear":
        return _base_inv_freq(theta, dim) / p["factor"], 1.0
    if kind == "dynamic":  # NTK: a larger base once the sequence outgrows max_position_embeddings
        mpe, factor = p["max_position_embeddings"], p["factor"]
        # transformers: as built in Python floats; recomputed in float32 tensors for a longer pass
        n = torch.tensor(seq_len, device="cpu") if seq_len and seq_len > mpe else mpe
        return _base_inv_freq(theta * ((factor * n / mpe) - (factor - 1)) ** (dim / (dim - 2)), dim), 1.0
    factor, orig = p["factor"], p["original_max_position_embeddings"]
    if kind == "llama3":  # long wavelengths divided by factor, short kept, a smooth blend between
        low, high = p["low_freq_factor"], p["high_freq_factor"]
        inv_freq = _base_inv_freq(theta, dim)
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > orig / low, inv_freq / factor, inv_freq)
        smooth = (orig / wavelen - low) / (high - low)
        medium = (wavelen >= orig / high) & (wavelen <= orig / low)
        return torch.where(medium, (1 - smooth) * scaled / factor + smooth * scaled, scaled), 1.0
    if kind == "longrope":  # per-frequency factors: short within the original context, long beyond it
        ext = p["long_factor"] if seq_len and seq_len > orig else p["short_factor"]
        scale = p.get("attention_factor")
        if scale is None:
            scale = 1.0 if factor <= 1 else math.sqrt(1 + math.log(factor) / math.log(orig))
        return 1.0 / (torch.tensor(ext, dtype=torch.float32, device="cpu") * _powers(theta, dim)), scale
    # yarn: interpolate (divide by factor) low frequencies, extrapolate high ones, a linear ramp between
    scale = p.get("attention_factor")
    if scale is None:
        ms, ms_all = p.get("mscale"), p.get("mscale_all_dim")
        scale = _mscale(factor, ms) / _mscale(factor, ms_all) if ms and ms_all else _mscale(factor)

    def correction_dim(rotations: float) -> float:
        return dim * math.log(orig / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = correction_dim(p["beta_fast"]), correction_dim(p["beta_slow"])
    if p["truncate"]:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    ramp = ((torch.arange(dim // 2, dtype=torch.float32, device="cpu") - low)
            / (high - low if high != low else 0.001)
            ).clamp(0, 1)
    extrapolate = 1 - ramp
    powers = _powers(theta, dim)
    return 1.0 / (factor * powers) * (1 - extrapolate) + 1.0 / powers * extrapolate, float(scale)

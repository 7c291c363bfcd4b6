"""Memory in the run's dtype and in the checkpoint's own: a rank holding half of a bfloat16 checkpoint holds as
many bytes as the whole checkpoint once the run upcasts it to float32, so both are reported. Also dtype 'auto'."""
import json
import struct
from pathlib import Path

from tpviz.live.errors import LiveError
from tpviz.live.weights import checkpoint_files

RUN_DTYPES = ("float32", "bfloat16", "float16")  # what the live model computes in
DTYPE_CHOICES = ("auto", *RUN_DTYPES)  # auto: the checkpoint's own
STORED = {"F32": "float32", "BF16": "bfloat16", "F16": "float16", "F64": "float64"}  # safetensors' float names
ITEMSIZE = {"float32": 4, "bfloat16": 2, "float16": 2, "float64": 8}


def _header(path: Path) -> dict:
    """A safetensors file's JSON header (8-byte little-endian length, then JSON): no tensor data is read."""
    try:
        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            return json.loads(f.read(min(n, 100 * 2**20)))
    except (OSError, struct.error, ValueError) as e:
        raise LiveError(f"{path.name} is not a readable safetensors file ({type(e).__name__})") from None


def checkpoint_dtype(folder: str | Path) -> str:
    """The float dtype holding most of the checkpoint's bytes ('' when it has no float tensors)."""
    totals: dict[str, int] = {}
    for path in checkpoint_files(Path(folder)):
        for name, info in _header(path).items():
            if name != "__metadata__" and isinstance(info, dict) and info.get("dtype") in STORED:
                start, end = info.get("data_offsets", (0, 0))
                totals[info["dtype"]] = totals.get(info["dtype"], 0) + end - start
    return STORED[max(totals, key=totals.get)] if totals else ""


def run_dtype(asked: str, stored: str) -> tuple[str, str | None]:
    """(dtype the run computes in, a note) for the asked dtype; 'auto' is the checkpoint's stored dtype."""
    if asked not in DTYPE_CHOICES:
        raise LiveError(f"dtype {asked!r} must be one of: {', '.join(DTYPE_CHOICES)}")
    if asked != "auto":
        return asked, None
    if stored in RUN_DTYPES:
        return stored, f"dtype auto: {stored}, the dtype the checkpoint's weights are stored in"
    return "float32", f"dtype auto: float32 (the checkpoint stores {stored or 'no float tensors'})"


def stored_bytes(numel: int, stored: str) -> int:
    """What `numel` parameters take in the checkpoint's dtype (0 when unknown)."""
    return numel * ITEMSIZE.get(stored, 0)

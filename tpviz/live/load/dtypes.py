"""The dtypes of a live run: the one its checkpoint stores most bytes in, the one it computes in ('auto': the
checkpoint's own), and the bytes parameters take in the stored one."""
from pathlib import Path

from tpviz.live.errors import LiveError
from tpviz.live.load.weights import checkpoint_files
from tpviz.trace.checkpoint import read_header

RUN_DTYPES = ("float32", "bfloat16", "float16")  # what the live model computes in
DTYPE_CHOICES = ("auto", *RUN_DTYPES)  # auto: the checkpoint's own
# safetensors' float names
STORED = {"F32": "float32", "BF16": "bfloat16", "F16": "float16", "F64": "float64"}
ITEMSIZE = {"float32": 4, "bfloat16": 2, "float16": 2, "float64": 8}


def checkpoint_dtype(folder: str | Path) -> str:
    """The float dtype holding most of the checkpoint's bytes ('' when it has no float tensors)."""
    totals: dict[str, int] = {}
    for path in checkpoint_files(Path(folder)):
        for info in read_header(path).values():
            if isinstance(info, dict) and info.get("dtype") in STORED:
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

"""Wall time and peak-memory growth of one call, for the cost bound (Linux: peak RSS reset via clear_refs)."""
import time
from pathlib import Path


def _hwm_kib() -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        pass
    return None


def reset_peak() -> bool:
    """Reset this process's peak RSS to its current RSS; False where the kernel does not allow it."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def measure(fn) -> tuple[float, float | None, object]:
    """(seconds, MiB of peak RSS above the RSS at the start or None, fn's result or the ValueError raised)."""
    can = reset_peak()
    before = _hwm_kib()
    start = time.perf_counter()
    try:
        out = fn()
    except ValueError as e:
        out = e
    took = time.perf_counter() - start
    after = _hwm_kib()
    grew = (after - before) / 1024 if can and before is not None and after is not None else None
    return took, grew, out

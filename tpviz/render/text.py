"""Text formatting shared by the views: one formatter per quantity."""


def fmt_bytes(n: float) -> str:
    """Human-readable bytes (GiB, MiB, KiB)."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{int(n)} B"

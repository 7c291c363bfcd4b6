"""Processes by /proc: which spawned ranks a process has, and which of some pids still live."""
from pathlib import Path


def _stat(pid: int | str) -> list[str] | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


def spawned_by(pid: int) -> list[int]:
    """Living spawn children of `pid` (ranks; not the resource tracker, not zombies)."""
    out = []
    for proc in Path("/proc").glob("[0-9]*"):
        fields = _stat(proc.name)
        try:
            cmdline = (proc / "cmdline").read_bytes()
        except OSError:
            continue
        if fields and int(fields[1]) == pid and fields[0] != "Z" and b"spawn_main" in cmdline:
            out.append(int(proc.name))
    return out


def alive(pids: list[int]) -> list[int]:
    """The pids that still run (a zombie has exited)."""
    return [pid for pid in pids if (fields := _stat(pid)) and fields[0] != "Z"]

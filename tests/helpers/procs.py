"""Processes by /proc: which spawned ranks a process has, and which of some pids still live."""
from pathlib import Path


def _stat(pid: int | str) -> list[str] | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


def _children(pid: int) -> list[tuple[int, bytes]]:
    """(pid, cmdline) of the living children of `pid`, zombies left out."""
    out = []
    for proc in Path("/proc").glob("[0-9]*"):
        fields = _stat(proc.name)
        try:
            cmdline = (proc / "cmdline").read_bytes()
        except OSError:
            continue
        if fields and int(fields[1]) == pid and fields[0] != "Z":
            out.append((int(proc.name), cmdline))
    return out


def spawned_by(pid: int) -> list[int]:
    """Living ranks of `pid`: its spawn children, or the children of its forkserver (the resource tracker and
    the forkserver itself are not ranks, nor are zombies)."""
    out = []
    for child, cmdline in _children(pid):
        if b"spawn_main" in cmdline:
            out.append(child)
        elif b"forkserver" in cmdline:
            out += [rank for rank, _ in _children(child)]
    return sorted(out)


def alive(pids: list[int]) -> list[int]:
    """The pids that still run (a zombie has exited)."""
    return [pid for pid in pids if (fields := _stat(pid)) and fields[0] != "Z"]

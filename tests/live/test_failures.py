"""A rank that raises or hangs stops the whole group with a one-line error naming it, and leaves no process."""
import os
import time
from pathlib import Path

import pytest

from tpviz.live import RankFailure, verify
from tpviz.live.worker import FAULT_ENV


def spawned_children() -> list[int]:
    """Our living spawn children (not the multiprocessing resource tracker, not zombies)."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            cmdline = (stat.parent / "cmdline").read_bytes()
        except OSError:
            continue
        if int(fields[1]) == os.getpid() and fields[0] != "Z" and b"spawn_main" in cmdline:
            out.append(int(stat.parent.name))
    return out


@pytest.mark.slow
@pytest.mark.parametrize("kind, phase, timeout", [("raise", "forward", 60), ("kill", "load", 60), ("hang", "load", 12)])
def test_failing_rank_is_named_and_stopped(tiny_config, monkeypatch, kind, phase, timeout):
    monkeypatch.setenv(FAULT_ENV, f"1:{kind}:{phase}")
    start = time.monotonic()
    with pytest.raises(RankFailure) as e:
        verify(tiny_config, 2, device="cpu", seq_len=8, timeout=timeout)
    elapsed = time.monotonic() - start
    message = str(e.value)
    assert e.value.rank == 1 and "\n" not in message and message.startswith("rank 1 ")
    assert "all ranks were stopped" in message
    if kind == "raise":
        assert "injected fault on rank 1 during forward" in message
        assert elapsed < timeout
    elif kind == "kill":
        assert "rank 1 was killed by SIGKILL during load" in message
        assert elapsed < timeout
    else:
        assert "hung in load" in message and "rank 0 waited for it in forward" in message
        assert timeout <= elapsed < timeout + 8
    assert spawned_children() == []

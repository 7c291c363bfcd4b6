"""A rank that raises or hangs stops the whole group with a one-line error naming it, and leaves no
process."""
import os
import time

import pytest

from tests.helpers.procs import spawned_by
from tpviz.live import RankFailure, verify
from tpviz.live.run.worker import FAULT_ENV


@pytest.mark.slow
# the hang's timeout leaves the other rank time to reach forward: ranks took past 8 s to start on a loaded
# 2-core CI runner, and 20 s once (the other worker running the live tests beside it)
@pytest.mark.parametrize("kind, phase, timeout", [("raise", "forward", 60), ("kill", "load", 60),
                                                  ("hang", "load", 30)])
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
    assert spawned_by(os.getpid()) == []

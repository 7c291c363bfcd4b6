"""The timeout covers the in-process tp=1 reference and its re-run; ranks die with their parent; SIGTERM
cleans up."""
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from tests.helpers.procs import alive, spawned_by
from tpviz.live import verify
from tpviz.live.errors import LiveError
from tpviz.live.run.worker import FAULT_ENV
from tests.paths import ROOT



def wait_for(predicate, seconds: float, step: float = 0.1):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(step)
    return predicate()


def hang(*args, **kwargs):
    time.sleep(3600)


def test_a_hanging_tp1_reference_ends_at_the_timeout(tiny_config, monkeypatch):
    monkeypatch.setattr("tpviz.live.check.verify.reference", hang)
    start = time.monotonic()
    with pytest.raises(LiveError, match="the tp=1 reference did not finish within the 2 s timeout"):
        verify(tiny_config, 1, device="cpu", seq_len=8, timeout=2)
    assert time.monotonic() - start < 6


@pytest.mark.slow
def test_a_hanging_reference_beside_ranks_ends_at_the_timeout(tiny_config, monkeypatch):
    monkeypatch.setattr("tpviz.live.check.verify.reference", hang)
    start = time.monotonic()
    # the ranks finish well before (2-3 s alone; past 8 s on a loaded 2-core CI runner, hence 20)
    with pytest.raises(LiveError, match="the tp=1 reference did not finish within the 20 s timeout"):
        verify(tiny_config, 2, device="cpu", seq_len=8, timeout=20)
    assert 20 <= time.monotonic() - start < 32


@pytest.mark.slow
def test_a_slow_reference_is_named_not_the_generating_ranks_that_wait_for_it(tiny_config, monkeypatch):
    monkeypatch.setattr("tpviz.live.check.verify.reference", hang)
    with pytest.raises(LiveError) as e:  # not "rank 0, 1 hung in forward": they wait there for its picks
        verify(tiny_config, 2, device="cpu", input_ids=[[1, 2, 3]], generate=2, timeout=20)
    assert (str(e.value)
            == ("the tp=1 reference did not finish within the 20 s timeout; the ranks, which need its "
                            "picks to generate, were stopped in forward"))


def diverge_then_hang(monkeypatch) -> threading.Event:
    """tp=1 'picks' another second token, so the in-process TP run diverges there; its re-run then hangs."""
    from tpviz.live.check import verify as check
    real, rerun = check.reference, threading.Event()

    def reference(job, device):
        if not job.generate:  # the diverging step, re-run on the common prefix
            rerun.set()
            hang()
        out = real(job, device)
        tokens = out["gen"]["gen.tokens"].clone()
        tokens[1] = (tokens[1] + 1) % 1000
        out["gen"]["gen.tokens"] = tokens
        return out
    monkeypatch.setattr(check, "reference", reference)
    return rerun


def test_the_diverging_steps_re_run_obeys_the_timeout_and_the_stop(tiny_config, monkeypatch):
    diverge_then_hang(monkeypatch)
    start = time.monotonic()
    with pytest.raises(LiveError,
                       match=r"^the tp=1 re-run of new token #2 \(to compare it stage by stage\) did "
                                        r"not finish within the 3 s timeout$"):
        verify(tiny_config, 1, device="cpu", input_ids=[[1, 2, 3]], generate=3, timeout=3)
    assert time.monotonic() - start < 3 + 2
    rerun = diverge_then_hang(monkeypatch)

    def tick():  # the page's Stop button (or SIGTERM's KeyboardInterrupt) while the re-run works
        if rerun.is_set():
            raise Stopped
    start = time.monotonic()
    with pytest.raises(Stopped):
        verify(tiny_config, 1, device="cpu", input_ids=[[1, 2, 3]], generate=3, timeout=120, tick=tick)
    assert time.monotonic() - start < 5


def start_cli(tiny_config, tmp_path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", FAULT_ENV: "1:hang:load",
           "TMPDIR": str(tmp_path)}
    return subprocess.Popen([sys.executable, "-m", "tpviz", "verify", str(tiny_config),
                             "--tp", "2", "--device",
                             "cpu", "--timeout", "300", "--quiet"], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.slow
def test_ranks_exit_when_the_parent_is_killed_while_they_start(tiny_config, tmp_path):
    proc = start_cli(tiny_config, tmp_path)
    try:
        ranks = wait_for(lambda: spawned_by(proc.pid) if len(spawned_by(proc.pid)) == 2 else [], 60, 0.02)
        assert len(ranks) == 2
        proc.kill()  # while they still import torch: no finally, no cleanup from the parent
        proc.wait()
        assert wait_for(lambda: not alive(ranks), 30), "ranks outlived their parent"
    finally:
        proc.kill()


@pytest.mark.slow
def test_sigterm_stops_the_ranks_and_removes_the_run_folder(tiny_config, tmp_path):
    proc = start_cli(tiny_config, tmp_path)
    try:
        ranks = wait_for(lambda: spawned_by(proc.pid) if len(spawned_by(proc.pid)) == 2 else [], 60, 0.02)
        assert len(ranks) == 2 and list(tmp_path.glob("tpviz-live-*"))
        time.sleep(1)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 130 and err.strip().splitlines()[-1] == "tpviz verify: interrupted"
        assert not alive(ranks) and not list(tmp_path.glob("tpviz-live-*"))
    finally:
        proc.kill()


class Stopped(BaseException):
    """What a UI's stop looks like from inside the run: not an Exception, so nothing swallows it."""


@pytest.mark.slow
def test_a_stop_from_tick_ends_the_ranks_within_seconds(tiny_config, monkeypatch, tmp_path):
    import tempfile
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setenv(FAULT_ENV, "1:hang:load")
    start = time.monotonic()

    def tick():
        if spawned_by(os.getpid()) and time.monotonic() - start > 3:
            raise Stopped
    with pytest.raises(Stopped):
        verify(tiny_config, 2, device="cpu", seq_len=8, timeout=120, tick=tick)
    assert time.monotonic() - start < 3 + 5  # terminate, then kill after 3 s at most
    assert spawned_by(os.getpid()) == [] and not list(tmp_path.glob("tpviz-live-*"))

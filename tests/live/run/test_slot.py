"""One live run at a time per server (others queue), and no more ranks than the machine carries."""
import os
import threading
import time

import pytest

from tpviz.live import verify
from tpviz.live.errors import LiveError
from tpviz.live.run.slot import MAX_RANKS_ENV, check_ranks, max_ranks, one_run_at_a_time


def test_rank_cap_follows_the_cores_and_the_override(monkeypatch):
    monkeypatch.delenv(MAX_RANKS_ENV, raising=False)
    assert max_ranks() == 2 * os.cpu_count() and max_ranks(gpus=4 * os.cpu_count()) == 4 * os.cpu_count()
    check_ranks(2 * os.cpu_count())
    with pytest.raises(LiveError,
                       match=rf"tp={2 * os.cpu_count() + 1} needs .* runs at most {2 * os.cpu_count()}"):
        check_ranks(2 * os.cpu_count() + 1)
    monkeypatch.setenv(MAX_RANKS_ENV, "off")
    assert max_ranks() is None
    check_ranks(10_000)
    for bad in ("lots", "²", "-1"):
        monkeypatch.setenv(MAX_RANKS_ENV, bad)
        with pytest.raises(LiveError, match=f"{MAX_RANKS_ENV}=.* must be a whole number"):
            max_ranks()


def test_verify_refuses_more_ranks_than_the_cap_before_spawning(tiny_config, monkeypatch):
    monkeypatch.setenv(MAX_RANKS_ENV, "1")
    start = time.monotonic()
    with pytest.raises(LiveError, match="tp=2 needs 2 rank processes; .* runs at most 1"):
        verify(tiny_config, 2, device="cpu", seq_len=8)
    assert time.monotonic() - start < 5
    verify(tiny_config, 1, device="cpu", seq_len=8)  # tp=1 spawns nothing


def test_a_second_run_waits_for_the_slot_and_is_told():
    held, release, order = threading.Event(), threading.Event(), []

    def first():
        with one_run_at_a_time():
            held.set()
            release.wait(5)
            order.append("first done")
    t = threading.Thread(target=first)
    t.start()
    held.wait(5)
    threading.Timer(0.3, release.set).start()
    with one_run_at_a_time(on_wait=lambda: order.append("told to wait")):
        order.append("second runs")
    t.join()
    assert order == ["told to wait", "first done", "second runs"]
    with one_run_at_a_time(on_wait=lambda: order.append("never")):  # free again: no wait, no message
        pass
    assert "never" not in order


def test_a_slot_held_too_long_is_one_line():
    with one_run_at_a_time():
        done = []
        t = threading.Thread(target=lambda: done.append(pytest.raises(LiveError, _second)))
        t.start()
        t.join()
    assert done and "another live run has held this server for over 0.2 s" in str(done[0].value)


def _second():
    with one_run_at_a_time(wait_s=0.2):
        pass

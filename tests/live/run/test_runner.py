"""Backend choice (incl. the CUDA branches, with a fake GPU list) and culprit naming, without spawning."""
import json
import time

import pytest

from tpviz.live import LiveError, choose_backend
from tpviz.live.errors import RankFailure
from tpviz.live.run.runner import _failure_message, _hang_message, _timed_out


@pytest.mark.parametrize("tp, device, gpus, backend, on, why", [
    (2, "auto", [], "gloo", "cpu", "no CUDA GPU found"),
    (2, "cpu", ["H200"], "gloo", "cpu", "device cpu was asked for"),
    (2, "auto", ["H200"], "gloo", "cuda", "NCCL refuses two ranks on one GPU"),
    (4, "cuda", ["A100"] * 2, "gloo", "cuda", "2 GPU(s) for 4 ranks"),
    (2, "cuda", ["A100"] * 8, "nccl", "cuda", "one GPU per rank"),
    (1, "auto", ["H200"], "none", "cuda", "tp=1 needs no process group"),
])
def test_backend_choice(tp, device, gpus, backend, on, why):
    env = choose_backend(tp, device, gpus=gpus)
    assert (env.backend, env.device) == (backend, on) and why in env.reason
    assert env.launcher == ("in-process" if tp == 1 else "spawn")


def test_torchrun_counts_ranks_per_node():
    env = choose_backend(16, "auto", launcher="torchrun", gpus=["H100"] * 8, ranks_per_node=8)
    assert env.backend == "nccl" and env.launcher == "torchrun"


def test_backend_errors():
    with pytest.raises(LiveError, match="no CUDA GPU"):
        choose_backend(2, "cuda", gpus=[])
    with pytest.raises(LiveError, match="must be one of"):
        choose_backend(2, "tpu", gpus=[])


def _write(run_dir, rank, phases=(), error=None, user=False, t=None):
    (run_dir / f"rank{rank}.phase").write_text("".join(f"{p} {time.time()}\n" for p in phases))
    if error:
        (run_dir / f"rank{rank}.error.json").write_text(json.dumps(
            {"type": "RuntimeError", "message": error, "user_error": user, "time": t or time.time()}))


def test_culprit_is_the_earliest_error_not_the_peer_that_lost_its_connection(tmp_path):
    _write(tmp_path, 0, ["init", "load", "forward"], "Connection closed by peer", t=2.0)
    _write(tmp_path, 1, ["init", "load", "forward"], "boom", t=1.0)
    message, rank, user = _failure_message(tmp_path, {0: 1, 1: 1})
    assert rank == 1 and not user and message.startswith("rank 1 failed: RuntimeError: boom")


def test_a_silent_death_beats_its_peers_errors_and_user_errors_beat_all(tmp_path):
    _write(tmp_path, 0, ["init", "load", "forward"], "Connection closed by peer")
    _write(tmp_path, 1, ["init", "load"])
    assert _failure_message(tmp_path, {0: 1, 1: -9})[:2] == ("rank 1 was killed by SIGKILL during load; "
                                                            "all ranks were stopped", 1)
    _write(tmp_path, 2, ["init", "load"], "checkpoint lacks x", user=True)
    message, rank, user = _failure_message(tmp_path, {0: 1, 1: -9, 2: 1})
    assert ((rank, user) == (2, True)
            and message == "rank 2 failed: checkpoint lacks x; all ranks were stopped")


def test_hang_names_the_rank_furthest_behind(tmp_path):
    _write(tmp_path, 0, ["init", "load", "forward"])
    _write(tmp_path, 1, ["init", "load"])
    _write(tmp_path, 2, ["init", "load", "forward"])
    message, rank = _hang_message(tmp_path, 3, 30, alive=[0, 1, 2])
    assert rank == 1 and message.startswith("rank 1 hung in load (no result within the 30 s timeout)")
    assert "rank 0, 2 waited for it in forward" in message


@pytest.mark.parametrize("ranks, ref_running, generating, error, message", [
    # generating ranks wait there for the reference's picks
    ([["forward"], ["forward"]], True, True, LiveError,
     "the tp=1 reference did not finish within the 30 s timeout; the ranks, which need "
     "its picks to generate, were stopped in forward"),
    ([["load"], ["forward"]], True, True, RankFailure,  # one rank never reached them: both were behind
     "rank 0 hung in load (no result within the 30 s timeout); rank 1 waited for it in forward; the tp=1 "
     "reference had not finished either; all ranks were stopped"),
    # without generation the ranks need nothing from it
    ([["forward"], ["forward"]], True, False, RankFailure,
     "rank 0, 1 hung in forward (no result within the 30 s timeout); the tp=1 reference had "
     "not finished either; all ranks were stopped"),
    ([["forward"], ["forward"]], False, True, RankFailure,
     "rank 0, 1 hung in forward (no result within the 30 s timeout); all ranks were stopped"),
    (None, True, True, LiveError,
     "the tp=1 reference did not finish within the 30 s timeout (the ranks had finished)"),
])
def test_a_timeout_names_what_was_still_running(tmp_path, ranks, ref_running, generating, error, message):
    for rank, phases in enumerate(ranks or []):
        _write(tmp_path, rank, ["init", *phases])
    e = _timed_out(tmp_path, 2, 30, [0, 1] if ranks else [], ref_running, generating)
    assert type(e) is error and str(e) == message

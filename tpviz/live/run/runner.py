"""Spawn tp_size x pp_size ranks, watch them, and stop the whole group on any failure or hang.

Every run has its own temp folder and its own TCPStore on a port the OS picks (port 0, held by the
parent until the end), so concurrent runs never share a port or a file.
"""
import json
import multiprocessing
import os
import shutil
import signal
import tempfile
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from multiprocessing.connection import wait
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from safetensors.torch import load_file

from tpviz.live.errors import LiveError, RankFailure
from tpviz.live.run.inprocess import Background
from tpviz.live.check.results import Environment
from tpviz.live.run.job import Job, Launch
from tpviz.live.run.worker import spawn_entry

PHASES = ("start", "init", "load", "forward", "done")  # in order; "start" = process starting, importing torch
DEVICES = ("auto", "cpu", "cuda")


def start_method() -> str:
    """forkserver where there is one: ranks fork from a server that has imported torch and the worker once
    (about 1.3 s saved per rank); it never touches CUDA, so each rank still starts its own. Else spawn."""
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return "spawn"
    multiprocessing.set_forkserver_preload(["tpviz.live.run.worker"])  # not __main__: a Streamlit page, say
    return "forkserver"


def gpu_names() -> list[str]:
    """Names of the visible CUDA GPUs (empty without CUDA)."""
    if not torch.cuda.is_available():
        return []
    return [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]


def choose_backend(world: int, device: str = "auto", launcher: str = "spawn", gpus: list[str] | None = None,
                   ranks_per_node: int | None = None) -> Environment:
    """NCCL with one GPU per rank when there are enough GPUs; else gloo, on CUDA tensors if any GPU exists."""
    if device not in DEVICES:
        raise LiveError(f"device {device!r} must be one of: {', '.join(DEVICES)}")
    gpus = gpu_names() if gpus is None else gpus
    if device == "cuda" and not gpus:
        raise LiveError("device cuda was asked for, but torch sees no CUDA GPU")
    ranks = ranks_per_node or world
    launcher = "in-process" if world == 1 and launcher == "spawn" else launcher  # tp=1 spawns nothing
    env = dict(launcher=launcher, gpus=gpus, torch=torch.__version__)
    if device == "cpu" or not gpus:
        why = "device cpu was asked for" if device == "cpu" else "no CUDA GPU found"
        if world == 1:
            return Environment(device="cpu", backend="none",
                               reason=f"{why}; tp=1 needs no process group", **env)
        return Environment(device="cpu", backend="gloo", reason=f"{why}: gloo on CPU", **env)
    if world == 1:
        return Environment(device="cuda", backend="none", reason="tp=1 needs no process group", **env)
    if len(gpus) >= ranks:
        return Environment(device="cuda", backend="nccl",
                           reason=f"{len(gpus)} GPU(s) for {ranks} rank(s): NCCL, one GPU per rank", **env)
    return Environment(device="cuda", backend="gloo",
                       reason=f"{len(gpus)} GPU(s) for {ranks} ranks: NCCL refuses two ranks on one GPU, "
                              "so gloo all-reduces CUDA tensors on shared GPUs", **env)


@dataclass
class GroupRun:
    """What a finished group returned: rank 0's logits and hidden states, every rank's report, phase times."""
    logits: torch.Tensor
    hidden: dict[str, torch.Tensor]
    reports: list[dict]
    phases: dict[str, float] = field(default_factory=dict)
    overlap_result: object = None
    extra: dict[str, torch.Tensor] = field(default_factory=dict)  # the leads' gen.* tensors (generation)


def _phases(run_dir: Path, world: int) -> list[list[tuple[str, float]]]:
    out = []
    for rank in range(world):
        path, marks = run_dir / f"rank{rank}.phase", []
        try:
            lines = path.read_text(errors="replace").splitlines() if path.is_file() else []
        except OSError:
            lines = []
        for line in lines:  # skip what does not parse: a half-written line the rank is still writing
            name, _, t = line.partition(" ")
            try:
                when = float(t)
            except ValueError:
                continue
            if name in PHASES:
                marks.append((name, when))
        out.append(marks)
    return out


def _current(marks: list[tuple[str, float]]) -> str:
    return marks[-1][0] if marks else "start"


def _hang_message(run_dir: Path, world: int, timeout: float, alive: list[int],
                  also: str = "") -> tuple[str, int | None]:
    """Name the rank(s) furthest behind: the others are waiting for them in a collective. `also`: what else
    was still running, said before the ranks' stop."""
    where = {r: _current(m) for r, m in enumerate(_phases(run_dir, world)) if r in alive}
    if not where:
        return f"the ranks did not finish within {timeout:g} s", None
    behind = min(PHASES.index(p) for p in where.values())
    stuck = [r for r, p in where.items() if PHASES.index(p) == behind]
    waiting = [r for r in where if r not in stuck]
    ranks = ", ".join(map(str, stuck))
    msg = f"rank {ranks} hung in {PHASES[behind]} (no result within the {timeout:g} s timeout)"
    if waiting:
        phases = ", ".join(sorted({where[r] for r in waiting}))
        msg += f"; rank {', '.join(map(str, waiting))} waited for it in {phases}"
    return msg + also + "; all ranks were stopped", stuck[0] if len(stuck) == 1 else None


def _timed_out(run_dir: Path, world: int, timeout: float, alive: list[int], ref_running: bool,
               ranks_need_ref: bool) -> LiveError:
    """Name what was still running when time ran out: the tp=1 reference, the ranks, or both. Generating ranks
    need the reference's picks from their first step, so when all of them reached forward it is the one
    behind."""
    late = f"the tp=1 reference did not finish within the {timeout:g} s timeout"
    where = {_current(m) for r, m in enumerate(_phases(run_dir, world)) if r in alive}
    if ref_running and not alive:
        return LiveError(f"{late} (the ranks had finished)")
    if ref_running and ranks_need_ref and where == {"forward"}:
        return LiveError(f"{late}; the ranks, which need its picks to generate, were stopped in forward")
    message, rank = _hang_message(run_dir, world, timeout, alive,
                                  "; the tp=1 reference had not finished either" if ref_running else "")
    return RankFailure(message, rank)


def _failure_message(run_dir: Path, dead: dict[int, int]) -> tuple[str, int, bool]:
    """Name the culprit among ranks that exited non-zero (`dead`: rank -> exit code, seen before we stopped
    any).

    A user error comes first; then a rank that died with no Python error (a signal, an OOM kill), since its
    peers' errors are only the broken connection; then the earliest Python error. Returns (message, rank,
    user).
    """
    errors = {}
    for path in run_dir.glob("rank*.error.json"):
        try:
            errors[int(path.name[4:].split(".")[0])] = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
    by_time = sorted(errors, key=lambda r: errors[r]["time"])
    user = [r for r in by_time if errors[r]["user_error"]]
    silent = sorted(r for r in dead if r not in errors)
    if user or not silent:
        rank = (user or by_time)[0]  # every dead rank left an error file, so by_time is not empty here
        err = errors[rank]
        text = err["message"] if err["user_error"] else f"{err['type']}: {err['message']}"
        return f"rank {rank} failed: {text}; all ranks were stopped", rank, err["user_error"]
    rank, code = silent[0], dead[silent[0]]
    try:
        how = f"was killed by {signal.Signals(-code).name}" if code < 0 else f"exited with code {code}"
    except ValueError:
        how = f"was killed by signal {-code}"
    phase = _current(_phases(run_dir, rank + 1)[rank])
    return f"rank {rank} {how} during {phase}; all ranks were stopped", rank, False


def _stop(ctx) -> None:
    """Terminate, then kill, every rank still alive, and reap them all: no orphans, no zombies."""
    for p in ctx.processes:
        if p.is_alive():
            p.terminate()
    deadline = time.monotonic() + 3
    for p in ctx.processes:
        p.join(max(0.0, deadline - time.monotonic()))
        if p.is_alive():
            p.kill()
            p.join()
    for f in ctx.error_files:
        Path(f).unlink(missing_ok=True)


@contextmanager
def interrupt_on_sigterm():
    """SIGTERM unwinds like Ctrl-C while a run lasts: ranks stopped, the run's temp folder removed."""
    if threading.current_thread() is not threading.main_thread():  # only the main thread may set handlers
        yield
        return

    def interrupt(signum, frame):
        raise KeyboardInterrupt
    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def run_group(job: Job, tp_size: int, timeout: float, progress=None, overlap=None, tick=None,
              publish=None) -> GroupRun:
    """Spawn tp_size x job.pp_size ranks running `job`, wait at most `timeout` s, and collect the outputs.

    `overlap()` (the tp=1 reference) runs on a thread of this process while the ranks run, under the same
    timeout; `progress(phase)` is called as the slowest rank enters each phase, and `tick()` every 0.1 s:
    whatever it raises (a UI's stop) ends the run, and the ranks are stopped on the way out. Once overlap() is
    done, the {key: text} of `publish(its result)` are set in the group's store, for ranks that wait for them.
    """
    run_dir = Path(tempfile.mkdtemp(prefix="tpviz-live-"))
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                          timeout=timedelta(seconds=timeout))
    world = tp_size * job.pp_size
    launch = Launch(job, str(run_dir), store.port, tp_size, world, timeout, os.getpid(), dict(os.environ))
    t0, started = time.time(), time.monotonic()
    ctx = mp.start_processes(spawn_entry, args=(launch,), nprocs=world, join=False,
                             daemon=True, start_method=start_method())
    ref = Background(overlap or (lambda: None))
    try:
        reported, published = "start", publish is None
        while True:
            if running := [p.sentinel for p in ctx.processes if p.exitcode is None]:
                wait(running, timeout=0.1)  # wakes when one exits
            else:
                ref.thread.join(0.1)
            if tick:
                tick()
            if ref.done and ref.error is not None:
                ref.get()  # the reference's own error (a user error, or a bug) ends the run too
            if not published and ref.done:
                for key, text in publish(ref.get()).items():
                    store.set(key, text)
                published = True
            codes = [p.exitcode for p in ctx.processes]
            dead = {r: c for r, c in enumerate(codes) if c not in (None, 0)}
            if dead:  # snapshot before we stop anyone, so our own SIGTERMs never look like the cause
                message, rank, user_error = _failure_message(run_dir, dead)
                raise LiveError(message) if user_error else RankFailure(message, rank)
            finished = all(c == 0 for c in codes) and ref.done
            slowest = min((_current(m) for m in _phases(run_dir, world)), key=PHASES.index)
            while progress and PHASES.index(slowest) > PHASES.index(reported):  # no phase skipped, even when
                # forked ranks finish in one poll
                reported = PHASES[PHASES.index(reported) + 1]
                progress(reported)
            if finished:
                break
            if time.monotonic() - started > timeout:
                alive = [r for r, p in enumerate(ctx.processes) if p.is_alive()]
                raise _timed_out(run_dir, world, timeout, alive, not ref.done, publish is not None)
        return _collect(run_dir, world, tp_size, t0, ref.get())
    finally:
        _stop(ctx)
        del store
        shutil.rmtree(run_dir, ignore_errors=True)


def _collect(run_dir: Path, world: int, tp_size: int, t0: float, overlap_result) -> GroupRun:
    """Every rank's report; the hidden states of each stage's TP rank 0 in stage order, the last one's
    logits."""
    leads = range(0, world, tp_size)
    missing = [r for r in range(world) if not (run_dir / f"rank{r}.json").is_file()]
    missing += [r for r in leads if not (run_dir / f"rank{r}.safetensors").is_file()]
    if missing:  # e.g. a rank stopped by Ctrl-C exits 0
        raise RankFailure(f"rank {missing[0]} exited without a result; all ranks were stopped", missing[0])
    reports = [json.loads((run_dir / f"rank{r}.json").read_text()) for r in range(world)]
    hidden, logits, extra = {}, None, {}
    for r in leads:
        tensors = load_file(str(run_dir / f"rank{r}.safetensors"))
        names = reports[r].pop("hidden_names")
        hidden.update({n: tensors[f"hidden.{i}"] for i, n in enumerate(names)})
        logits = tensors.get("logits", logits)
        extra.update({k: v for k, v in tensors.items() if k.startswith("gen.")})
    # a phase ends when its slowest rank leaves it
    entered = {p: max(t for marks in _phases(run_dir, world) for name, t in marks if name == p)
               for p in ("load", "forward", "done")}
    phases = {"spawn": entered["load"] - t0, "load": entered["forward"] - entered["load"],
              "forward": entered["done"] - entered["forward"]}
    return GroupRun(logits, hidden, reports, phases, overlap_result, extra)

"""One rank's work: build the model, load its slices, run the forward pass, and report.

`spawn_entry` is the importable target of torch.multiprocessing spawn; `run_model` is shared with the
in-process tp=1 reference and with torchrun ranks.
"""
import ctypes
import json
import os
import signal
import threading
import time
from collections.abc import Callable
from contextlib import nullcontext
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from safetensors.torch import save_file

from tpviz.errors import TpvizError
from tpviz.live.check.inject import apply_injections
from tpviz.layers.linear import use_tp_groups
from tpviz.rules import ruleset
from tpviz.rules.ruleset import ROLES
from tpviz.live.run.comms import CollectiveCounter
from tpviz.live.check.compare import DTYPES
from tpviz.live.check.generate import greedy_steps
from tpviz.live.load.dtypes import stored_bytes
from tpviz.live.model.config import Stage
from tpviz.live.run.job import Job, Launch
from tpviz.live.model.causal_lm import LiveForCausalLM
from tpviz.live.model.moe import SparseMoeBlock
from tpviz.live.check.routing import collect as collect_routing, watch as watch_routing
from tpviz.live.load.weights import checkpoint_files, load_weights
from tpviz.live.load.targets import check_against_map

REF_TOKENS_KEY = "ref_tokens"  # TCPStore key: the tp=1 reference's generated tokens (JSON)
FAULT_ENV = "TPVIZ_LIVE_FAULT"  # "RANK:raise|hang|kill:PHASE", used by the tests to make one rank fail


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def rank_stage(job: Job, rank: int, tp_size: int) -> tuple[int, int, Stage]:
    """(pipeline stage, TP rank, Stage) of a global rank: stages are consecutive blocks of tp_size ranks."""
    pp_rank, tp_rank = divmod(rank, tp_size)
    stage = Stage.of(job.cfg.spec, tp_size, tp_rank, job.pp_size, pp_rank, job.ep,
                     job.placement, job.cfg.rules, job.layout)
    return pp_rank, tp_rank, stage


def run_model(job: Job, rank: int, tp_size: int, device: torch.device,
              mark: Callable[[str], None] = lambda phase: None,
              ref_tokens: Callable[[], list[int]] | None = None
              ) -> tuple:
    """Build, load and run one rank; return (logits or None, this stage's hidden states or None, report dict).

    A pipeline stage after the first receives the hidden state from the same TP rank of the stage before and
    sends its own on; logits come from the last stage's TP rank 0, hidden states from each stage's TP rank 0.
    With job.generate = N the first forward pass is step 0 of N greedy steps (generate.greedy_steps), whose
    gen.* tensors go in report["generation"]; `ref_tokens()` (or job.ref_tokens) gives the tp=1 picks."""
    cfg, dtype = job.cfg, DTYPES[job.dtype]
    pp_rank, tp_rank, stage = rank_stage(job, rank, tp_size)
    start = time.perf_counter()
    mark("load")
    with torch.device(device):
        model = LiveForCausalLM(cfg, tp_size, tp_rank, stage)
    model.to(dtype)
    apply_injections(model, list(job.inject))  # before loading: wrong-kv-head changes which slice loads
    stats = load_weights(model, job.checkpoint)
    mapped = check_against_map(model, tp_rank)  # the map on screen is the map that loaded
    _sync(device)
    load_s = time.perf_counter() - start
    mark("forward")
    ids = torch.tensor(job.input_ids, dtype=torch.int64, device=device)

    def forward(ids: torch.Tensor) -> tuple:
        h = None
        if not stage.first:  # under attention DP, this GPU's group's rows
            model.rows.begin(ids.shape[0])
            h = torch.empty(*model.rows.own(ids).shape, cfg.spec.hidden_size, dtype=dtype, device=device)
            dist.recv(h, src=rank - tp_size)
        logits, hidden = model(ids, h)
        if not stage.last:
            dist.send(next(reversed(hidden.values())).contiguous(), dst=rank + tp_size)
        return logits, hidden

    start = time.perf_counter()
    # ranks of a real group count their collectives (torch dispatch mode: this thread and block only)
    counter = CollectiveCounter() if dist.is_initialized() else None
    counting = counter if counter is not None else nullcontext()
    # the check compares each MoE layer's expert choices; its fp32 reference computes with the bf16 run's
    watch_routing(model, (SparseMoeBlock,), job.follow_routing)
    with torch.inference_mode(), counting:
        logits, hidden = forward(ids)
    _sync(device)
    forward_s = time.perf_counter() - start
    logits, hidden = every_row(model, logits, hidden, ids.shape)
    routes = collect_routing(model)
    params = dict(model.named_parameters())
    numel = sum(p.numel() for p in params.values())
    report = {"rank": rank, "device": str(device), "stage": pp_rank, "tp_rank": tp_rank,
              "layers": list(stage.layers), "experts": None if stage.experts is None else list(stage.experts),
              "groups": None if stage.cuts is None else {role: list(stage.cuts.of(role)) for role in ROLES},
              "param_shapes": {n: list(p.shape) for n, p in params.items()},
              "params_checked_against_map": mapped,
              "param_bytes": sum(p.numel() * p.element_size() for p in params.values()),
              "bytes_read": stats.read, "bytes_spanned": stats.spanned,
              "checkpoint_bytes": sum(f.stat().st_size for f in checkpoint_files(Path(job.checkpoint))),
              "load_s": load_s, "forward_s": forward_s, "collectives": counter.stats if counter else {},
              "dtype": job.dtype, "stored_dtype": job.stored_dtype,
              "stored_bytes": stored_bytes(numel, job.stored_dtype)}
    if job.generate:
        start = time.perf_counter()
        refs = ref_tokens or ((lambda: job.ref_tokens) if job.ref_tokens is not None else None)
        leader = (job.pp_size - 1) * tp_size if tp_size * job.pp_size > 1 else None
        with torch.inference_mode():
            report["generation"] = greedy_steps(forward, (logits, hidden), ids,
                                                job.generate, keep=tp_rank == 0,
                                                leader=leader, ref_tokens=refs,
                                                follow=job.follow, eos=job.eos)
        _sync(device)
        report["generate_s"] = time.perf_counter() - start
    if tp_rank != 0:
        return None, None, report
    out = None if logits is None else logits.float().cpu()
    return out, {**{k: v.float().cpu() for k, v in hidden.items()}, **routes}, report  # routes: routing.split


def every_row(model, logits, hidden: dict, shape: torch.Size) -> tuple:
    """Under attention DP, the check's view of every group's rows (gathered from each group's first GPU, after
    the forward pass, so not counted with its collectives); as they are otherwise."""
    rows = model.rows
    if rows.dp == 1:
        return logits, hidden
    with torch.inference_mode():
        hidden = {k: rows.gather(v) for k, v in hidden.items()}
        head = model.stage.cuts.of("lm_head")[0]
        if model.stage.last and not rows.gathers(head):  # --enable-dp-lm-head: each group has its own rows
            logits = rows.gather(logits, (shape[1], model.cfg.spec.vocab_size), next(iter(hidden.values())))
    return logits, hidden


def _tp_groups(job: Job, tp_size: int, rank: int) -> None:
    """The groups layers reduce over: one per pipeline stage, and in an SGLang layout one per block of each
    role's width (every rank creates every group, in the same order, as torch needs)."""
    widths = {tp_size}
    if job.layout is not None:
        w = ruleset(job.cfg.rules).widths(job.layout, job.cfg.spec.arch)
        widths |= {w.of(role) for role in ROLES}
    if job.pp_size == 1 and widths == {tp_size}:
        return  # the whole world is the TP group
    mine = {}
    for s in range(job.pp_size):
        for width in sorted(widths - {1}):
            for block in range(s * tp_size, (s + 1) * tp_size, width):
                group = dist.new_group(list(range(block, block + width)))
                if block <= rank < block + width:
                    mine[width] = group
    use_tp_groups(mine)


def spawn_device(job: Job, rank: int) -> torch.device:
    """cuda:rank under NCCL, a shared GPU (rank mod GPUs) under gloo with CUDA tensors, else CPU."""
    if job.device != "cuda":
        return torch.device("cpu")
    return torch.device("cuda", rank % torch.cuda.device_count())


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        pass
    return True


def _watch_parent(parent: int) -> None:
    """Exit when the run's parent dies, even if the main thread is stuck inside a C++ collective: the kernel's
    parent-death signal on Linux (from a forkserver, which exits with the parent), a watcher thread, and at
    once if it died while we started."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: the thread below covers it
        pass
    forked_by = os.getppid()  # the parent itself under spawn, the forkserver under forkserver
    if forked_by == 1 or not _alive(parent):  # it died while this rank started
        os._exit(3)

    def loop():
        while os.getppid() == forked_by and _alive(parent):
            time.sleep(0.5)
        os._exit(3)

    threading.Thread(target=loop, daemon=True).start()


def _fault(rank: int, phase: str) -> None:
    spec = os.environ.get(FAULT_ENV, "")
    if spec.count(":") == 2:
        f_rank, kind, f_phase = spec.split(":")
        if f_rank == str(rank) and f_phase == phase:
            if kind == "hang":
                time.sleep(3600)
            if kind == "kill":  # dies like an OOM kill: no Python error at all
                os.kill(os.getpid(), signal.SIGKILL)
            raise RuntimeError(f"injected fault on rank {rank} during {phase}")


def spawn_entry(rank: int, launch: Launch) -> None:
    """Body of one spawned rank: join the group over the parent's TCPStore, run, write results to run_dir."""
    os.environ.clear()  # the caller's environment now, not the forkserver's from when it started
    os.environ.update(launch.env)
    _watch_parent(launch.parent_pid)
    job, run_dir, tp_size, world = launch.job, Path(launch.run_dir), launch.tp_size, launch.world_size
    log = os.open(run_dir / f"rank{rank}.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    os.dup2(log, 1)  # library warnings go to the run's log, so the caller's terminal keeps one clean line
    os.dup2(log, 2)

    def mark(phase: str) -> None:
        with open(run_dir / f"rank{rank}.phase", "a") as f:
            f.write(f"{phase} {time.time()}\n")
        _fault(rank, phase)

    try:
        mark("init")
        device = spawn_device(job, rank)
        if device.type == "cuda":
            torch.cuda.set_device(device)
        else:
            torch.set_num_threads(1)  # ranks share the cores; more threads only thrash
        timeout = timedelta(seconds=launch.timeout)
        store = dist.TCPStore("127.0.0.1", launch.store_port, is_master=False, timeout=timeout)
        dist.init_process_group(job.backend, store=store, rank=rank, world_size=world, timeout=timeout)
        _tp_groups(job, tp_size, rank)
        # the parent posts the tp=1 reference's picks once it has them (runner.run_group's publish)
        logits, hidden, report = run_model(job, rank, tp_size, device, mark,
                                           lambda: json.loads(store.get(REF_TOKENS_KEY).decode()))
        generation = report.pop("generation", None) or {}
        if hidden is not None:  # each stage's TP rank 0
            names = list(hidden)  # safetensors keys stay simple; the names travel in the report
            tensors = {f"hidden.{i}": hidden[n].contiguous() for i, n in enumerate(names)}
            if logits is not None:
                tensors["logits"] = logits.contiguous()
            tensors.update({k: v.contiguous() for k, v in generation.items()})
            save_file(tensors, str(run_dir / f"rank{rank}.safetensors"))
            report["hidden_names"] = names
        (run_dir / f"rank{rank}.json").write_text(json.dumps(report))
        mark("done")
        dist.destroy_process_group()
    except BaseException as e:
        message = next((line for line in str(e).splitlines() if line.strip()), "")
        (run_dir / f"rank{rank}.error.json").write_text(json.dumps(
            {"type": type(e).__name__, "message": message[:500], "user_error": isinstance(e, TpvizError),
             "time": time.time()}))
        raise

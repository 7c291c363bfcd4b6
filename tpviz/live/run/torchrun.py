"""Run the check as one rank of a torchrun (or any env:// launched) job, so it scales past one node."""
import os
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from tpviz.errors import TpvizError
from tpviz.live.check.verify import build_result, prepare, reference
from tpviz.live.errors import LiveError
from tpviz.live.check.results import VerifyResult
from tpviz.live.run.runner import choose_backend
from tpviz.live.run.worker import run_model


class SharedError(LiveError):
    """An error every rank hit the same way (bad input); only rank 0 needs to print it."""


def launched_by_torchrun() -> bool:
    """True when RANK and WORLD_SIZE say this process is one rank of a launched job."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def torchrun_rank() -> int:
    """This process's global rank under torchrun."""
    return int(os.environ["RANK"])


def verify_torchrun(model, tp_size: int | None = None, *, device: str = "auto", timeout: float = 300.0,
                    **kwargs) -> tuple[VerifyResult | None, torch.Tensor | None, bool]:
    """Run this rank in the launched group; rank 0 also runs the tp=1 reference and compares.

    Returns (result, logits) on rank 0 and (None, None) elsewhere, plus the verdict on every rank.
    """
    t0 = time.perf_counter()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    tp_size = world if tp_size is None else tp_size
    if kwargs.get("pp", 1) != 1:
        raise SharedError("pipeline stages run with the built-in launcher (tpviz verify "
                          "--pp P, no torchrun); under torchrun every rank is one tp slice")
    if tp_size != world:
        raise SharedError(f"--tp {tp_size} must equal the launched WORLD_SIZE={world}")
    try:
        env = choose_backend(world, device, launcher="torchrun", ranks_per_node=local_world)
    except TpvizError as e:
        raise SharedError(str(e)) from None
    dev = (torch.device("cuda", local_rank % torch.cuda.device_count()) if env.device == "cuda"
           else torch.device("cpu"))
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    if not dist.is_initialized():
        backend = "gloo" if env.backend == "none" else env.backend
        dist.init_process_group(backend, timeout=timedelta(seconds=timeout))
    # one rank per node prepares first, so a random checkpoint is made once per node, then the rest reuse it
    prep, error = None, None
    if local_rank == 0:
        try:
            prep = prepare(model, world, device=device, env=env, **kwargs)
        except TpvizError as e:
            error = str(e)
    errors = [None] * world
    dist.all_gather_object(errors, error)
    if any(errors):
        raise SharedError(next(e for e in errors if e))
    if prep is None:
        prep = prepare(model, world, device=device, env=env, **kwargs)
    phases = {"prepare": time.perf_counter() - t0}
    refs: dict = {}

    def timed_reference() -> dict:  # rank 0 only; with generation, when its first pick needs the tp=1 ones
        if "ref" not in refs:
            start = time.perf_counter()
            refs["ref"] = reference(prep.job, dev)
            phases["reference"] = time.perf_counter() - start
        return refs["ref"]

    ref_tokens = (lambda: timed_reference()["gen"]["gen.tokens"].tolist()) if rank == 0 else None
    logits, hidden, report = run_model(prep.job, rank, world, dev, ref_tokens=ref_tokens)
    gen = report.pop("generation", None)
    phases.update(load=report["load_s"], forward=report["forward_s"])
    reports = [None] * world if rank == 0 else None
    dist.gather_object(report, reports, dst=0)
    result = None
    if rank == 0:
        ref = timed_reference()
        result = build_result(prep, world, logits, hidden, ref, reports, phases,
                              kwargs.get("seed", 0), gen, dev)
        result.phases["total"] = time.perf_counter() - t0
    verdict = [result.passed if result else None]
    dist.broadcast_object_list(verdict, src=0)
    dist.destroy_process_group()
    return result, logits, bool(verdict[0])

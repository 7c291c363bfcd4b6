"""The probe: one rank's layer built from a plan, tiny and on one thread, and where a plan lives in the
model."""
import gc
import threading
from contextlib import contextmanager

import torch

from tpviz.errors import QuantError, TPSizeError
from tpviz.plan import ParamPlan

_lock = threading.Lock()
_depth, _threads_saved, _gc_saved = 0, 1, True


@contextmanager
def probing():
    """Probe tensors are tiny: torch's intra-op threads only add contention (10-100x on a busy machine), and
    the cyclic collector, woken by the thousands of probe modules a map builds, rescans every live object of
    the process (an app's are many): 10% of a large map here. Both settings are process-wide, so overlapping
    traces (app sessions are threads) share one save/restore; the probes' cycles are collected after."""
    global _depth, _threads_saved, _gc_saved
    with _lock:
        if _depth == 0:
            _threads_saved, _gc_saved = torch.get_num_threads(), gc.isenabled()
            torch.set_num_threads(1)
            gc.disable()
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0:
                torch.set_num_threads(_threads_saved)
                if _gc_saved:
                    gc.enable()


def build_rank(plan: ParamPlan, tp_size: int, tp_rank: int) -> tuple:
    """Build one rank's module for a plan; generic divisibility errors are renamed to the config key, and a
    quantization check names the layer it failed in (vLLM's own message follows)."""
    try:
        return plan.build(tp_size, tp_rank)
    except QuantError as e:
        reason = f"{where(plan)} at tp_size={tp_size}: {e}"
        raise QuantError(reason, reason=reason) from None
    except TPSizeError as e:
        if plan.quantity and e.generic:
            key, value = plan.quantity
            raise TPSizeError(f"{key}={value} is not divisible by tp_size={tp_size}", key,
                              value, tp_size) from None
        raise


def where(plan: ParamPlan) -> str:
    """The first concrete module of a plan: 'model.layers.3.mlp.experts.0.gate_proj'."""
    module = plan.sources[0].name.rsplit(".", 1)[0]
    if plan.layers:
        module = module.replace("*", str(plan.layers[0]), 1)
    return module.replace("*", "0")

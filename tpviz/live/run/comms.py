"""The collectives one rank issues, counted with a torch dispatch mode scoped to the block: every c10d op the
process group runs (collectives and point-to-point send/recv between pipeline stages), with the bytes each op
sends. Nothing in torch.distributed is patched, so other threads are never counted."""
import torch
from torch.utils._python_dispatch import TorchDispatchMode

# c10d op -> the torch.distributed call users know it by
OPS = {"allreduce_": "all_reduce", "allgather_": "all_gather", "_allgather_base_": "all_gather",
       "allgather_into_tensor_coalesced_": "all_gather", "gather_": "gather",
       "reduce_scatter_": "reduce_scatter",
       "_reduce_scatter_base_": "reduce_scatter", "broadcast_": "broadcast", "send": "send", "recv_": "recv"}


def _nbytes(value) -> int:
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, (list, tuple)):
        return sum(_nbytes(v) for v in value)
    return 0


class CollectiveCounter(TorchDispatchMode):
    """`with CollectiveCounter() as c:` ... `c.stats` is {op: {"count", "bytes"}}, bytes being the tensors
    this rank contributes (for recv: receives)."""

    def __init__(self):
        super().__init__()
        self.stats: dict[str, dict[str, int]] = {}

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # nothing is compiled inside the block; torch's default wraps __torch_dispatch__ in dynamo.disable,
        # whose first call imports dynamo and inductor: about 1.2 s in every rank for nothing
        return False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        namespace, _, op = func._schema.name.partition("::")
        if namespace == "c10d" and op in OPS:
            names = [a.name for a in func._schema.arguments]
            sent = args[names.index("input_tensors")] if "input_tensors" in names else args[0]
            entry = self.stats.setdefault(OPS[op], {"count": 0, "bytes": 0})
            entry["count"] += 1
            entry["bytes"] += _nbytes(sent)
        return func(*args, **(kwargs or {}))

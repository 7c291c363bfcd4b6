"""The collectives one rank issues, counted with torch's own tooling: CommDebugMode, a dispatch mode scoped to
the block, extended with what it leaves out (point-to-point send/recv between pipeline stages) and with the
bytes each op sends. Nothing in torch.distributed is patched, so other threads are never counted."""
import torch
from torch.distributed.tensor.debug import CommDebugMode

# c10d op -> the torch.distributed call users know it by
OPS = {"allreduce_": "all_reduce", "allgather_": "all_gather", "_allgather_base_": "all_gather",
       "allgather_into_tensor_coalesced_": "all_gather", "gather_": "gather", "reduce_scatter_": "reduce_scatter",
       "_reduce_scatter_base_": "reduce_scatter", "broadcast_": "broadcast", "send": "send", "recv_": "recv"}


def _nbytes(value) -> int:
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, (list, tuple)):
        return sum(_nbytes(v) for v in value)
    return 0


class CollectiveCounter(CommDebugMode):
    """`with CollectiveCounter() as c:` ... `c.stats` is {op: {"count", "bytes"}}, bytes being the tensors this
    rank contributes (for recv: receives)."""

    def __init__(self):
        super().__init__()
        self.stats: dict[str, dict[str, int]] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        namespace, _, op = func._schema.name.partition("::")
        if namespace == "c10d" and op in OPS:
            names = [a.name for a in func._schema.arguments]
            sent = args[names.index("input_tensors")] if "input_tensors" in names else args[0]
            entry = self.stats.setdefault(OPS[op], {"count": 0, "bytes": 0})
            entry["count"] += 1
            entry["bytes"] += _nbytes(sent)
        return super().__torch_dispatch__(func, types, args, kwargs)

"""SGLang's attention data parallelism in the live model: each attention-DP group (attn_tp consecutive GPUs of
a stage) runs its own rows of the batch through attention; a layer cut over more GPUs than that group (the
MoE, a dense MLP, embedding or lm_head over the whole tp) runs every group's rows.

Before such a layer the groups' rows are gathered over the stage (SGLang's dp_gather; here an all_gather of
each GPU's rows, padded to the longest group's, read from each group's first GPU); after it, each group
takes its own rows back (dp_scatter: a local slice, since the layer's own all_reduce left every GPU the
whole batch). The MoE's dispatch is that gather (every GPU sees every token and runs the ones routed to its
experts) and its combine the all_reduce plus the slice.
"""
import torch
import torch.distributed as dist

from tpviz.layers import tp_group
from tpviz.live.model.config import Cuts


class DpRows:
    """One GPU's rows of the batch under attention DP; `shift` (the wrong-dp-rows injection) makes each group
    take the next group's rows back after a gathered layer."""

    def __init__(self, cuts: Cuts | None):
        self.dp = cuts.attn_dp if cuts else 1
        self.index = cuts.dp_index if cuts else 0
        self.attn_tp, self.tp = (cuts.widths.attention, cuts.tp) if cuts else (1, 1)
        self.counts: list[int] = []
        self.shift = False

    def begin(self, batch: int) -> None:
        """Split `batch` rows into dp groups of consecutive rows (the first groups one more when uneven)."""
        self.counts = [len(c) for c in torch.arange(batch).tensor_split(self.dp)]

    @property
    def start(self) -> int:
        return sum(self.counts[:self.index])

    def own(self, x: torch.Tensor) -> torch.Tensor:
        """This group's rows of a whole-batch tensor."""
        return x if self.dp == 1 else x[self.start:self.start + self.counts[self.index]]

    def gathers(self, width: int) -> bool:
        """Whether a layer cut `width` ways spans more than one attention-DP group."""
        return self.dp > 1 and width > self.attn_tp

    def gather(self, x: torch.Tensor | None, tail: tuple[int, ...] = (),
               like: torch.Tensor | None = None) -> torch.Tensor:
        """Every group's rows, in batch order, on every GPU of the stage; x None (a GPU that holds no copy,
        such as an lm_head rank that is not its group's first) sends zeros of shape [rows, *tail], in the
        dtype and on the device of `like`."""
        if self.dp == 1:
            return x
        most = max(self.counts)
        if x is None:
            x = like.new_zeros(self.counts[self.index], *tail)
        padded = x.new_zeros(most, *x.shape[1:])
        padded[:x.shape[0]] = x
        parts = [torch.empty_like(padded) for _ in range(self.tp)]
        dist.all_gather(parts, padded.contiguous(), group=tp_group(self.tp))
        return torch.cat([parts[g * self.attn_tp][:n] for g, n in enumerate(self.counts)])

    def scatter(self, y: torch.Tensor) -> torch.Tensor:
        """This group's rows of a gathered result (the next group's under the injection)."""
        if self.shift:
            y = y.roll(-self.counts[self.index], 0)
        return self.own(y)

    def run(self, layer, x: torch.Tensor, width: int) -> torch.Tensor:
        """layer(x) on this group's rows, gathering every group's rows first when the layer spans them."""
        if not self.gathers(width):
            return layer(x)
        return self.scatter(layer(self.gather(x)))

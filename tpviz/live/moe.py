"""Sparse MoE blocks (Mixtral, Qwen3-MoE) built from tpviz's TP layers, split the way vLLM splits them.

The router is a ReplicatedLinear, so every rank computes the same full routing. Each expert's gate_up is
column-split and its down row-split over moe_intermediate_size, with the down's own all_reduce off: a rank
weights and sums its partial expert outputs locally, and the block issues ONE all_reduce, like a dense MLP.

Under expert parallelism (vLLM 0.33 with dp 1: EP size = tp) a rank holds its placement's experts whole.
Every rank already has every token (attention ends in an all-reduce), so dispatch is local: each rank runs
the tokens routed to its own experts, and the combine is the same one all_reduce of the weighted sums.
"""
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from tpviz.layers import MergedColumnParallelLinear, ReplicatedLinear, RowParallelLinear, tp_group
from tpviz.spec import ModelSpec

# model_type -> (the block's checkpoint name, the expert down projection's name); gate/up load into gate_up_proj
MOE_FAMILIES = {"mixtral": ("block_sparse_moe", "w2"), "qwen3_moe": ("mlp", "down_proj")}


class Expert(nn.Module):
    """One SiLU-gated expert: gate_up column-parallel (merged), down row-parallel without its all_reduce."""

    def __init__(self, hidden_size: int, inter: int, tp_size: int, tp_rank: int, down_name: str):
        super().__init__()
        self.gate_up_proj = MergedColumnParallelLinear(hidden_size, [inter, inter], tp_size, tp_rank)
        down = RowParallelLinear(inter, hidden_size, tp_size, tp_rank)
        down.reduce_results = False  # the block reduces the weighted sum of all experts at once
        self.down_name = down_name
        self.add_module(down_name, down)  # Mixtral calls it w2: parameter names mirror the checkpoint

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, -1)
        return getattr(self, self.down_name)(F.silu(gate) * up)


def route(logits: torch.Tensor, top_k: int, renormalize: bool, keep_fp32: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights, expert ids), each [tokens, top_k]: fp32 softmax over all experts, top-k, then maybe renormalize."""
    probs = F.softmax(logits, dim=-1, dtype=torch.float32)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    # transformers: Mixtral keeps the weights in fp32, Qwen3-MoE casts them back to the logits' dtype
    return (weights if keep_fp32 else weights.to(logits.dtype)), ids


class SparseMoeBlock(nn.Module):
    """Replicated router -> this rank's slice of each chosen expert -> weighted local sum -> one all_reduce."""

    def __init__(self, spec: ModelSpec, norm_topk_prob: bool, tp_size: int, tp_rank: int,
                 experts: tuple[int, ...] | None = None):
        super().__init__()
        self.top_k, self.tp_size = spec.num_experts_per_tok, tp_size
        self.mixtral = spec.model_type == "mixtral"
        self.renormalize = self.mixtral or norm_topk_prob  # Mixtral always renormalizes the top-k
        self.gate = ReplicatedLinear(spec.hidden_size, spec.num_experts, tp_size, tp_rank)
        down_name = MOE_FAMILIES[spec.model_type][1]
        cut = (1, 0) if experts is not None else (tp_size, tp_rank)  # EP: whole experts, only this rank's
        ids = range(spec.num_experts) if experts is None else experts
        self.experts = nn.ModuleDict({str(e): Expert(spec.hidden_size, spec.moe_intermediate_size, *cut, down_name)
                                      for e in ids})  # keyed by global id: names stay experts.N.*
        self.reduce_results = True  # False (the skip-allreduce injection) leaves each rank its partial sum

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        weights, ids = route(self.gate(x), self.top_k, self.renormalize, keep_fp32=self.mixtral)
        out = torch.zeros_like(x)
        slots = ids.T  # [top_k, tokens]: where() then lists hits by (slot, token), as transformers does
        for e, expert in self.experts.items():
            slot, token = torch.where(slots == int(e))
            if token.numel() == 0:
                continue
            # as transformers' eager experts: weight, cast, index_add_ per expert (its default grouped_mm path
            # sums each token's top-k at once: the same up to rounding). Weighting a partial sum is exact.
            y = expert(x[token]) * weights[token, slot, None]
            out.index_add_(0, token, y.to(out.dtype))
        if self.reduce_results and (group := tp_group(self.tp_size)) is not None:
            dist.all_reduce(out, group=group)  # the block's only collective (expert downs skip theirs)
        return out.view(shape)

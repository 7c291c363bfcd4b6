"""Vocab-parallel embedding and lm_head: each rank holds a contiguous block of vocabulary rows.

The rule set pads the vocabulary first (vLLM: to a multiple of 64; nano-vllm never); padding rows come after
the real ones, are never loaded from disk, and are dropped from the gathered logits.
"""
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from tpviz.layers.linear import check_rows, copy_checked, tp_group
from tpviz.rules import RuleSet, check_tp, ruleset


class VocabParallelEmbedding(nn.Module):
    """weight [padded_vocab/tp, embedding_dim]; lookups outside this rank's rows give 0, then all-reduce."""

    def __init__(self, num_embeddings: int, embedding_dim: int, tp_size: int, tp_rank: int,
                 rules: RuleSet | str = "vllm", dtype: torch.dtype | None = None):
        super().__init__()
        check_tp(tp_size, tp_rank)
        self.tp_dim, self.tp_size, self.tp_rank, self.rules = 0, tp_size, tp_rank, ruleset(rules)
        self.org_vocab_size = num_embeddings
        self.num_embeddings_padded = self.rules.padded_vocab(num_embeddings, tp_size)
        self.num_embeddings_per_partition = self.rules.vocab_rows(num_embeddings, tp_size)
        self.vocab_start_idx = tp_rank * self.num_embeddings_per_partition
        self.vocab_end_idx = self.vocab_start_idx + self.num_embeddings_per_partition
        # zeros, so padding rows are harmless in the forward pass
        self.weight = nn.Parameter(torch.zeros(self.num_embeddings_per_partition, embedding_dim, dtype=dtype),
                                   requires_grad=False)
        self.weight.weight_loader = self.weight_loader

    @property
    def num_real_rows(self) -> int:
        """Rows of this rank that hold real vocabulary (the rest is padding)."""
        return max(0, min(self.vocab_end_idx, self.org_vocab_size) - self.vocab_start_idx)

    def weight_loader(self, param: nn.Parameter, loaded_weight: torch.Tensor):
        check_rows(loaded_weight, self.org_vocab_size, self.tp_dim)
        n = self.num_real_rows
        copy_checked(param.data.narrow(0, 0, n), loaded_weight.narrow(0,
                                                                      min(self.vocab_start_idx,
                                                                          self.org_vocab_size), n))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.tp_size == 1:
            return F.embedding(x, self.weight)
        mask = (x >= self.vocab_start_idx) & (x < self.vocab_end_idx)
        y = F.embedding(mask * (x - self.vocab_start_idx), self.weight)
        y = mask.unsqueeze(-1) * y
        if (group := tp_group(self.tp_size)) is not None:
            dist.all_reduce(y, group=group)
        return y


class ParallelLMHead(VocabParallelEmbedding):
    """Each rank computes logits for its vocabulary block; with a process group they are gathered to
    rank 0 (others get None). Without one, forward returns this rank's block, as in the seed's demos."""

    def __init__(self, num_embeddings: int, embedding_dim: int, tp_size: int, tp_rank: int,
                 rules: RuleSet | str = "vllm", dtype: torch.dtype | None = None, bias: bool = False):
        super().__init__(num_embeddings, embedding_dim, tp_size, tp_rank, rules, dtype)
        self.bias = None
        if bias:  # PhiMoE: a logit bias per vocabulary row, cut like the rows
            self.bias = nn.Parameter(torch.zeros(self.num_embeddings_per_partition, dtype=dtype),
                                     requires_grad=False)
            self.bias.weight_loader = self.weight_loader

    def forward(self, x: torch.Tensor) -> torch.Tensor | None:
        logits = F.linear(x, self.weight, self.bias)
        if (group := tp_group(self.tp_size)) is None:
            return logits[..., :self.org_vocab_size] if self.tp_size == 1 else logits
        parts = [torch.empty_like(logits) for _ in range(self.tp_size)] if self.tp_rank == 0 else None
        dist.gather(logits.contiguous(), parts, dst=dist.get_global_rank(group, 0), group=group)
        return torch.cat(parts, -1)[..., :self.org_vocab_size] if self.tp_rank == 0 else None

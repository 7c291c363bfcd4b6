"""The TP layer classes, with tp_size and tp_rank passed explicitly."""
from tpviz.layers.embed import ParallelLMHead, VocabParallelEmbedding
from tpviz.layers.linear import (ColumnParallelLinear, LinearBase,
                                 MergedColumnParallelLinear, QKVParallelLinear,
                                 ReplicatedLinear, RowParallelLinear, default_weight_loader, tp_group)
from tpviz.layers.norm import LayerNorm, RMSNorm
from tpviz.rules import divide

__all__ = ["divide", "LinearBase", "ReplicatedLinear", "ColumnParallelLinear", "RowParallelLinear",
           "MergedColumnParallelLinear", "QKVParallelLinear", "VocabParallelEmbedding", "ParallelLMHead",
           "RMSNorm", "LayerNorm", "default_weight_loader", "tp_group"]

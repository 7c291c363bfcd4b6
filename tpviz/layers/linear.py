"""nano-vllm's TP Linear family with tp_size/tp_rank passed explicitly, plus vLLM's extensions.

Weights are stored [out, in] (F.linear computes x @ W.T): column-parallel layers split dim 0
(whole output rows), row-parallel layers split dim 1 (input columns) and all-reduce.
"""
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from tpviz.errors import TPGroupError, WeightsError
from tpviz.layers import quantized
from tpviz.rules import RuleSet, check_tp, divide, ruleset


# this process's TP groups by width, when they are not the whole world: one pipeline stage's ranks, or
# SGLang's carved groups (blocks of consecutive ranks, so one width is one group for a rank)
_GROUPS: dict[int, "dist.ProcessGroup"] = {}


def use_tp_groups(groups: "dict[int, dist.ProcessGroup]") -> None:
    """The groups layers of each width reduce over ({} : the whole world is the only group)."""
    _GROUPS.clear()
    _GROUPS.update(groups)


def tp_group(tp_size: int) -> "dist.ProcessGroup | None":
    """The group a layer's collectives run on: None for tp=1 or outside a distributed run (one process tracing
    loaders or computing one rank's partial result); never a silent skip when no group of that size is
    up."""
    if tp_size == 1 or not (dist.is_available() and dist.is_initialized()):
        return None
    group = _GROUPS.get(tp_size) or (None if _GROUPS else dist.group.WORLD)
    if group is None or dist.get_world_size(group) != tp_size:
        have = sorted(_GROUPS) or [dist.get_world_size()]
        raise TPGroupError(f"layer has tp_size={tp_size} but the process group has "
                           f"{' or '.join(map(str, have))} ranks; start one rank per tp slice")
    return group


def copy_checked(param_data: torch.Tensor, loaded_weight: torch.Tensor) -> None:
    """param_data.copy_(loaded_weight), with a clear error instead of a broadcast or shape crash."""
    if tuple(param_data.shape) != tuple(loaded_weight.shape):
        raise WeightsError(f"checkpoint slice has shape {tuple(loaded_weight.shape)}, "
                           f"the parameter expects {tuple(param_data.shape)}")
    param_data.copy_(loaded_weight)


def default_weight_loader(param: nn.Parameter, loaded_weight: torch.Tensor) -> None:
    """Replicated parameters: every rank copies the whole tensor."""
    copy_checked(param.data, loaded_weight)


class LinearBase(nn.Module):
    """One weight table plus a loading hook; tp_dim is the dim it is split along (0, 1 or None)."""

    def __init__(self, input_size: int, output_size: int, tp_size: int, tp_rank: int,
                 bias: bool = False, tp_dim: int | None = None, dtype: torch.dtype | None = None,
                 quant: "quantized.QuantContext | None" = None):
        super().__init__()
        check_tp(tp_size, tp_rank)
        self.tp_dim, self.tp_size, self.tp_rank = tp_dim, tp_size, tp_rank
        self.output_size_per_partition = output_size
        # shapes are already this rank's: subclasses shrink output/input before calling us
        # the scheme's stored tensors (weight, scales, packed ints) instead of one weight
        if quant is not None:
            quantized.create(self, quant, self.partition_sizes(), input_size)
        else:
            self.weight = nn.Parameter(torch.empty(output_size, input_size, dtype=dtype), requires_grad=False)
            self.weight.weight_loader = self.weight_loader
        if bias:
            self.bias = nn.Parameter(torch.empty(output_size, dtype=dtype), requires_grad=False)
            self.bias.weight_loader = self.weight_loader
        else:
            self.register_parameter("bias", None)

    def weight_loader(self, param: nn.Parameter, loaded_weight: torch.Tensor):
        raise NotImplementedError

    def partition_sizes(self) -> list[int]:
        """This rank's logical output parts (one, or gate/up, or q/k/v)."""
        return [self.output_size_per_partition]

    def shard_index(self, shard_id) -> int:
        return 0

    def checkpoint_index(self, shard_id) -> int:
        return self.tp_rank

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError


class ReplicatedLinear(LinearBase):
    """Not split: every rank holds and computes the whole layer (MoE router, MLA down-projections)."""

    def __init__(self, input_size: int, output_size: int, tp_size: int = 1, tp_rank: int = 0,
                 bias: bool = False, dtype: torch.dtype | None = None, quant=None):
        super().__init__(input_size, output_size, tp_size, tp_rank, bias, None, dtype, quant)

    def weight_loader(self, param: nn.Parameter, loaded_weight: torch.Tensor):
        if hasattr(param, "qtensor"):
            return quantized.load(self, param, loaded_weight)
        copy_checked(param.data, loaded_weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


class ColumnParallelLinear(LinearBase):
    """Splits output rows: weight [output_size/tp, input_size]; input whole, output sharded, no comm."""

    def __init__(self, input_size: int, output_size: int, tp_size: int, tp_rank: int,
                 bias: bool = False, dtype: torch.dtype | None = None, quant=None):
        check_tp(tp_size, tp_rank)
        super().__init__(input_size, divide(output_size, tp_size, "output_size", generic=True), tp_size,
                         tp_rank, bias, 0, dtype, quant)

    def weight_loader(self, param: nn.Parameter, loaded_weight: torch.Tensor):
        if hasattr(param, "qtensor"):
            return quantized.load(self, param, loaded_weight)
        shard_size = param.size(self.tp_dim)  # out/tp
        start = self.tp_rank * shard_size
        if loaded_weight.size(self.tp_dim) != shard_size * self.tp_size:
            raise WeightsError(f"checkpoint tensor has {loaded_weight.size(self.tp_dim)} rows, "
                               f"expected {shard_size * self.tp_size}")
        copy_checked(param.data, loaded_weight.narrow(self.tp_dim, start, shard_size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


class RowParallelLinear(LinearBase):
    """Splits input columns: weight [output_size, input_size/tp]; each rank's partial sum is all-reduced.

    The bias is held whole on every rank but added on rank 0 only, so the sum counts it once.
    """

    def __init__(self, input_size: int, output_size: int, tp_size: int, tp_rank: int,
                 bias: bool = False, dtype: torch.dtype | None = None, quant=None):
        check_tp(tp_size, tp_rank)
        super().__init__(divide(input_size, tp_size, "input_size", generic=True), output_size, tp_size,
                         tp_rank, bias, 1, dtype, quant)
        self.reduce_results = True  # False skips the all_reduce (a bug the live check can inject)
        self.bias_on_all_ranks = False  # True adds the bias tp times (another injectable bug)

    def weight_loader(self, param: nn.Parameter, loaded_weight: torch.Tensor):
        if hasattr(param, "qtensor"):
            return quantized.load(self, param, loaded_weight)
        if param.data.ndim == 1:  # bias: the output dim is not split, copy it whole
            copy_checked(param.data, loaded_weight)
            return
        shard_size = param.size(self.tp_dim)  # in/tp
        if loaded_weight.ndim != 2 or loaded_weight.size(self.tp_dim) != shard_size * self.tp_size:
            raise WeightsError(f"checkpoint tensor has shape {tuple(loaded_weight.shape)}, "
                               f"expected {shard_size * self.tp_size} input columns")
        copy_checked(param.data, loaded_weight.narrow(self.tp_dim, self.tp_rank * shard_size, shard_size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        add_bias = self.tp_rank == 0 or self.bias_on_all_ranks
        y = F.linear(x, self.weight, self.bias if add_bias else None)
        if self.reduce_results and (group := tp_group(self.tp_size)) is not None:
            dist.all_reduce(y, group=group)
        return y


class MergedColumnParallelLinear(ColumnParallelLinear):
    """Several column-parallel projections in one table (gate_up_proj). Loading cuts twice:
    first which projection (its segment of the local table), then which rank (chunk of that projection)."""

    def __init__(self, input_size: int, output_sizes: list[int], tp_size: int, tp_rank: int,
                 bias: bool = False, dtype: torch.dtype | None = None, quant=None):
        check_tp(tp_size, tp_rank)
        self.output_sizes = list(output_sizes)
        for i, size in enumerate(self.output_sizes):
            divide(size, tp_size, f"output_sizes[{i}]", generic=True)
        super().__init__(input_size, sum(self.output_sizes), tp_size, tp_rank, bias, dtype, quant)

    def partition_sizes(self) -> list[int]:
        return [size // self.tp_size for size in self.output_sizes]

    def shard_index(self, shard_id) -> int:
        return int(shard_id)

    def shard_ids(self) -> list:
        return list(range(len(self.output_sizes)))

    def weight_loader(self, param: nn.Parameter, loaded_weight: torch.Tensor,
                      loaded_shard_id: int | tuple | None = None):
        if hasattr(param, "qtensor") and not isinstance(loaded_shard_id, tuple):
            return quantized.load(self, param, loaded_weight, loaded_shard_id)
        if loaded_shard_id is None or isinstance(loaded_shard_id, tuple):
            # fused on disk: all projections (Phi-3 gate_up_proj), or some of them (Qwen3.5's in_proj_qkv)
            ids = range(len(self.output_sizes)) if loaded_shard_id is None else loaded_shard_id
            for shard_id, part in zip(ids, split_fused(loaded_weight,
                                                       [self.output_sizes[i] for i in ids], self.tp_dim)):
                self.weight_loader(param, part, shard_id)
            return
        if not 0 <= loaded_shard_id < len(self.output_sizes):
            raise WeightsError(f"loaded_shard_id={loaded_shard_id} is not one of "
                               f"0..{len(self.output_sizes) - 1}")
        # cut 1: this projection's segment of the local table (offsets shrink by tp too)
        shard_offset = sum(self.output_sizes[:loaded_shard_id]) // self.tp_size
        shard_size = self.output_sizes[loaded_shard_id] // self.tp_size
        param_data = param.data.narrow(self.tp_dim, shard_offset, shard_size)
        # cut 2: this rank's chunk of the whole projection from disk
        check_rows(loaded_weight, self.output_sizes[loaded_shard_id], self.tp_dim)
        copy_checked(param_data, loaded_weight.chunk(self.tp_size, self.tp_dim)[self.tp_rank])


class QKVParallelLinear(ColumnParallelLinear):
    """q, k and v in one column-parallel table, split by heads. When tp_size exceeds the KV heads and the rule
    set replicates them (vLLM), each rank holds one KV head and rank r holds head r // (tp_size /
    num_kv_heads)."""

    def __init__(self, hidden_size: int, head_size: int, total_num_heads: int, total_num_kv_heads: int,
                 tp_size: int, tp_rank: int, bias: bool = False, rules: RuleSet | str = "vllm",
                 dtype: torch.dtype | None = None, quant=None):
        check_tp(tp_size, tp_rank)
        self.rules, self.head_size = ruleset(rules), head_size
        self.total_num_heads, self.total_num_kv_heads = total_num_heads, total_num_kv_heads
        self.num_heads = divide(total_num_heads, tp_size, "num_attention_heads")
        self.num_kv_heads, self.num_kv_head_replicas = self.rules.kv_split(total_num_kv_heads, tp_size)
        self.q_size, self.kv_size = self.num_heads * head_size, self.num_kv_heads * head_size
        self.wrong_kv_head = False  # True maps ranks to KV heads round-robin (an injectable bug)
        output_size = (self.num_heads + 2 * self.num_kv_heads) * head_size * tp_size
        super().__init__(hidden_size, output_size, tp_size, tp_rank, bias, dtype, quant)

    def partition_sizes(self) -> list[int]:
        return [self.q_size, self.kv_size, self.kv_size]

    def shard_index(self, shard_id) -> int:
        return "qkv".index(shard_id)

    def shard_ids(self) -> list:
        return list("qkv")

    def checkpoint_index(self, shard_id) -> int:
        return self.tp_rank if shard_id == "q" else self.kv_shard_index()

    def kv_shard_index(self) -> int:
        """Which block of num_kv_heads KV heads this rank holds."""
        if self.wrong_kv_head:
            return self.tp_rank % (self.tp_size // self.num_kv_head_replicas)
        return self.tp_rank // self.num_kv_head_replicas

    def weight_loader(self, param: nn.Parameter, loaded_weight: torch.Tensor,
                      loaded_shard_id: str | None = None):
        if hasattr(param, "qtensor"):
            return quantized.load(self, param, loaded_weight, loaded_shard_id)
        sizes = {"q": self.total_num_heads * self.head_size, "k": self.total_num_kv_heads * self.head_size}
        sizes["v"] = sizes["k"]
        if loaded_shard_id is None:  # fused on disk (Phi-3 qkv_proj): split by the total sizes
            for shard_id, part in zip("qkv", split_fused(loaded_weight, list(sizes.values()), self.tp_dim)):
                self.weight_loader(param, part, shard_id)
            return
        if loaded_shard_id not in sizes:
            raise WeightsError(f"loaded_shard_id={loaded_shard_id!r} is not one of 'q', 'k', 'v'")
        check_rows(loaded_weight, sizes[loaded_shard_id], self.tp_dim)
        # cut 1: q, k, v lie one after another in the local table
        if loaded_shard_id == "q":
            shard_offset, shard_size, index = 0, self.q_size, self.tp_rank
        else:
            shard_offset = self.q_size + (self.kv_size if loaded_shard_id == "v" else 0)
            shard_size, index = self.kv_size, self.kv_shard_index()
        param_data = param.data.narrow(self.tp_dim, shard_offset, shard_size)
        # cut 2: this rank's heads of the whole projection from disk
        copy_checked(param_data, loaded_weight.narrow(self.tp_dim, index * shard_size, shard_size))


def check_rows(loaded_weight: torch.Tensor, expected: int, dim: int) -> None:
    if loaded_weight.size(dim) != expected:
        raise WeightsError(f"checkpoint tensor has {loaded_weight.size(dim)} rows, expected {expected}")


def split_fused(loaded_weight: torch.Tensor, sizes: list[int], dim: int) -> tuple[torch.Tensor, ...]:
    """Split a tensor fused on disk into its projections by their total sizes."""
    check_rows(loaded_weight, sum(sizes), dim)
    return loaded_weight.split(sizes, dim)

"""Pipeline and expert parallelism as vLLM 0.33 lays them out.

Pipeline stages split the decoder layers (distributed/utils.py get_pp_indices); expert parallelism places
whole experts on the tp x dp GPUs of each stage (fused_moe/expert_map_manager.py determine_expert_map).
"""
import os
from dataclasses import dataclass

from tpviz.errors import TpvizError

PARTITION_ENV = "VLLM_PP_LAYER_PARTITION"
PLACEMENTS = ("linear", "round_robin")
EP_DENSE = "expert parallelism needs a MoE model; this one has no routed experts"
# nano-vllm's Config has tensor_parallel_size alone (and its LLMEngine spawns one process per tp rank)
NANO_TP_ONLY = ("nano-vllm runs tensor parallelism alone: no pipeline stages, data-parallel replicas or expert "
                "parallelism; vLLM rules have them")
NANO_PLAN = ("nano-vllm runs tensor parallelism alone, so its plan is one layout: every GPU in one tensor-parallel "
             "group; vLLM rules also plan pipeline stages, data-parallel replicas and expert parallelism")


def tp_only(rules: str) -> bool:
    """Whether the engine behind `rules` runs tensor parallelism alone (nano-vllm's Config)."""
    return rules == "nano-vllm"


class LayoutError(TpvizError):
    """A tp x pp x dp (x ep) layout that cannot exist for this model or GPU count."""


class DenseEPError(LayoutError):
    """Expert parallelism asked of a model without routed experts (EP_DENSE)."""


def engine_problem(layout: "Layout", rules: str) -> str | None:
    """What the engine behind `rules` cannot run about the layout's shape, else None."""
    if tp_only(rules) and (layout.pp > 1 or layout.dp > 1 or layout.ep):
        return NANO_TP_ONLY
    return None


@dataclass(frozen=True)
class Layout:
    """How the GPUs are used: tp GPUs per model replica stage, pp stages, dp replicas, experts whole (ep)."""
    tp: int
    pp: int = 1
    dp: int = 1
    ep: bool = False

    @classmethod
    def of(cls, lay: dict | None) -> "Layout | None":
        """The Layout of a tpviz.deploy.deployment.layout_map dict (None for none)."""
        return cls(lay["tp"], lay["pp"], lay["dp"], lay["ep"]) if lay else None

    @property
    def gpus(self) -> int:
        return self.tp * self.pp * self.dp

    @property
    def moe_tp(self) -> int:
        """How many ways each expert is cut: tp x dp without expert parallelism, 1 with it."""
        return 1 if self.ep else self.tp * self.dp

    @property
    def ep_size(self) -> int:
        return self.tp * self.dp if self.ep else 1

    @property
    def label(self) -> str:
        return f"TP {self.tp} × PP {self.pp} × DP {self.dp}" + (" + EP" if self.ep else "")


def pp_partition(num_layers: int, pp: int, override: str | None = None) -> list[int]:
    """Layers per stage: even, with the remainder on the stages before the last (vLLM's balance), or the
    VLLM_PP_LAYER_PARTITION override ("20,20,21")."""
    if pp < 1:
        raise LayoutError(f"pp={pp} must be at least 1")
    if pp > num_layers:
        raise LayoutError(f"pp={pp} is more pipeline stages than the model's {num_layers} layers")
    text = os.environ.get(PARTITION_ENV) if override is None else override
    if text:
        try:
            parts = [int(x) for x in text.split(",")]
        except ValueError:
            raise LayoutError(f"{PARTITION_ENV}={text!r} must be comma-separated layer counts") from None
        if len(parts) != pp:
            raise LayoutError(f"{PARTITION_ENV} has {len(parts)} stages but pp={pp}")
        if sum(parts) != num_layers or min(parts) < 0:
            raise LayoutError(f"{PARTITION_ENV} gives {sum(parts)} layers; the model has {num_layers}")
        return parts
    parts = [num_layers // pp] * pp
    for i in range(2, num_layers % pp + 2):
        parts[-i] += 1
    return parts


def stage_layers(num_layers: int, pp: int, override: str | None = None) -> list[list[int]]:
    """The decoder layers of each pipeline stage."""
    parts, start, out = pp_partition(num_layers, pp, override), 0, []
    for n in parts:
        out.append(list(range(start, start + n)))
        start += n
    return out


def placement_flag(placement: str | None, ep: bool) -> str:
    """A command line's --placement: it places whole experts, so only with --ep; linear when not given."""
    if placement is not None and not ep:
        raise LayoutError("--placement places whole experts under --ep: add --ep, or drop --placement")
    return placement or "linear"


def expert_placement(num_experts: int, ep_size: int, placement: str = "linear") -> list[list[int]]:
    """The global experts each EP rank holds: an even share, the first ranks one more when they do not divide."""
    if placement not in PLACEMENTS:
        raise LayoutError(f"expert placement {placement!r}: use one of {', '.join(PLACEMENTS)}")
    if ep_size < 1:
        raise LayoutError(f"ep_size={ep_size} must be at least 1")
    base, extra = divmod(num_experts, ep_size)
    out = []
    for rank in range(ep_size):
        if placement == "round_robin":
            out.append(list(range(rank, num_experts, ep_size)))
        else:
            start = rank * base + min(rank, extra)
            out.append(list(range(start, start + base + (1 if rank < extra else 0))))
    return out

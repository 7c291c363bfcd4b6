"""The checkpoint the plan describes: every concrete tensor name ('*' filled with layer and expert indices),
its shape on disk, and where it loads (the parameter and shard id: vLLM's stacked_params_mapping, as data).
Run live's random weights, its loading map and the checkpoint comparison all read these, so they cannot drift
apart."""
from dataclasses import dataclass

from tpviz.plan.core import ParamPlan, Source


@dataclass(frozen=True)
class Tensor:
    """One concrete checkpoint tensor: its name, shape on disk, and the parameter and shard it loads into."""
    name: str
    shape: tuple
    param: str
    shard_id: object
    plan: ParamPlan
    source: Source


def fill(name: str, layer: int | None, expert: int | None) -> str:
    """A plan name with its '*' filled: the first with the layer, the next with the expert."""
    if layer is not None:
        name = name.replace("*", str(layer), 1)
    return name if expert is None else name.replace("*", str(expert), 1)


def stacked(plan: ParamPlan, src: Source) -> bool:
    """Whether one checkpoint tensor holds all of a layer's experts (gpt-oss), not one per expert."""
    return bool(plan.experts) and src.name.count("*") < 2


def tensors(plans: list[ParamPlan], layers: int | None = None) -> list[Tensor]:
    """Every checkpoint tensor of the plan (of the first `layers` decoder layers when given)."""
    out = []
    for plan in plans:
        for src in plan.sources:
            experts = [None] if not plan.experts or stacked(plan, src) else range(plan.experts)
            shape = src.disk if src.disk is not None else (
                ((plan.experts,) + tuple(src.shape)) if stacked(plan, src) else tuple(src.shape))
            copies = plan.layers if plan.layers is not None else range(plan.blocks) if plan.blocks else [None]
            if plan.stored_at:  # each layer's copy stored under another layer's name (Zamba2's adapters)
                out += [Tensor(fill(src.name, a, b), shape, fill(plan.name, a, b), src.shard_id, plan, src)
                        for (a, b), i in zip(plan.stored_at, copies) if layers is None or i < layers]
                continue
            for i in copies:
                if layers is not None and plan.layers is not None and i >= layers:
                    continue
                for e in experts:
                    out.append(Tensor(fill(src.name, i, e), shape, fill(plan.name, i, e),
                                      src.shard_id, plan, src))
    return out

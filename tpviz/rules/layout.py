"""The shape of a deployment in tpviz's words: tp GPUs per stage, pp stages, dp replicas, experts kept whole
(ep).

Each rule set says what its engine does with the shape: the layer partition, the expert placement, how many
ways each weight is cut (RuleSet.widths), and how its own flags spell it (RuleSet.launch).
"""
from dataclasses import dataclass


@dataclass(frozen=True)
class Layout:
    """How the GPUs are used: tp GPUs per model replica stage, pp stages, dp replicas, experts whole (ep)."""
    tp: int
    pp: int = 1
    dp: int = 1
    ep: bool = False

    @property
    def gpus(self) -> int:
        return self.tp * self.pp * self.dp

    @property
    def label(self) -> str:
        return f"TP {self.tp} × PP {self.pp} × DP {self.dp}" + (" + EP" if self.ep else "")

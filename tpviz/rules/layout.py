"""The shape of a deployment in tpviz's words: tp GPUs per stage, pp stages, dp replicas, experts kept whole
(ep); and, for engines that carve them out of tp (SGLang), attention data parallelism and an EP size.

Each rule set says what its engine does with the shape: the layer partition, the expert placement, how many
ways each weight is cut (RuleSet.widths), and how its own flags spell it (RuleSet.launch).
"""
from dataclasses import dataclass, fields

# the fields only some engines have, with the defaults that leave a layout as plain TP x PP x DP
CARVED = {"attn_dp": 1, "ep_size": 1, "dense_tp1": False, "dp_lm_head": False, "shared_tp1": False}


@dataclass(frozen=True)
class Layout:
    """How the GPUs are used: tp GPUs per model replica stage, pp stages, dp replicas, experts whole (ep).

    Carved out of the tp GPUs (SGLang): attn_dp attention groups of tp / attn_dp GPUs each, and ep_size
    expert groups whose experts are cut tp / ep_size ways; dense_tp1 keeps the dense MLPs whole on every GPU
    (--moe-dense-tp-size 1), dp_lm_head cuts the lm_head over the attention group (--enable-dp-lm-head),
    shared_tp1 keeps the shared experts whole (SGLANG_SHARED_EXPERT_TP1=1)."""
    tp: int
    pp: int = 1
    dp: int = 1
    ep: bool = False
    attn_dp: int = 1
    ep_size: int = 1
    dense_tp1: bool = False
    dp_lm_head: bool = False
    shared_tp1: bool = False

    @property
    def gpus(self) -> int:
        return self.tp * self.pp * self.dp

    @property
    def expert_cut(self) -> int | None:
        """How many ways each routed expert is cut under expert parallelism: 1 with vLLM's (whole), tp /
        ep_size with SGLang's --ep; None without EP (the tp map's cut)."""
        return 1 if self.ep else self.tp // self.ep_size if self.ep_size > 1 else None

    @property
    def carved(self) -> dict:
        """The carved-out fields that differ from plain TP (for JSON and links)."""
        return {k: getattr(self, k) for k, v in CARVED.items() if getattr(self, k) != v}

    @property
    def label(self) -> str:
        out = f"TP {self.tp} × PP {self.pp} × DP {self.dp}" + (" + EP" if self.ep else "")
        extra = {"attn_dp": f"attn-DP {self.attn_dp}", "ep_size": f"EP {self.ep_size}",
                 "dense_tp1": "dense TP 1", "dp_lm_head": "DP lm_head", "shared_tp1": "shared TP 1"}
        return " · ".join([out] + [extra[k] for k in self.carved])

    @classmethod
    def from_dict(cls, d: dict) -> "Layout":
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})

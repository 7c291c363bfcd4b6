"""Injectable TP bugs, for teaching and debugging: each flips a flag the layer classes already carry."""
from dataclasses import asdict, dataclass

from torch import nn

from tpviz.layers import QKVParallelLinear, RowParallelLinear
from tpviz.live.errors import LiveError
from tpviz.live.model.blocks import GatheredRMSNorm
from tpviz.live.model.config import LiveConfig
from tpviz.live.model.dp import DpRows
from tpviz.live.model.moe import SparseMoeBlock
from tpviz.rules import ruleset

INJECTIONS = {
    "bias-all-ranks": "row-parallel layers add their bias on every rank, so the "
                      "all-reduce counts it tp times",
    "skip-allreduce": "row-parallel layers and MoE blocks skip their all_reduce, so each rank keeps only its "
                      "partial sum",
    "wrong-kv-head": "under KV-head replication, ranks take KV heads round-robin instead of r // replicas",
    "local-qk-norm": "whole-projection q/k norms (OLMo-2/3) normalize each rank's heads alone instead of "
                     "all-gathering q and k first",
    "wrong-dp-rows": "under SGLang's attention DP, each attention-DP group takes the next group's tokens "
                     "back after the MoE (and every layer that ran all groups' tokens)",
}


@dataclass
class Injection:
    """One injected bug and whether it can change this model's output at this tp (and why not)."""
    name: str
    description: str
    has_effect: bool
    reason: str

    def to_dict(self) -> dict:
        return asdict(self)


def check_injections(names: list[str] | None) -> list[str]:
    """Validate --inject names (duplicates dropped), raising one line for an unknown one."""
    out = []
    for name in names or []:
        if name not in INJECTIONS:
            raise LiveError(f"unknown inject {name!r}; use one of: {', '.join(INJECTIONS)}")
        if name not in out:
            out.append(name)
    return out


def describe_injections(names: list[str], cfg: LiveConfig, tp_size: int, attn_dp: int = 1) -> list[Injection]:
    """Say, before running, whether each injection can have any effect here (attn_dp: SGLang's attention-DP
    groups, whose attention is cut tp / attn_dp ways)."""
    s, out, att = cfg.spec, [], tp_size // attn_dp  # the attention's cut
    moe = [i for i in s.moe_layers if i < s.num_hidden_layers] if s.is_moe else []
    dense = [i for i in range(s.num_hidden_layers) if i not in moe]  # layers with a dense down_proj
    shared = bool(moe and s.shared_expert_intermediate_size)  # Qwen2-MoE, DeepSeek: summed before the reduce
    for name in check_injections(names):
        if tp_size == 1:
            effect, reason = False, "tp=1 has a single rank, so there is nothing to get wrong across ranks"
        elif name == "wrong-dp-rows":
            effect = attn_dp > 1
            reason = (f"the {attn_dp} attention-DP groups run their own rows and gather them for the "
                      "layers cut over the whole tp" if effect else
                      "without --attn-dp-size every GPU runs every row: there is no other group's row "
                      "to take")
        elif name == "bias-all-ranks":
            biased = [n for n, has in (("o_proj", cfg.o_bias), ("down_proj", cfg.mlp_bias and dense)) if has]
            effect = bool(biased)
            free = ("o_proj, down_proj, the experts and the shared experts are" if shared else
                    "o_proj, down_proj and the experts are" if moe else "o_proj and down_proj are")
            reason = (f"{' and '.join(biased)} carry a bias, added {tp_size} times" if effect else
                      f"no row-parallel layer here has a bias ({free} bias-free)")
        elif name == "local-qk-norm" and s.is_mla:
            norms = ("q_a_layernorm and kv_a_layernorm normalize" if s.q_lora_rank
                     else "kv_a_layernorm normalizes")
            effect, reason = False, (f"MLA has no per-head q/k norm: its {norms} latents every rank computes "
                                     "whole (replicated), so there is nothing to gather")
        elif name == "local-qk-norm":
            effect = s.qk_norm_full
            reason = ("q_norm and k_norm span all heads: each rank's variance covers "
                      f"only 1/{att} of them" if effect
                      else "this model has no q/k norm over the whole projection (none, or per head)")
        elif name == "skip-allreduce":
            block = "MoE-block (routed + shared expert)" if shared else "MoE-block"
            skipped = ["o_proj"] + (["down_proj"] if dense else []) + ([block] if moe else [])
            effect, reason = True, (f"{', '.join(skipped[:-1])} and {skipped[-1]} outputs stay partial sums "
                                    f"over 1/{tp_size} of the inputs")
        elif s.is_mla:
            effect, reason = (False,
                              ("MLA has no KV heads to replicate: every rank computes the whole latent KV "
                                     "(kv_a_proj_with_mqa) and expands k and v for its own "
                                     "query heads (kv_b_proj)"))
        else:
            _, replicas = ruleset(cfg.rules).kv_split(s.num_key_value_heads, att)
            right = [r // replicas for r in range(att)]
            wrong = [r % (att // replicas) for r in range(att)]
            effect = replicas > 1 and right != wrong
            if replicas == 1:
                reason = (f"num_key_value_heads={s.num_key_value_heads} splits evenly over tp={att}: "
                          "no KV head is replicated")
            elif not effect:
                reason = f"with {s.num_key_value_heads} KV head every rank holds the same one either way"
            else:
                reason = (f"each KV head is replicated on {replicas} ranks; "
                          f"rank KV heads become {wrong} instead of {right}")
        out.append(Injection(name, INJECTIONS[name], effect, reason))
    return out


def apply_injections(model: nn.Module, names: list[str]) -> None:
    """Flip the layers' bug flags; call before loading weights (wrong-kv-head changes what is loaded)."""
    for module in model.modules():
        # gpt-oss experts too
        if isinstance(module, RowParallelLinear) or hasattr(module, "bias_on_all_ranks"):
            module.bias_on_all_ranks |= "bias-all-ranks" in names
        if isinstance(module, (RowParallelLinear, SparseMoeBlock)):  # expert downs never reduce: stays False
            module.reduce_results &= "skip-allreduce" not in names
        if isinstance(module, QKVParallelLinear):
            module.wrong_kv_head |= "wrong-kv-head" in names
        if isinstance(module, GatheredRMSNorm):
            module.gather &= "local-qk-norm" not in names
    if isinstance(rows := getattr(model, "rows", None), DpRows):  # one object, shared by the layers
        rows.shift |= "wrong-dp-rows" in names

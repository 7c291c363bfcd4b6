"""Sparse MoE blocks (Mixtral, Qwen3-MoE, Qwen2-MoE, DeepSeek-V2/V3) built from tpviz's TP layers, split the
way vLLM splits them.

The router is a ReplicatedLinear, so every rank computes the same full routing. Each expert's gate_up is
column-split and its down row-split over moe_intermediate_size, with the down's own all_reduce off: a rank
weights and sums its partial expert outputs locally, and the block issues ONE all_reduce, like a dense MLP.
A shared expert (Qwen2-MoE's shared_expert, scaled by sigmoid(shared_expert_gate(x)); DeepSeek's
shared_experts) is a dense SiLU MLP split over TP the same way; vLLM 0.33 (FusedMoE with shared_experts, its
down built with reduce_results=False) adds its partial output to the routed partial sum before that one
all_reduce. The sigmoid gate is replicated and scales a partial sum, which the all_reduce sums exactly.

DeepSeek routes with grouped top-k (vLLM's grouped_topk, transformers' DeepseekV2/V3 routers): V2 takes
softmax scores, top-k over all experts ('greedy') or within the topk_group best of n_group groups by their
best score ('group_limited_greedy'); V3 takes sigmoid scores, ranks groups by the sum of their top two and
experts by score + e_score_correction_bias (a float32 per-expert bias that steers the choice, never the
weights); both scale the chosen weights by routed_scaling_factor, after an optional renormalization
(norm_topk_prob).

Under expert parallelism (vLLM 0.33 with dp 1: EP size = tp) a rank holds its placement's experts whole.
Every rank already has every token (attention ends in an all-reduce), so dispatch is local: each rank runs
the tokens routed to its own experts, and the combine is the same one all_reduce of the weighted sums. Shared
experts stay TP-split under EP, as in vLLM.
"""
import math

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from tpviz.layers import MergedColumnParallelLinear, ReplicatedLinear, RowParallelLinear, tp_group
from tpviz.layers.linear import default_weight_loader
from tpviz.live.errors import LiveError
from tpviz.live.check.routing import note as note_routing
from tpviz.config.spec import ModelSpec
from tpviz.live.model.config import Cuts



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


def route(logits: torch.Tensor, top_k: int, renormalize: bool, keep_fp32: bool,
          ids: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights, expert ids), each [tokens, top_k]: fp32 softmax over all experts, top-k (or the given ids),
    then maybe renormalize."""
    probs = F.softmax(logits, dim=-1, dtype=torch.float32)
    weights, ids = torch.topk(probs, top_k, dim=-1) if ids is None else (probs.gather(1, ids), ids)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    # transformers: Mixtral keeps the weights in fp32, Qwen3-MoE casts them back to the logits' dtype
    return (weights if keep_fp32 else weights.to(logits.dtype)), ids


class DeepseekGate(ReplicatedLinear):
    """DeepSeek's replicated router, computed in float32 as transformers does; V3's e_score_correction_bias
    stays float32 however the model is cast (vLLM keeps it so: it ranks scores that differ in the third
    digit)."""

    def __init__(self, hidden_size: int, num_experts: int, tp_size: int, tp_rank: int, correction_bias: bool):
        super().__init__(hidden_size, num_experts, tp_size, tp_rank)
        bias = nn.Parameter(torch.zeros(num_experts, dtype=torch.float32), requires_grad=False) \
            if correction_bias else None
        self.register_parameter("e_score_correction_bias", bias)
        if bias is not None:
            bias.weight_loader = default_weight_loader

    def _apply(self, fn, recurse=True):
        super()._apply(fn, recurse)
        b = self.e_score_correction_bias
        if b is not None and b.dtype != torch.float32:
            b.data = b.data.float()
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x.float(), self.weight.float())


def grouped_route(logits: torch.Tensor, bias: torch.Tensor | None, top_k: int, routing: dict,
                  renormalize: bool, seen: dict | None = None, ids: torch.Tensor | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """DeepSeek's (weights fp32, expert ids), each [tokens, top_k], from fp32 router logits (or the weights of
    the given ids); `seen` gets what decided the choice (for routing.note): the experts' scores, the groups'
    scores and the groups chosen."""
    scores = logits.sigmoid() if routing["scoring"] == "sigmoid" else logits.softmax(-1)
    choice = scores if bias is None else scores + bias  # the bias picks experts; the weights stay unbiased
    if seen is not None:
        seen["scores"] = choice
    if routing["grouped"]:
        tokens, experts = choice.shape
        per = experts // routing["n_group"]
        grouped = choice.view(tokens, routing["n_group"], per)
        group_scores = grouped.topk(2, dim=-1)[0].sum(-1) if bias is not None else grouped.amax(-1)
        best = torch.topk(group_scores, routing["topk_group"], dim=-1, sorted=False)[1]
        if seen is not None:
            seen.update(groups=group_scores, group_ids=best)
        keep = torch.zeros_like(group_scores).scatter_(1, best, 1).bool()
        choice = choice.masked_fill(~keep.repeat_interleave(per, 1), float("-inf"))
    if ids is None:
        ids = torch.topk(choice, top_k, dim=-1, sorted=False)[1]
    weights = scores.gather(1, ids)
    if renormalize:
        weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
    return weights * routing["routed_scaling_factor"], ids


def routing_config(spec: ModelSpec, raw: dict, notes: list[str]) -> dict:
    """DeepSeek's routing as the config says (transformers' defaults when a field is absent), checked in one
    LiveError line; {} for the softmax-top-k families."""
    if spec.arch.routing not in ("v2", "v3") or not spec.is_moe:
        return {}
    v3, E, k = spec.arch.routing == "v3", spec.num_experts, spec.num_experts_per_tok
    scoring, method = raw.get("scoring_func"), raw.get("topk_method")
    if v3 and (scoring or "sigmoid", method or "noaux_tc") != ("sigmoid", "noaux_tc"):
        raise LiveError(f"deepseek_v3 with scoring_func={scoring!r}, topk_method={method!r}: the "
                        "live check routes V3 as transformers does (sigmoid scores, e_score_correction_bias, "
                        "topk_method noaux_tc)")
    if v3 and not (scoring and method):
        notes.append("the config does not name scoring_func/topk_method: routed as "
                     "transformers' DeepseekV3 does (sigmoid + e_score_correction_bias); vLLM 0.33 "
                     "reads their absence as softmax without the bias")
    if not v3 and ((scoring or "softmax") != "softmax"
                   or (method or "greedy") not in ("greedy", "group_limited_greedy")):
        raise LiveError(f"deepseek_v2 with scoring_func={scoring!r}, topk_method={method!r}: "
                        "the live check runs softmax routing, topk_method greedy or group_limited_greedy")
    grouped = v3 or method == "group_limited_greedy"
    n_group, topk_group = raw.get("n_group") or 1, raw.get("topk_group") or 1
    for key, v in (("n_group", n_group), ("topk_group", topk_group)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise LiveError(f"{key}={v!r} must be a positive integer")
    if grouped:
        if E % n_group or (v3 and E // n_group < 2):
            raise LiveError(f"n_group={n_group} must divide the {E} routed experts"
                            + (" into groups of at least 2 (V3 ranks a group by its top two)" if v3 else ""))
        if topk_group > n_group or k > topk_group * (E // n_group):
            raise LiveError(f"topk_group={topk_group} of n_group={n_group} groups must hold the "
                            f"num_experts_per_tok={k} experts chosen")
    elif n_group > 1 and topk_group < n_group:
        notes.append("topk_method 'greedy' ignores n_group/topk_group, as transformers "
                     "and DeepSeek's code do (vLLM 0.33 would still limit tokens to the "
                     "topk_group best groups)")
    factor = raw.get("routed_scaling_factor")
    factor = (2.5 if v3 else 1.0) if factor is None else factor  # transformers' defaults
    if (isinstance(factor, bool) or not isinstance(factor, (int, float))
        or not (math.isfinite(factor) and factor > 0)):
        raise LiveError(f"routed_scaling_factor={factor!r} must be a positive number")
    if not v3 and raw.get("norm_topk_prob"):
        notes.append("norm_topk_prob: the top-k weights are renormalized, as vLLM and DeepSeek's code do "
                     "(transformers' DeepseekV2 ignores the flag)")
    return {"scoring": "sigmoid" if v3 else "softmax", "correction_bias": v3, "grouped": grouped,
            "n_group": n_group, "topk_group": topk_group, "routed_scaling_factor": float(factor)}


class SparseMoeBlock(nn.Module):
    """Replicated router -> this rank's slice of each chosen expert (+ the shared expert's slice) -> weighted
    local sum -> one all_reduce."""

    def __init__(self, spec: ModelSpec, norm_topk_prob: bool, tp_size: int, tp_rank: int,
                 experts: tuple[int, ...] | None = None, routing: dict | None = None,
                 cuts: Cuts | None = None):
        super().__init__()
        H, E = spec.hidden_size, spec.num_experts
        self.top_k, self.routing = spec.num_experts_per_tok, routing or None
        self.fp32 = spec.arch.routing == "fp32"  # Mixtral: softmax in float32, the top-k always renormalized
        self.renormalize = self.fp32 or norm_topk_prob
        self.gate = (DeepseekGate(H, E, tp_size, tp_rank, self.routing["correction_bias"]) if self.routing
                     else ReplicatedLinear(H, E, tp_size, tp_rank))
        names = spec.arch.names
        down_name = names.expert_down  # gate/up load into gate_up_proj
        # EP: whole experts, only this rank's; SGLang: this EP rank's experts, each cut moe_tp ways
        cut = cuts.of("experts") if cuts else (1, 0) if experts is not None else (tp_size, tp_rank)
        ids = range(E) if experts is None else experts
        self.experts = nn.ModuleDict({str(e): Expert(H, spec.moe_intermediate_size, *cut, down_name)
                                      for e in ids})  # keyed by global id: names stay experts.N.*
        self.shared_name = names.shared.rstrip(".") if spec.shared_expert_intermediate_size else None
        # SGLang: the block reduces over the whole stage; a shared expert cut over fewer GPUs (its own group,
        # or whole with SGLANG_SHARED_EXPERT_TP1) is reduced there and added after, so it counts once
        shared = cuts.of("shared") if cuts else (tp_size, tp_rank)
        self.tp_size = cuts.tp if cuts else tp_size
        self.shared_width = shared[0] if shared[0] < self.tp_size else None
        if self.shared_name:  # TP-split like a dense MLP, under EP too
            self.add_module(self.shared_name, Expert(H, spec.shared_expert_intermediate_size, *shared,
                                                     "down_proj"))
            self.shared_gate = names.shared_gate  # Qwen2-MoE: the shared expert scaled by a sigmoid gate
            if self.shared_gate:
                self.add_module(self.shared_gate, ReplicatedLinear(H, 1, tp_size, tp_rank))
        self.reduce_results = True  # False (the skip-allreduce injection) leaves each rank its partial sum

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        logits, seen = self.gate(x), {}
        if self.routing:
            bias = self.gate.e_score_correction_bias
            weights, ids = grouped_route(logits, bias, self.top_k, self.routing, self.renormalize, seen)
            if (forced := note_routing(self, ids=ids, **seen)) is not ids:  # the check's fp32 reference
                weights, ids = grouped_route(logits, bias, self.top_k, self.routing,
                                             self.renormalize, ids=forced)
        else:
            weights, ids = route(logits, self.top_k, self.renormalize, keep_fp32=self.fp32)
            # softmax keeps the logits' order: top-k ranks them
            if (forced := note_routing(self, logits, ids)) is not ids:
                weights, ids = route(logits, self.top_k, self.renormalize, keep_fp32=self.fp32, ids=forced)
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
        shared = None
        if self.shared_name:
            shared = getattr(self, self.shared_name)(x)
            if self.shared_gate:  # Qwen2-MoE: sigmoid of a replicated [1, hidden] linear
                shared = torch.sigmoid(getattr(self, self.shared_gate)(x)) * shared
            if self.shared_width is None:
                out, shared = out + shared, None
        if self.reduce_results and (group := tp_group(self.tp_size)) is not None:
            dist.all_reduce(out, group=group)  # the block's only collective (expert downs skip theirs)
        if shared is not None:  # cut over a narrower group than the block's (SGLang)
            if self.reduce_results and (group := tp_group(self.shared_width)) is not None:
                dist.all_reduce(shared, group=group)
            out = out + shared
        return out.view(shape)

"""The verdict: TP outputs against the single-device reference, stage by stage.

fp32 passes when max|Δlogit| <= 1e-4 (scaled by the logits when they exceed 1); bf16/fp16 pass when the gap
stays within NOISE_MULTIPLE times the noise floor (the low-precision tp=1 run against an fp32 tp=1 run). For
MoE models the first token TP routes to other experts is explained (routing.py): float noise at a near tie, or
not.
"""
import torch

from tpviz.live.check.results import LayerDiff
from tpviz.live.check.routing import (decide_before_flips, explain as explain_routing, max_abs,
                                      split as split_routing)

FP32_TOL = 1e-4
NOISE_MULTIPLE = 4.0  # correct TP lands near 1x the floor; measured bugs land at 25-40x
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def stage_limit(floor: float | None, scale: float) -> float:
    """A stage's tolerance: float32 (floor None) 1e-4 scaled by max(1, max|value|), else NOISE_MULTIPLE x
    floor."""
    return FP32_TOL * max(1.0, scale) if floor is None else NOISE_MULTIPLE * floor


def compare(tp_logits, tp_hidden, ref: dict, dtype: str) -> dict:
    """Verdict fields and per-stage diffs for TP outputs against the reference outputs, and for MoE models the
    first token TP routed to other experts (routing.explain: float noise at a near tie, or not)."""
    tp_hidden, tp_routes = split_routing(tp_hidden)
    ref_hidden, ref_routes = split_routing(ref["hidden"])
    stages = [*tp_hidden.items(), ("logits", tp_logits)]
    refs = {**ref_hidden, "logits": ref["logits"]}
    refs32 = {**ref["hidden32"], "logits": ref["logits32"]} if ref["logits32"] is not None else None
    eps = torch.finfo(DTYPES[dtype]).eps
    diffs, tol, rule = [], None, ""
    for name, value in stages:
        gap, scale = max_abs(value, refs[name]), float(refs[name].abs().max())
        # low precision: the floor is never 0, exact stages still round
        floor = None if refs32 is None else max(max_abs(refs[name], refs32[name]), eps * scale)
        limit = stage_limit(floor, scale)
        # `not gap <= limit` also catches NaN
        diffs.append(LayerDiff(name, gap, gap / scale if scale else gap, limit, floor, not gap <= limit))
        tol = limit
    logits_diff = diffs[-1]
    if refs32 is None:
        rule = f"float32: pass when max|Δlogit| <= {FP32_TOL:g} x max(1, max|logit|)"
    else:
        rule = (f"{dtype}: pass when max|Δlogit| <= {NOISE_MULTIPLE:g} x the noise floor (max|tp=1 {dtype} "
                f"- tp=1 float32 logits| = {logits_diff.floor:.3g}"
                + (f", the float32 run computing with the {dtype} run's experts" if ref_routes else "")
                + "); argmax agreement is reported, not required")
    agree = float((tp_logits.argmax(-1) == ref["logits"].argmax(-1)).float().mean())
    first = next((d.name for d in diffs if d.exceeds), None)
    hidden32, routes32 = split_routing(ref["hidden32"]) if refs32 is not None else (None, None)
    flip = explain_routing(tp_routes, ref_routes, routes32, diffs, tp_hidden, ref_hidden,
                           hidden32, eps, stage_limit)
    passed = not logits_diff.exceeds
    if flip is not None and flip.noise_explained and not passed:  # decide on what both runs compute alike
        passed = decide_before_flips(flip, tp_routes, ref_routes, tp_logits, ref["logits"], logits_diff.limit)
    return {"passed": passed, "tolerance": tol, "tolerance_rule": rule,
            "max_abs_diff": logits_diff.max_abs, "max_rel_diff": logits_diff.max_rel,
            "argmax_agreement": agree,
            "noise_floor": logits_diff.floor, "diverges_at": first, "layers": diffs, "routing": flip}

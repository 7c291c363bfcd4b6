"""Routing flips: when TP and tp=1 send a token to different experts, say whether float noise at a near tie
explains it, or a real mismatch does.

A top-k router is discontinuous: when a token's k-th and (k+1)-th scores are nearly tied, TP's different
reduction order (or bf16 rounding anywhere before the router) can swap them, and from there on the two runs
compute different things, so the stage gaps after it measure the swap, not TP. For the check's first forward
pass each MoE block records what its top-k ranked (router logits; DeepSeek: its biased scores and group
scores) and what it chose.

The same holds between the low-precision tp=1 run and its float32 twin that sets the noise floor: where they
route a token differently the "floor" holds a whole expert swap, large enough to hide a real TP bug (a skipped
all-reduce passed in bf16 that way). So the float32 reference follows the low-precision run's expert choice
(watch's follow) and the floor measures rounding alone.

At the first layer where TP's experts differ from tp=1's, the flip is float noise (and not a TP bug) only when
all four hold:
- every stage before the layer agrees within its tolerance;
- the layer's router scores agree within the same rule (so the router's input is right);
- the tokens routed alike agree within the layer's tolerance at its output (so its experts are right);
- every flipped token was a near tie: tp=1's margin between its k-th and (k+1)-th score is at most twice the
  score noise at that token (each of the two swapped scores can move by the noise: |tp=1 low precision -
  tp=1 float32| there, floored at one ulp; in float32 the fp32 tolerance).
When float noise explains the flip, the verdict is taken on the positions before the first flip of each batch
row (alike_prefix): under causal attention they never see a flipped token, and every layer routes them alike,
so TP and tp=1 compute the same thing there. Past a flip the two runs compute different things, so no
tolerance fits.
"""
import re

import torch

from tpviz.live.check.results import LayerDiff, RoutingFlip

ROUTE = "route."  # hidden-state keys that carry a layer's routing, not a stage: route.<layer>.<what>
LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")


def max_abs(a: torch.Tensor, b: torch.Tensor) -> float:
    """max|a - b| in float32 (0 for empty tensors): every gap the live check compares."""
    return float((a.float() - b.float()).abs().max()) if a.numel() else 0.0


def watch(model: torch.nn.Module, blocks: tuple[type, ...], follow: dict | None = None) -> None:
    """Ask every MoE block (an instance of `blocks`) to record its next forward pass's routing and, with
    follow={layer: ids}, to compute that pass with those experts instead of its own choice."""
    for name, m in model.named_modules():
        if isinstance(m, blocks):
            m.record_routing = True
            layer = LAYER.search(name + ".")
            m.forced_ids = (follow or {}).get(int(layer[1])) if layer else None


def note(block: torch.nn.Module, scores: torch.Tensor, ids: torch.Tensor,
         **extra: torch.Tensor) -> torch.Tensor:
    """Called by a block after it routes: keep the ranked scores [tokens, experts] (float32), its own choice
    [tokens, k] and any extra (DeepSeek: groups, group_ids), once, when watch() asked; return the ids to
    compute with: those watch() gave it to follow (this pass only), else its own."""
    if getattr(block, "record_routing", False):
        block.record_routing = False  # the first pass only: generation steps run without recording
        # to the CPU in collect(), after timing
        block.routing_record = {"scores": scores.float(), "ids": ids, **extra}
    forced, block.forced_ids = getattr(block, "forced_ids", None), None
    return ids if forced is None else forced.to(ids.device)


def collect(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The recorded routing as route.<layer>.<what> tensors (the block's record is dropped)."""
    out = {}
    for name, m in model.named_modules():
        record, layer = getattr(m, "routing_record", None), LAYER.search(name + ".")
        if isinstance(record, dict) and layer:
            out.update({f"{ROUTE}{layer[1]}.{k}": v.cpu() if k.endswith("ids") else v.float().cpu()
                        for k, v in record.items()})
            del m.routing_record
    return out


def split(hidden: dict) -> tuple[dict, dict[int, dict]]:
    """(the stage outputs, {layer: {what: tensor}} of the routing records among them)."""
    stages, routes = {}, {}
    for name, v in hidden.items():
        if name.startswith(ROUTE):
            layer, what = name[len(ROUTE):].split(".", 1)
            routes.setdefault(int(layer), {})[what] = v
        else:
            stages[name] = v
    return stages, routes


def alike_prefix(tp: dict[int, dict], ref: dict[int, dict], batch: int, seq: int) -> list[int]:
    """Per batch row: how many leading positions every MoE layer routes alike on TP and tp=1 (seq: all)."""
    cut = torch.full((batch,), seq)
    for layer in tp.keys() & ref.keys():
        flipped = (_chosen(tp[layer]["ids"]) != _chosen(ref[layer]["ids"])).any(-1).view(batch, seq)
        first = torch.where(flipped.any(-1), flipped.int().argmax(-1), torch.full((batch,), seq))
        cut = torch.minimum(cut, first)
    return cut.tolist()


def decide_before_flips(flip: RoutingFlip, tp: dict[int, dict], ref: dict[int, dict], tp_logits: torch.Tensor,
                        ref_logits: torch.Tensor, limit: float) -> bool:
    """The verdict on a noise-explained flip: max|Δlogit| over the positions before each row's first flip,
    held to `limit`. Every token meets every TP layer, so a bug shows in any row's alike positions; a row
    flipping at its first position has none and is left out; with no row left, no verdict can pass."""
    flip.prefix = alike_prefix(tp, ref, *tp_logits.shape[:2])
    rows = [(b, n) for b, n in enumerate(flip.prefix) if n > 0]
    if not rows:
        flip.explanation += (". Every row flips at its first position, so no position is "
                             "routed alike in every layer: give other ids, or run in float32")
        return False
    flip.prefix_gap = max(max_abs(tp_logits[b, :n], ref_logits[b, :n]) for b, n in rows)
    passed = flip.prefix_gap <= limit
    kept = ", ".join(f"row {b}: {n}" for b, n in rows)
    if left := [str(b) for b, n in enumerate(flip.prefix) if n == 0]:
        kept += f"; left out, flipping at the first position: row{'s' * (len(left) > 1)} {', '.join(left)}"
    flip.explanation += (". The verdict compares the positions before each row's first flip "
                         f"({kept}), which every layer routes alike: max|Δlogit| {flip.prefix_gap:.3g} "
                         f"{'<=' if passed else '>'} tol {limit:.3g}")
    return passed


def _chosen(ids: torch.Tensor) -> torch.Tensor:
    return ids.sort(-1).values  # a choice is a set: compare sorted rows


def _margin(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Per token: the k-th score minus the (k+1)-th (inf when nothing is left to swap in)."""
    if scores.shape[-1] <= k:
        return torch.full(scores.shape[:-1], float("inf"))
    top = scores.topk(k + 1, -1).values
    gap = top[:, k - 1] - top[:, k]
    return torch.where(torch.isfinite(top[:, k]), gap, torch.full_like(gap, float("inf")))


def _noise(scores: torch.Tensor, scores32: torch.Tensor | None, eps: float, limit) -> torch.Tensor:
    """Per token: how far float noise moves one score."""
    scale = scores.abs().amax(-1)
    if scores32 is None:  # float32: what the check tolerates
        return torch.tensor([limit(None, float(s)) for s in scale])
    return torch.maximum((scores - scores32).abs().amax(-1), eps * scale)


def _decisive(ref: dict, tp: dict, token: int, k: int) -> tuple[str, str, float]:
    """(what was ranked, its key, tp=1's margin) where the choice was decided: DeepSeek's group choice when TP
    took other groups, else the experts (within tp=1's groups)."""
    if "group_ids" in ref and not torch.equal(_chosen(ref["group_ids"][token]),
                                              _chosen(tp["group_ids"][token])):
        return "groups", "groups", float(_margin(ref["groups"][token:token + 1],
                                                 ref["group_ids"].shape[-1])[0])
    scores = ref["scores"][token:token + 1]
    if "group_ids" in ref:  # experts outside tp=1's groups were never candidates
        per = scores.shape[-1] // ref["groups"].shape[-1]
        keep = torch.zeros(ref["groups"].shape[-1], dtype=torch.bool)
        keep[ref["group_ids"][token]] = True
        scores = scores.masked_fill(~keep.repeat_interleave(per)[None], float("-inf"))
    return "experts", "scores", float(_margin(scores, k)[0])


def explain(tp: dict[int, dict], ref: dict[int, dict], ref32: dict[int, dict] | None, layers: list[LayerDiff],
            tp_hidden: dict, ref_hidden: dict, ref32_hidden: dict | None, eps: float,
            limit) -> RoutingFlip | None:
    """The first layer where TP's expert choice differs from tp=1's, and whether float noise at a near tie
    explains it (module docstring); None when every token is routed alike. `limit(floor, scale)` is the
    check's stage tolerance (floor None: float32); `layers` its stage diffs; the hidden dicts [batch, seq,
    hidden] per stage (ref32: the float32 reference, None in a float32 check)."""
    flips = {L: (_chosen(tp[L]["ids"]) != _chosen(ref[L]["ids"])).any(-1) for L in sorted(tp) if L in ref}
    flipped = [L for L, m in flips.items() if m.any()]
    if not flipped:
        return None
    L, mask = flipped[0], flips[flipped[0]]
    t, r, r32 = tp[L], ref[L], (ref32 or {}).get(L)
    k, seq = r["ids"].shape[-1], ref_hidden[f"layer {L}"].shape[1]
    tokens = mask.nonzero().flatten().tolist()
    rows = []  # (token, what, margin, noise) of each flipped token
    for token in tokens:
        what, key, margin = _decisive(r, t, token, k)
        noise = _noise(r[key][token:token + 1],
                       None if r32 is None else r32[key][token:token + 1], eps, limit)
        rows.append((token, what, margin, float(noise[0])))
    token, what, margin, noise = next((row for row in rows if row[2] > 2 * row[3]), rows[0])
    scale = float(r["scores"].abs().max())
    router_floor = None if r32 is None else max(max_abs(r["scores"], r32["scores"]), eps * scale)
    router_gap, router_limit = max_abs(t["scores"], r["scores"]), limit(router_floor, scale)
    name, names = f"layer {L}", [d.name for d in layers]
    before = next((d for d in layers[:names.index(name)] if d.exceeds), None)
    same = ~mask.view(-1, seq)  # [batch, seq]: the tokens routed alike at L
    alike_gap = alike_limit = 0.0  # every token flipped: none to compare
    if same.any():
        ours, theirs = tp_hidden[name][same], ref_hidden[name][same]
        alike_gap, scale = max_abs(ours, theirs), float(theirs.abs().max())
        floor = None if ref32_hidden is None else max(max_abs(theirs, ref32_hidden[name][same]), eps * scale)
        alike_limit = limit(floor, scale)
    b, p = divmod(token, seq)
    ref_ids, tp_ids = _chosen(r["ids"][token]).tolist(), _chosen(t["ids"][token]).tolist()
    where = (f"layer {L} (token {p} of batch row {b}: tp=1 chose experts {ref_ids}, TP {tp_ids}"
             + (", from other expert groups)" if what == "groups" else ")"))
    explained = False
    if before is not None:
        why = (f"routing differs in {where}, but {before.name} before it already exceeds its tolerance "
               f"({before.max_abs:.3g} > {before.limit:.3g}): a real mismatch upstream")
    elif not router_gap <= router_limit:
        why = (f"routing differs in {where}, but its router scores differ beyond noise "
               f"(max|Δ| {router_gap:.3g} > tol {router_limit:.3g}): a real mismatch before the router")
    elif not alike_gap <= alike_limit:
        why = (f"routing differs in {where}, and the tokens routed alike differ too (max|Δ| "
               f"{alike_gap:.3g} > tol {alike_limit:.3g}): a real mismatch in the layer")
    elif not margin <= 2 * noise:
        why = (f"routing differs with a clear margin in {where}: margin {margin:.3g} > 2 × noise "
               f"{noise:.3g}, a real mismatch")
    else:
        explained = True
        why = (f"routing flip at a near tie in {where}: margin {margin:.3g} <= 2 × noise "
               f"{noise:.3g}, so float noise picked a different expert, not a TP bug; the stages "
               "before it, its router scores and the tokens routed alike agree, and past it the two runs "
               "compute different things")
    n = len(tokens)
    why += (f"; {n} of {mask.numel()} tokens flipped there" if n > 1 else "") + (
        f"; later flips in layer{'s' * (len(flipped) > 2)} {', '.join(map(str, flipped[1:]))}"
        if len(flipped) > 1 else "")
    return RoutingFlip(L, b, p, what, ref_ids, tp_ids, margin, noise, n, flipped[1:],
                       router_gap, router_limit, alike_gap, alike_limit, explained, why)

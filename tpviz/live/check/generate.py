"""Greedy generation on TP and on one device, side by side, and where (and why) the two texts part.

Each step re-runs the whole forward pass on the growing sequence (no KV cache: live models are small). One
spawned group runs every step, so spawning is paid once: the last stage's TP rank 0 picks the argmax and
broadcasts it to all ranks. The tp=1 reference generates its own sequence in-process the same way; each run
follows its own picks. While the picks agree the two runs see the same input, so the last position's logits
are compared step by step; the step where they first differ is compared stage by stage on that common prefix,
and its top-logit margin is held against the noise floor: a flip is float noise only when rounding can move
it. Each run stops at the checkpoint's EOS token(s), on its own picks: one stopping where the other goes on is
a difference at that step like any other.
"""
import json
from pathlib import Path

import torch
import torch.distributed as dist

from tpviz.live.errors import IDS_FLAG, PROMPT_FLAG, LiveError
from tpviz.live.check.compare import compare
from tpviz.live.check.results import Generation, LayerDiff

MAX_NEW_TOKENS = 128  # each step re-runs the whole sequence on every rank and on tp=1


def check_generate(n, ids: torch.Tensor | None) -> int:
    """The number of new tokens to generate (0: none), checked against the input ids, or one line."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise LiveError(f"generate={n!r} must be a whole number of new tokens (0 for none)")
    if n == 0:
        return 0
    if n > MAX_NEW_TOKENS:
        raise LiveError(f"{n} new tokens is more than a live run generates (at most "
                        f"{MAX_NEW_TOKENS}: every step re-runs the whole sequence on every rank)")
    if ids is None:
        raise LiveError(f"generating text needs {PROMPT_FLAG} (a model with a tokenizer) or {IDS_FLAG} to "
                        "continue; random ids are checked without generating")
    if ids.shape[0] != 1:
        raise LiveError(f"generation continues one sequence: give one row of token ids, not {ids.shape[0]}")
    return n


def eos_token_ids(folder: Path | None) -> list[int]:
    """The checkpoint's EOS token id(s): generation_config.json's (what transformers' generate() stops at),
    else config.json's (or its text_config's); read as JSON, never as code. [] when neither names one."""
    for name in ("generation_config.json", "config.json"):
        try:
            raw = json.loads((folder / name).read_text()) if folder is not None else None
        except (OSError, ValueError):  # absent or unreadable: the next file says it, or nothing does
            continue
        if not isinstance(raw, dict):
            continue
        value = raw.get("eos_token_id")
        if value is None and isinstance(raw.get("text_config"), dict):
            value = raw["text_config"].get("eos_token_id")
        ids = [i for i in (value if isinstance(value, list) else [value])
               if isinstance(i, int) and not isinstance(i, bool) and i >= 0]
        if ids:
            return ids
    return []


def greedy_steps(forward, first: tuple, ids: torch.Tensor, n: int, *, keep: bool, leader: int | None,
                 ref_tokens=None, follow: list[int] | None = None, eos=()) -> dict[str, torch.Tensor]:
    """At most n greedy steps of one rank, stopping after a pick in `eos`. `forward(ids)` runs this rank's
    part of a forward pass (pipeline send/recv included) and `first` is step 0's (logits, hidden), already
    computed. The rank with the gathered logits picks the argmax (or `follow[s]`, to run on another run's
    sequence) and broadcasts it from global rank `leader` (None: one process, no group), so every rank stops
    together. When `ref_tokens()` (read on that rank) is given, the first step whose pick differs from it is
    kept whole: hidden states where `keep` (each stage's TP rank 0), logits on the picker. Returns gen.*
    tensors: tokens, each step's last-position logits and the diverging step."""
    out, tokens, last, refs, diverged = {}, [], [], None, -1
    logits, hidden = first
    for s in range(n if follow is None else min(n, len(follow))):
        if s:
            logits, hidden = forward(ids)
        pick = torch.zeros(2, dtype=torch.int64, device=ids.device)
        if logits is not None:
            row = logits[0, -1].float()
            last.append(row.cpu())
            pick[0] = int(row.argmax()) if follow is None else follow[s]
            if ref_tokens is not None and diverged < 0:
                refs = ref_tokens() if refs is None else refs
                pick[1] = int(int(pick[0]) != refs[s])  # equal picks so far: refs has not stopped yet
        if leader is not None:
            dist.broadcast(pick, src=leader)
        token = int(pick[0])
        tokens.append(token)
        if pick[1] and diverged < 0:
            diverged = s
            if s and keep:  # step 0's outputs are the check's own
                out.update({f"gen.hidden.{k}": v.float().cpu() for k, v in hidden.items()})
                if logits is not None:
                    out["gen.logits"] = logits.float().cpu()
        if token in eos:
            break
        ids = torch.cat([ids, ids.new_full((ids.shape[0], 1), token)], dim=1)
    if last:
        out.update({"gen.tokens": torch.tensor(tokens), "gen.last": torch.stack(last),
                    "gen.diverged": torch.tensor([diverged])})
    return out


def step_diffs(tp_last: torch.Tensor, ref_last: torch.Tensor, ref32_last: torch.Tensor | None,
               dtype: str) -> list[LayerDiff]:
    """Last-position logits of TP vs tp=1 at each step given (same input), under the check's own tolerance."""
    out = []
    for s in range(len(tp_last)):
        ref = {"logits": ref_last[s], "hidden": {}, "hidden32": {},
               "logits32": None if ref32_last is None else ref32_last[s]}
        diff = compare(tp_last[s], {}, ref, dtype)["layers"][-1]
        diff.name = f"new token #{s + 1}"
        out.append(diff)
    return out


def _token(decode, token: int) -> str:
    return json.dumps(decode([token]), ensure_ascii=False) if decode else f"#{token}"


def _within(steps: list[LayerDiff], dtype: str) -> str:
    """'the last position's logits stayed within 1.3× the bfloat16 noise floor' (or the float32
    tolerance)."""
    worst = max(s.max_abs for s in steps)
    if worst == 0:
        return "the last position's logits matched exactly"
    if steps[0].floor is not None:
        return ("the last position's logits stayed within "
                f"{max(s.max_abs / s.floor for s in steps):.2g}× the {dtype} noise floor")
    return (f"the last position's logits stayed within the float32 tolerance (largest max|Δlogit| "
            f"{worst:.3g})")


def _before(steps: list[LayerDiff], d: int, dtype: str) -> str:
    """How the logits compared on the steps before the first differing pick."""
    earlier = steps[:d]
    if not earlier:
        return ""
    if bad := next((s for s in earlier if s.exceeds), None):
        return (f"The logits already differ beyond tolerance at {bad.name} (max|Δlogit| {bad.max_abs:.3g} > "
                f"{bad.limit:.3g}) without changing the pick. ")
    return f"Up to new token #{d} {_within(earlier, dtype)}. "


def explain(steps: list[LayerDiff], tp_tokens: list[int], ref_tokens: list[int], ref_last: torch.Tensor,
            ref32_last: torch.Tensor | None, dtype: str, decode=None, first_stage: str | None = None,
            eos=()) -> dict:
    """Where the picks first differ and whether float noise explains it: tp=1's lead of its own pick over TP's
    at that position (the top-2 margin when TP took tp=1's runner-up) against the noise floor there. TP
    flipped the pair, so its logits moved by at least half that margin: the flip is noise exactly when that
    step's logits stay within tolerance (NOISE_MULTIPLE x the floor; float32: 1e-4 scaled)."""
    n = len(tp_tokens)
    d = next((s for s, (a, b) in enumerate(zip(tp_tokens, ref_tokens)) if a != b), None)
    if d is None:
        same = f"Identical for all {n} new tokens"
        if tp_tokens and tp_tokens[-1] in eos:
            same += f" (both stopped at EOS {_token(decode, tp_tokens[-1])})"
        if bad := next((s for s in steps if s.exceeds), None):
            text = (f"{same}, although the logits at {bad.name} differ by {bad.max_abs:.3g}, "
                    f"beyond the tolerance {bad.limit:.3g}: the picks survived a TP error.")
        else:
            text = f"{same}; {_within(steps, dtype)} at every step."
        return {"diverged_at": None, "margin": None, "floor": None, "noise_explained": None,
                "explanation": text}
    row, a, b, at = ref_last[d].float(), ref_tokens[d], tp_tokens[d], steps[d]
    margin = float(row[a] - row[b])
    rank = int((row > row[b]).sum()) + 1  # TP's pick among tp=1's logits (2: the runner-up)
    floor = at.floor
    pair = (f"tp=1's top two logits ({_token(decode, a)} {float(row[a]):.4g}, {_token(decode, b)} "
            f"{float(row[b]):.4g})" if rank == 2 else
            f"tp=1's top logit ({_token(decode, a)} {float(row[a]):.4g}) and TP's pick ({_token(decode, b)}, "
            f"tp=1's #{rank}, {float(row[b]):.4g})")
    alt = ""
    if ref32_last is not None and int(ref32_last[d].argmax()) == b:
        alt = f" (float32 tp=1 picks {_token(decode, b)} too)"
    where = f"At new token #{d + 1} {pair}"
    off = [s for s in steps[:d + 1] if s.exceeds]
    explained = not off and first_stage is None  # nothing at or before that step beyond tolerance
    scale = (f"below the {dtype} noise floor {floor:.3g} there" if floor is not None and margin <= floor else
             f"{margin / floor:.2g}× the {dtype} noise floor {floor:.3g} there" if floor is not None else
             f"{margin / at.limit:.3g}× the float32 tolerance {at.limit:.3g} there")
    if explained:
        text = (f"{_before(steps, d, dtype)}{where} differ by only {margin:.3g}, {scale}{alt}; "
                f"TP's logits there are within tolerance (max|Δlogit| {at.max_abs:.3g} <= "
                f"{at.limit:.3g}), so the flip is float noise, not a TP bug.")
    else:
        why = (f"TP's logits there are off by {at.max_abs:.3g}, beyond the tolerance {at.limit:.3g}"
               if at.exceeds else f"TP's forward pass is beyond tolerance at {first_stage or off[0].name}")
        stage = f" (first beyond tolerance at {first_stage})" if first_stage and at.exceeds else ""
        text = (f"{_before(steps, d, dtype)}{where} differ by {margin:.3g}, {scale}, but "
                f"{why}: the flip is NOT explained by float noise; look for a TP bug{stage}.")
    return {"diverged_at": d, "margin": margin, "floor": floor, "noise_explained": explained,
            "explanation": text}


def build_generation(n: int, prompt: list[int], tp: dict, ref: dict, dtype: str, layers: list[LayerDiff],
                     decode=None, eos: list[int] | None = None) -> Generation:
    """The Generation of a finished run: tp/ref are gen.* tensors (ref's "gen.last32" when low precision);
    `layers` the per-stage comparison at the diverging step (empty when the texts are identical); `eos` the
    token ids both runs stopped at."""
    tp_tokens, ref_tokens, eos = tp["gen.tokens"].tolist(), ref["gen.tokens"].tolist(), eos or []
    d = next((s for s, (a, b) in enumerate(zip(tp_tokens, ref_tokens)) if a != b), None)
    # the steps whose input both runs share (same length if equal)
    upto = len(tp_tokens) if d is None else d + 1
    ref32 = ref.get("gen.last32")
    steps = step_diffs(tp["gen.last"][:upto], ref["gen.last"][:upto],
                       None if ref32 is None else ref32[:upto], dtype)
    first_stage = next((x.name for x in layers if x.exceeds), None)
    why = explain(steps, tp_tokens, ref_tokens, ref["gen.last"], ref32, dtype, decode, first_stage, eos)
    text = (lambda ids: decode(ids)) if decode else (lambda ids: None)
    return Generation(new_tokens=n, prompt_ids=prompt, tp_tokens=tp_tokens,
                      ref_tokens=ref_tokens, steps=steps,
                      layers=layers, first_stage=first_stage, prompt_text=text(prompt),
                      tp_text=text(tp_tokens),
                      ref_text=text(ref_tokens), pieces=[decode([tp_tokens[d]]), decode([ref_tokens[d]])]
                      if decode and d is not None else None, eos_token_ids=eos,
                      tp_stopped_at_eos=bool(tp_tokens) and tp_tokens[-1] in eos,
                      ref_stopped_at_eos=bool(ref_tokens) and ref_tokens[-1] in eos, **why)

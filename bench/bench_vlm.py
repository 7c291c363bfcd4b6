"""Benchmark: shard_map time of the multimodal presets whose vision (or audio) tower tpviz maps (a script,
no timed test), at tp 8 and 16, against Qwen3-0.6B at the same tp. Targets as for text models: <= 100 ms per
call and no more than 3x Qwen3-0.6B. The tower adds one traced plan per distinct tower tensor (about 20), not
one per block.

    python bench/bench_vlm.py [--n 10] [--strict]

Every preset with a tower is timed, the largest VLMs people serve among them (Llama-4-Maverick-17B-128E,
Qwen3-VL-235B-A22B, Kimi-K2.5). Each line also gives the model's split tensors, each traced on every GPU: the
ratio follows their count against Qwen3-0.6B's (whole tensors are traced once), not the parameter count.
"""
import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
TARGET_MS, TARGET_RATIO = 100.0, 3.0
BASE = "Qwen/Qwen3-0.6B"
NAMED = ("meta-llama/Llama-4-Maverick-17B-128E-Instruct", "Qwen/Qwen3-VL-235B-A22B-Instruct")  # issue 25


def once(model, tp: int) -> float:
    from tpviz import shard_map
    t = time.perf_counter()
    shard_map(model, tp)
    return (time.perf_counter() - t) * 1000


def timed(model, tp: int, n: int) -> tuple[float, float]:
    """The median map time and the median of its ratios to Qwen3-0.6B timed just before each run: interleaved,
    so a shared machine's drift (Qwen3-0.6B's own median moves from 8 to 15 ms between runs here) cancels."""
    once(model, tp), once(BASE, tp)  # warm-up: imports, the config read, first-touch allocations
    times, ratios = [], []
    for _ in range(n):
        base = once(BASE, tp)
        times.append(once(model, tp))
        ratios.append(times[-1] / base)
    return statistics.median(times), statistics.median(ratios)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=10)
    ap.add_argument("--strict", action="store_true", help="exit 1 when a target is missed")
    args = ap.parse_args()
    import torch
    torch.set_num_threads(1)  # the probe tensors are tiny: threads only add contention
    from tpviz.config.sources import load_spec, presets
    from tpviz.errors import TpvizError
    from tpviz.plan import build_plan
    split = lambda model: sum(p.split for p in build_plan(load_spec(model)))  # noqa: E731
    towers = [name for name in presets() if (lambda s: s.tower or s.audio)(load_spec(name))]
    missed, named = False, {}
    for tp in (8, 16):
        print(f"tp {tp}: {BASE} {timed(BASE, tp, args.n)[0]:.1f} ms, {split(BASE)} split tensors")
        for name in towers:
            spec = load_spec(name)
            try:
                ms, ratio = timed(spec, tp, args.n)
            except TpvizError as e:  # Qwen2.5-VL-7B's 28 text heads: no tp 8
                print(f"  {name:<36} not mapped at tp {tp}: {e}")
                named[name, tp] = f"not mapped ({e})"
                continue
            ok = ms <= TARGET_MS and ratio <= TARGET_RATIO
            missed |= not ok
            if name in NAMED:
                named[name, tp] = f"{ms:.1f} ms, {ratio:.2f}x"
            depth = (spec.tower or spec.audio).depth
            print(f"  {name:<36} {ms:6.1f} ms  {ratio:4.2f}x Qwen3-0.6B  {split(name):3d} split tensors  "
                  f"tower {depth} blocks  {'ok' if ok else 'MISSED'} (targets {TARGET_MS:.0f} ms, "
                  f"{TARGET_RATIO:.0f}x)")
    print("the issue's named VLMs (Llama-4-Maverick or Qwen3-VL-235B, at tp 8 and 16):")
    for name in NAMED:
        print(f"  {name}: " + "; ".join(f"tp {tp} {named.get((name, tp), 'not mapped')}" for tp in (8, 16)))
    return 1 if missed and args.strict else 0


if __name__ == "__main__":
    sys.exit(main())

"""Benchmark of the planner (a script, not a timed test): every layout of N GPUs, with the traced maps it
needs to size them. Target: DeepSeek-V3 on 16 GPUs <= 3 s.

    python bench/bench_plan.py
"""
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tpviz.deploy.ranking import rank_layouts as plan  # noqa: E402
from tpviz.config.sources import load_spec  # noqa: E402

CASES = [("deepseek-ai/DeepSeek-V3", 16, 80), ("deepseek-ai/DeepSeek-V3", 8, 141),
         ("Qwen/Qwen3-235B-A22B-FP8", 16, 80),
         ("meta-llama/Llama-3.1-405B", 16, 80), ("Qwen/Qwen3-Next-80B-A3B-Thinking", 8, 80)]


def main() -> int:
    print(f"{'model':<36} {'GPUs':>4} {'layouts':>7} {'accepted':>8} {'total':>8} {'per layout':>11}")
    worst = 0.0
    for model, gpus, gib in CASES:
        spec = load_spec(model)
        t = time.perf_counter()
        rows = plan(spec, gpus, gib)
        dt = time.perf_counter() - t
        worst = max(worst, dt) if model == "deepseek-ai/DeepSeek-V3" and gpus == 16 else worst
        print(f"{model:<36} {gpus:>4} {len(rows):>7} {sum(r.problem is None for r in rows):>8} {dt:>7.2f}s "
              f"{dt / len(rows) * 1000:>8.1f} ms")
    print(f"  DeepSeek-V3 on 16 GPUs: {worst:.2f} s (target <= 3 s): {'OK' if worst <= 3 else 'MISSED'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

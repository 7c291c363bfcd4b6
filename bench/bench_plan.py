"""Benchmark of the planner (a script, not a timed test): every layout of N GPUs, sized from traced maps and
ranked by the speed bound. Targets on 2 cores: 16 GPUs <= 3 s and 64 GPUs <= 10 s, the spec read included
(a cold run: a fresh Sizer each time).

    python bench/bench_plan.py
"""
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tpviz.config.sources import load_spec  # noqa: E402
from tpviz.deploy.hardware import Topology, gpu_type  # noqa: E402
from tpviz.deploy.perf import Workload  # noqa: E402
from tpviz.deploy.ranking import rank_layouts  # noqa: E402
from tpviz.deploy.sizing import Sizer  # noqa: E402

MODELS = [("deepseek-ai/DeepSeek-V3", "h200"), ("Qwen/Qwen3-235B-A22B-FP8", "h100"),
          ("meta-llama/Llama-3.1-405B", "h100"), ("Qwen/Qwen3-Next-80B-A3B-Thinking", "b200")]
TARGETS = {16: 3.0, 64: 10.0}


def main() -> int:
    print(f"{'model':<36} {'GPUs':>4} {'layouts':>7} {'with bound':>10} {'total':>8} {'per layout':>11}")
    worst = {n: 0.0 for n in TARGETS}
    for model, gpu in MODELS:
        for gpus in (8, 16, 32, 64):
            t = time.perf_counter()
            g = gpu_type(gpu)
            rows = rank_layouts(load_spec(model), gpus, g.mem_gib, topology=Topology(g), workload=Workload())
            dt = time.perf_counter() - t
            if gpus in worst:
                worst[gpus] = max(worst[gpus], dt)
            print(f"{model:<36} {gpus:>4} {len(rows):>7} {sum(r.perf is not None for r in rows):>10} "
                  f"{dt:>7.2f}s {dt / len(rows) * 1000:>8.1f} ms")
    # the Plan page keeps one Sizer per model and engine: a goal or context change re-ranks from its cuts
    spec, g = load_spec("deepseek-ai/DeepSeek-V3"), gpu_type("h200")
    sizer = Sizer(spec)
    rank_layouts(spec, 16, g.mem_gib, sizer=sizer, topology=Topology(g), workload=Workload())
    t = time.perf_counter()
    for work in (Workload(2048, 512), Workload(2048, 512, 8, "latency"), Workload(8000, 1000, tpot_ms=50)):
        rank_layouts(spec, 16, g.mem_gib, sizer=sizer, topology=Topology(g), workload=work)
    change = (time.perf_counter() - t) / 3
    print(f"  goal or context change, DeepSeek-V3 on 16 GPUs, warm: {change:.2f} s (target <= 1 s): "
          f"{'OK' if change <= 1 else 'MISSED'}")
    for gpus, target in TARGETS.items():
        print(f"  slowest plan of {gpus} GPUs: {worst[gpus]:.2f} s (target <= {target:g} s, ratio "
              f"{worst[gpus] / target:.2f}): {'OK' if worst[gpus] <= target else 'MISSED'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

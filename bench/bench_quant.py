"""Benchmark of quantized maps and the valid table (a script, not a timed test).

Targets: DeepSeek-V3 (FP8 blocks) at tp 8 <= 100 ms per shard map; the full valid table (tp 1..64, every rule
set) <= 2 s per model.

    python bench/bench_quant.py [--n 10]
"""
import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tpviz import shard_map  # noqa: E402
from tpviz.trace.validity import valid_table  # noqa: E402

MODELS = ["deepseek-ai/DeepSeek-V3", "Qwen/Qwen3-235B-A22B-FP8", "openai/gpt-oss-120b",
          "nvidia/Qwen3-235B-A22B-FP4", "TheBloke/Llama-2-13B-chat-GPTQ", "nvidia/Llama-3.1-70B-Instruct-FP8"]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=10)
    args = p.parse_args()
    shard_map(MODELS[0], 8)  # warm-up: imports, presets
    print(f"{'model':<36} {'tensors':>7} {'tp':>3} {'map median':>11} {'valid table 1..64':>18}")
    worst_map = worst_table = 0.0
    for model in MODELS:
        rows = valid_table(model, 8)[1]
        tp = max(r.tp for r in rows if r.valid("vllm"))  # tp 8, or the largest valid below it (GPTQ: 4)
        times = []
        for _ in range(args.n):
            t = time.perf_counter()
            m = shard_map(model, tp)
            times.append((time.perf_counter() - t) * 1000)
        t = time.perf_counter()
        valid_table(model, 64)
        table = time.perf_counter() - t
        worst_map, worst_table = max(worst_map, statistics.median(times)), max(worst_table, table)
        print(f"{model:<36} {len(m.tensors):>7} {tp:>3} {statistics.median(times):>8.1f} ms {table:>16.2f} s")
    print(f"  slowest map: {worst_map:.1f} ms (target <= 100 ms): {'OK' if worst_map <= 100 else 'MISSED'}")
    print(f"  slowest valid table: {worst_table:.2f} s (target <= 2 s): "
          f"{'OK' if worst_table <= 2 else 'MISSED'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

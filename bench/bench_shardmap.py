"""Benchmark of tpviz.shard_map on the largest presets (a script, not a timed test).

For each model, a fresh Python process imports tpviz, makes one warm-up call, then times N in-process calls
(median, min, max) and measures peak memory two ways:
  - tracemalloc: peak of Python-level allocations during one call (torch's tensor storage is not traced);
  - RSS: growth of the process's peak resident set (ru_maxrss) over the warm-up and timed calls, which does
    include torch's buffers.
Targets: <= 100 ms per call, and every model (the hybrid and heterogeneous ones too) no more than 3x
Qwen3-0.6B.

    python bench/bench_shardmap.py [--tp 8] [--n 20] [--rules vllm] [--threads N] [--strict]

By default every model is measured twice: with torch's default thread count and with one thread (on a busy
machine torch's spinning worker threads can make the tiny probe tensors many times slower).

--strict exits 1 when a target is missed (the default only reports).
"""
import argparse
import importlib
import json
import os
import resource
import statistics
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODELS = ["meta-llama/Llama-3.1-405B", "deepseek-ai/DeepSeek-V3", "Qwen/Qwen3-30B-A3B",
          "mistralai/Mixtral-8x7B-v0.1", "meta-llama/Llama-3.1-70B",
          # hybrid and heterogeneous: the tracer runs once per distinct layer kind, not per layer
          "Qwen/Qwen3-Next-80B-A3B-Thinking", "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16",
          "nvidia/Nemotron-H-56B-Base-8K",
          "nvidia/Llama-3_3-Nemotron-Super-49B-v1", "meta-llama/Llama-4-Scout-17B-16E-Instruct",
          "google/gemma-4-31B-it", "LiquidAI/LFM2.5-VL-1.6B", "bigscience/bloom-560m", "Qwen/Qwen3-0.6B"]
TARGET_MS, TARGET_RATIO = 100.0, 3.0


def max_rss_kib() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux


def measure(model: str, tp: int, n: int, rules: str, threads: int) -> dict:
    """Runs inside the child process: one model, in-process calls."""
    sys.path.insert(0, str(ROOT))
    import torch

    importlib.import_module("tpviz.trace.tracer")  # torch and the layers, imported before the baseline
    from tpviz import shard_map
    if threads:
        torch.set_num_threads(threads)
    rss0 = max_rss_kib()
    m = shard_map(model, tp, rules)  # warm-up: imports, preset cache, first-touch allocations
    times = []
    for _ in range(n):
        t = time.perf_counter()
        shard_map(model, tp, rules)
        times.append((time.perf_counter() - t) * 1000)
    tracemalloc.start()
    shard_map(model, tp, rules)
    _, py_peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return {"model": model, "threads": torch.get_num_threads(), "median_ms": statistics.median(times),
            "min_ms": min(times), "max_ms": max(times),
            "tracemalloc_peak_kib": py_peak / 1024, "rss_growth_kib": max_rss_kib() - rss0,
            "tensors": len(m.tensors), "params_b": m.total_weight_bytes / m.model_dtype_bytes / 1e9}


def run_child(model: str, args, threads: int) -> dict:
    cmd = [sys.executable, __file__, "--child", model, "--tp", str(args.tp), "--n", str(args.n),
           "--rules", args.rules, "--threads", str(threads)]
    out = subprocess.run(cmd, capture_output=True, text=True,
                         env={**os.environ, "HF_HUB_OFFLINE": "1"}, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def one_pass(args, threads: int) -> tuple[bool, bool]:
    rows = {}
    for model in MODELS:
        r = rows[model] = run_child(model, args, threads)
        print(f"{model:<42} {r['params_b']:>7.1f}B {r['tensors']:>7} {r['threads']:>7} "
              f"{r['median_ms']:>7.1f}ms {r['min_ms']:>6.1f}ms {r['max_ms']:>6.1f}ms "
              f"{r['tracemalloc_peak_kib'] / 1024:>13.2f}MiB {r['rss_growth_kib'] / 1024:>8.1f}MiB")
    worst = max(rows.values(), key=lambda r: r["median_ms"])
    ratio = worst["median_ms"] / rows["Qwen/Qwen3-0.6B"]["median_ms"]
    ok_time, ok_ratio = worst["median_ms"] <= TARGET_MS, ratio <= TARGET_RATIO
    print(f"  slowest: {worst['model']} {worst['median_ms']:.1f} ms (target <= {TARGET_MS:.0f} ms): "
          f"{'OK' if ok_time else 'MISSED'}")
    print(f"  {worst['model']} / Qwen3-0.6B time ratio: {ratio:.2f}x (target <= {TARGET_RATIO:.0f}x): "
          f"{'OK' if ok_ratio else 'MISSED'}")
    return ok_time, ok_ratio


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tp", type=int, default=8)
    p.add_argument("--n", type=int, default=20, help="timed calls per model (after one warm-up call)")
    p.add_argument("--rules", default="vllm")
    p.add_argument("--strict", action="store_true", help="exit 1 when a target is missed")
    p.add_argument("--threads", type=int, default=None,
                   help="torch threads in the timed process (default: run once with torch's "
                        "default, once with 1)")
    p.add_argument("--child", metavar="MODEL", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(measure(args.child, args.tp, args.n, args.rules, args.threads or 0)))
        return 0
    print(f"shard_map at tp={args.tp}, rules={args.rules}: median of {args.n} in-process "
          f"calls after a warm-up; python {sys.version.split()[0]}, {os.cpu_count()} CPUs")
    print(f"{'model':<42} {'params':>8} {'tensors':>7} {'threads':>7} {'median':>9} {'min':>8} {'max':>8} "
          f"{'tracemalloc peak':>16} {'RSS growth':>11}")
    ok = True
    for threads in ([args.threads] if args.threads is not None else [0, 1]):
        print(f"-- torch threads: {threads or 'default'}")
        ok_time, ok_ratio = one_pass(args, threads)
        ok = ok and ok_time and ok_ratio
    return 0 if ok or not args.strict else 1


if __name__ == "__main__":
    sys.exit(main())

"""Start-up cost (a script, not a timed test): what a user waits for before the first answer.

  - `python -m tpviz map PRESET --tp 8` end to end, in a fresh process (median of N): with the config's
    transformers reading already stored in the cache (as on every run after the first), and without it (the
    first run on a machine, or a config never read: transformers' config classes are imported);
  - `import tpviz` alone, and with the config readers (transformers' config classes are imported lazily);
  - the app's first load: a fresh process running app.py once through Streamlit's AppTest (imports included);
  - the map time of the 405B and DeepSeek-V3 presets at tp 8 and 16, warm, in-process (median of N).

    python bench/bench_startup.py [--n 5]
"""
import argparse
import statistics
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PRESET = "meta-llama/Llama-3.1-8B"
BIG = ("meta-llama/Llama-3.1-405B", "deepseek-ai/DeepSeek-V3")


def wall(cmd: list[str], n: int, cold: bool = False) -> float:
    """Median seconds of n fresh runs of cmd (its output discarded; a failure stops the bench); cold: each
    with an empty tpviz cache."""
    times = []
    for _ in range(n):
        env = {**os.environ, "TPVIZ_CACHE": tempfile.mkdtemp(prefix="tpviz-bench-")} if cold else None
        t = time.perf_counter()
        subprocess.run(cmd, cwd=ROOT, check=True, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, env=env)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


APP_FIRST_LOAD = """
import time; t = time.perf_counter()
from streamlit.testing.v1 import AppTest
at = AppTest.from_file("app.py", default_timeout=300).run()
assert not at.exception, at.exception
print(time.perf_counter() - t)
"""

MAP_TIMES = """
import statistics, sys, time, torch
torch.set_num_threads(1)
from tpviz import shard_map
for model in sys.argv[2:]:
    for tp in (8, 16):
        shard_map(model, tp)
        times = []
        for _ in range(int(sys.argv[1])):
            t = time.perf_counter(); shard_map(model, tp); times.append(time.perf_counter() - t)
        print(f"  map {model} tp {tp}: {statistics.median(times) * 1000:.0f} ms")
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=5)
    n = ap.parse_args().n
    py = sys.executable
    print(f"start-up (median of {n} fresh processes):")
    cmd = [py, "-m", "tpviz", "map", PRESET, "--tp", "8"]
    subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True)  # its config's reading is stored
    print(f"  python -m tpviz map {PRESET} --tp 8: {wall(cmd, n):.2f} s "
          f"(config never read before: {wall(cmd, n, cold=True):.2f} s)")
    print(f"  import tpviz: {wall([py, '-c', 'import tpviz'], n):.2f} s")
    print(f"  python -c 'import torch' (the floor): {wall([py, '-c', 'import torch'], n):.2f} s")
    loads = [float(subprocess.run([py, "-c", APP_FIRST_LOAD], cwd=ROOT, check=True, capture_output=True,
                                  text=True).stdout.split()[-1]) for _ in range(max(1, n // 2))]
    print(f"  app first load (AppTest, fresh process, imports included): {statistics.median(loads):.2f} s")
    print("map time, warm, one thread:")
    out = subprocess.run([py, "-c", MAP_TIMES, str(max(3, n)), *BIG], cwd=ROOT, check=True,
                         capture_output=True, text=True).stdout
    print(out.rstrip())


if __name__ == "__main__":
    main()

"""SGLang beside vLLM (a script, not a timed test): `plan` under each engine and `compare` of both, for
DeepSeek-V3 and Qwen3-235B-A22B-FP8 on 8 and 16 GPUs of 141 GiB (H200), with the time each takes and the best
layout each engine ranks first.

    python bench/bench_sglang.py
"""
import time

import torch

from tpviz import load_spec
from tpviz.deploy.equivalent import compare
from tpviz.deploy.ranking import rank_layouts
from tpviz.render.text import fmt_bytes

MODELS = ("deepseek-ai/DeepSeek-V3", "Qwen/Qwen3-235B-A22B-FP8")
GIB = 141.0


def timed(fn):
    t = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t


def main() -> None:
    torch.set_num_threads(1)
    for model in MODELS:
        spec = load_spec(model)
        for gpus in (8, 16):
            for rules in ("vllm", "sglang"):
                rows, s = timed(lambda: rank_layouts(spec, gpus, GIB, rules))
                best = rows[0]
                print(f"plan {model} {gpus} GPUs {rules:<6}: {s:6.2f} s, {len(rows)} layouts, best "
                      f"{best.layout.label} ({fmt_bytes(best.weights)}/GPU, "
                      f"{best.max_sequences:,} sequences)")
            pairs, s = timed(lambda: compare(spec, gpus, GIB))
            both = sum(1 for a, b in pairs if a and b)
            print(f"compare {model} {gpus} GPUs: {s:6.2f} s, {len(pairs)} rows, {both} the "
                  "same in both engines")


if __name__ == "__main__":
    main()

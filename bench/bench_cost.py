"""Worst-case cost of a shard map: sizes at the plausibility limits, on real architectures (a script).

Every preset base below gets each size key set to its limit (spec.LIMITS, MAX_DIM), one at a time and all
together, at tp 1, 2, 8 and 64. A config that passes validation must map within 2 s and 300 MB of extra
peak memory (Linux: the peak RSS is reset before each call). Prints each case and the worst found.

    python bench/bench_cost.py [--strict]
"""
import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.helpers.cost import measure  # noqa: E402
from tpviz import shard_map  # noqa: E402
from tpviz.config.sources import presets  # noqa: E402
from tpviz.config.fields import MAX_DIM
from tpviz.config.spec import LIMITS

BASES = ["Qwen/Qwen3-8B", "Qwen/Qwen3-30B-A3B", "deepseek-ai/DeepSeek-V3", "openai/gpt-oss-120b",
         "meta-llama/Llama-3.1-405B"]
KEYS = {"vocab_size": LIMITS["vocab_size"], "hidden_size": LIMITS["hidden_size"],
        "intermediate_size": MAX_DIM, "moe_intermediate_size": MAX_DIM, "num_experts": LIMITS["num_experts"],
        "n_routed_experts": LIMITS["num_experts"], "num_local_experts": LIMITS["num_experts"],
        "num_hidden_layers": LIMITS["num_hidden_layers"]}
TIME_S, MEMORY_MB = 2.0, 300.0


def cases():
    for base in BASES:
        cfg = presets()[base]
        keys = [k for k in KEYS if k in cfg]
        for chosen in [[k] for k in keys] + [keys]:
            yield f"{base} {'+'.join(chosen) if len(chosen) == 1 else 'all at limits'}", \
                dict(json.loads(json.dumps(cfg)), **{k: KEYS[k] for k in chosen})


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--strict", action="store_true", help="exit 1 when the bound is missed")
    args = ap.parse_args()
    shard_map(presets()["Qwen/Qwen3-0.6B"], 1)  # imports and first-call set-up are not the map's cost
    worst_t, worst_m, n, refused = (0.0, ""), (0.0, ""), 0, 0
    for name, cfg in cases():
        for tp in (1, 2, 8, 64):
            took, grew, out = measure(lambda: shard_map(cfg, tp))
            n, refused = n + 1, refused + isinstance(out, ValueError)
            what = f"refused: {str(out)[:70]}" if isinstance(out, ValueError) else "mapped"
            print(f"{name:55s} tp={tp:<3d} {took * 1e3:8.1f} ms "
                  f"{grew if grew is not None else float('nan'):7.1f} MB  {what}")
            worst_t = max(worst_t, (took, f"{name} tp={tp}"))
            worst_m = max(worst_m, (grew or 0.0, f"{name} tp={tp}"))
    print(f"\n{n} cases ({refused} refused in one line): worst time {worst_t[0]:.2f} s ({worst_t[1]}), "
          f"worst extra peak memory {worst_m[0]:.0f} MB ({worst_m[1]})")
    ok = worst_t[0] <= TIME_S and worst_m[0] <= MEMORY_MB
    print(f"target: <= {TIME_S:g} s and <= {MEMORY_MB:g} MB: {'met' if ok else 'MISSED'}")
    return 1 if args.strict and not ok else 0


if __name__ == "__main__":
    sys.exit(main())

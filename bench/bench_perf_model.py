"""The speed bound beside published measurements (bench/data/perf_measurements.json, each with its source):
for each, the bound, the measured value and their ratio (measured / bound for rates, bound / measured for
times: above 1 the bound is beaten, which would mean the model is wrong); then, for each set of layouts of
one model, GPU and workload, whether the bound orders them per GPU as the measurements do; and the median
ratio, the efficiency the UI states.

    python bench/bench_perf_model.py
"""
import sys
from collections import defaultdict
from itertools import combinations
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tpviz.deploy.calibration import HIGHER_IS_BETTER, check, efficiency, measurements  # noqa: E402
from tpviz.deploy.perf import EFFICIENCY  # noqa: E402


def per_gpu(c, value: float) -> float:
    return value / c.m["gpus"] if c.m["metric"] == "out_tok_s" else value


def main() -> int:
    checked = [check(m) for m in measurements()]
    print(f"{'measurement':<48} {'metric':<18} {'measured':>10} {'bound':>10} {'ratio':>6}  layout")
    for c in checked:
        print(f"{c.m['id'][:48]:<48} {c.m['metric']:<18} {c.m['value']:>10,.1f} {c.bound:>10,.1f} "
              f"{c.ratio:>6.2f}  {c.layout}")
    beaten = [c for c in checked if c.ratio > 1]
    sets = defaultdict(list)  # one model, GPU, engine and workload, several layouts
    for c in checked:
        if c.m["metric"] in HIGHER_IS_BETTER:
            m = c.m
            sets[(m["model"], m["dtype"], m["gpu"], m["engine"], m["input_len"], m["output_len"],
                  str(m["concurrency"]), m["source"])].append(c)
    agree = total = 0
    print("\nlayout order per GPU (measured vs bound), sets of two or more layouts:")
    for key, group in sets.items():
        if len(group) < 2:
            continue
        pairs = [(a, b) for a, b in combinations(group, 2)
                 if per_gpu(a, a.m["value"]) != per_gpu(b, b.m["value"])]
        same = sum((per_gpu(a, a.m["value"]) > per_gpu(b, b.m["value"]))
                   == (per_gpu(a, a.bound) > per_gpu(b, b.bound)) for a, b in pairs)
        agree, total = agree + same, total + len(pairs)
        sides = ", ".join(f"{c.layout} {per_gpu(c, c.m['value']):,.0f}/{per_gpu(c, c.bound):,.0f}"
                          for c in group)
        print(f"  {key[0]} {key[1]} on {key[2]} ({key[3]}, {key[4]}/{key[5]}): {same}/{len(pairs)} pairs "
              f"in the same order: {sides}")
    median = efficiency(checked)
    print(f"\n{len(checked)} measurements; bound beaten by {len(beaten)} (target 0)"
          + "".join(f"\n  BEATEN: {c.m['id']} ratio {c.ratio:.2f}" for c in beaten))
    print(f"layout pairs ordered as measured: {agree}/{total} ({agree / max(total, 1):.0%})")
    print(f"median measured / bound (throughput): {median:.2f}; the UI says {EFFICIENCY:.2f}")
    return 1 if beaten else 0


if __name__ == "__main__":
    sys.exit(main())

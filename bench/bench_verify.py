"""Benchmark of `tpviz verify` on CPU (a script, not a timed test).

For tp in {1, 2, 4}: the end-to-end wall time of `python -m tpviz.verify` (a fresh process: torch import,
spawn, load, forward, compare), the in-process phase times, and the checkpoint bytes each rank read
against the whole checkpoint. Target: <= 15 s end to end for a tiny model at tp=2.

    python bench/bench_verify.py [--model MODEL] [--layers K] [--tps 1 2 4] [--dtype float32] [--strict]
                                 [--random-weights]

The default model is a tiny Qwen3-shaped config (random weights, made once in a temporary cache).
--strict exits 1 when the tp=2 target is missed.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
TINY = {"model_type": "qwen3", "hidden_size": 256, "num_attention_heads": 8, "num_key_value_heads": 2,
        "head_dim": 32, "intermediate_size": 512, "vocab_size": 32000, "num_hidden_layers": 4,
        "tie_word_embeddings": False, "torch_dtype": "bfloat16"}
TARGET_S = 15.0


def end_to_end(model: str, tp: int, args, env: dict) -> tuple[float, int, str]:
    """Wall time of a fresh `python -m tpviz.verify` process, its exit code and verdict line."""
    cmd = [sys.executable, "-m", "tpviz.verify", model, "--tp", str(tp), "--device", "cpu", "--dtype", args.dtype,
           "--seq-len", str(args.seq_len), "--quiet"] + (["--layers", str(args.layers)] if args.layers else []) \
        + (["--random-weights"] if args.random_weights else [])
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env)
    line = (proc.stdout.strip() or proc.stderr.strip()).splitlines()[0]
    return time.perf_counter() - start, proc.returncode, line


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", help="any verify MODEL (default: a tiny Qwen3-shaped config)")
    p.add_argument("--layers", type=int)
    p.add_argument("--tps", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--dtype", default="float32")
    p.add_argument("--seq-len", type=int, default=32)
    p.add_argument("--strict", action="store_true")
    p.add_argument("--random-weights", action="store_true", help="random weights for a preset/hub --model")
    args = p.parse_args()
    os.environ.setdefault("TPVIZ_CACHE", tempfile.mkdtemp(prefix="tpviz-bench-"))
    model = args.model
    if model is None:
        model = str(Path(os.environ["TPVIZ_CACHE"]) / "tiny-qwen3.json")
        Path(model).write_text(json.dumps(TINY))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}

    from tpviz.live import verify
    # make the random checkpoint (or download a preset/hub checkpoint) once, untimed
    verify(model, 1, device="cpu", layers=args.layers, seq_len=4, random_weights=args.random_weights)
    print(f"model {model}  (cpu, {args.dtype}, {os.cpu_count()} cores, seq {args.seq_len} x 2)")
    missed = False
    for tp in args.tps:
        wall, code, line = end_to_end(model, tp, args, env)
        result, _ = verify(model, tp, device="cpu", dtype=args.dtype, layers=args.layers, seq_len=args.seq_len,
                           random_weights=args.random_weights)
        phases = ", ".join(f"{k} {v:.2f}s" for k, v in result.phases.items())
        target = f"  (target <= {TARGET_S:g} s: {'ok' if wall <= TARGET_S else 'MISSED'})" if tp == 2 else ""
        missed |= tp == 2 and wall > TARGET_S
        print(f"\ntp={tp}: end to end {wall:.2f} s, exit {code}{target}\n  {line}\n  in-process phases: {phases}")
        total = result.ranks[0].checkpoint_bytes
        for r in result.ranks:
            print(f"  rank {r.rank}: read {r.bytes_read / 2**20:8.2f} MiB = {100 * r.bytes_read / total:5.1f}% of "
                  f"{total / 2**20:.2f} MiB (file span {100 * r.bytes_spanned / total:5.1f}%), "
                  f"holds {r.param_bytes / 2**20:.2f} MiB, load {r.load_s:.2f}s, forward {r.forward_s:.3f}s")
        print(f"  all ranks read {sum(r.bytes_read for r in result.ranks) / total:.2f}x the checkpoint")
    return 1 if args.strict and missed else 0


if __name__ == "__main__":
    sys.exit(main())

"""Benchmark of `tpviz verify` on CPU (a script, not a timed test).

Default: every family in the presets at tp=2, each shrunk to a tiny model of its own preset's structure (its
attention, MoE, MLA and norm options kept; widths, vocabulary and experts cut down; --layers 2), with random
weights: the in-process verify time (and its phases), the verdict, and the checkpoint bytes each rank read
against the whole checkpoint. Families the live check refuses are listed with its one-line reason.

--model MODEL: that model at each of --tps instead: the end-to-end wall time of `python -m tpviz.cli.verify`
(a fresh process: torch import, spawn, load, forward, compare), the in-process phase times and the bytes each
rank read. Target: <= 15 s end to end for a tiny model at tp=2 (--strict exits 1 when missed).

    python bench/bench_verify.py [--families qwen3 mixtral ...] [--layers 2] [--seq-len 32]
    python bench/bench_verify.py --model MODEL [--layers K] [--tps 1 2 4] [--dtype float32] [--strict]
                                 [--random-weights]
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
    """Wall time of a fresh `python -m tpviz.cli.verify` process, its exit code and verdict line."""
    cmd = [sys.executable, "-m", "tpviz", "verify", model, "--tp", str(tp), "--device", "cpu",
           "--dtype", args.dtype, "--seq-len", str(args.seq_len), "--quiet"] + (["--layers", str(args.layers)]
                                                         if args.layers else []) \
        + (["--random-weights"] if args.random_weights else [])
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env)
    line = (proc.stdout.strip() or proc.stderr.strip()).splitlines()[0]
    return time.perf_counter() - start, proc.returncode, line


def shrink(raw: dict) -> dict:
    """A tiny config with the preset's structure: 4 heads (KV heads: 4 if MHA, 1 if MQA, else 2) of 32 dims,
    hidden 128, a 1024-token vocabulary, at most 8 experts (top-2), small MLA ranks; everything else as is."""
    out = json.loads(json.dumps(raw))
    t = out["text_config"] if isinstance(out.get("text_config"), dict) else out
    heads = t.get("num_attention_heads", 4)
    kv = t.get("num_key_value_heads") or heads
    sizes = {"num_attention_heads": 4, "num_key_value_heads": 4 if kv == heads else 1 if kv == 1 else 2,
             "hidden_size": 128, "intermediate_size": 256, "moe_intermediate_size": 64,
             "shared_expert_intermediate_size": 128, "vocab_size": 1024, "head_dim": 32,
             "query_pre_attn_scalar": 32,
             "kv_lora_rank": 64, "qk_nope_head_dim": 32, "qk_rope_head_dim": 16, "v_head_dim": 32,
             "n_group": 2, "topk_group": 1, "first_k_dense_replace": 1}  # DeepSeek: layer 1 is a MoE layer
    for key, value in sizes.items():
        if key in t or key in ("num_key_value_heads", "intermediate_size", "vocab_size"):
            t[key] = value
    if t.get("q_lora_rank"):
        t["q_lora_rank"] = 96
    for key in ("num_experts", "num_local_experts", "n_routed_experts"):
        if t.get(key):
            t[key] = min(t[key], 8)
    for key in ("num_experts_per_tok", "experts_per_token"):
        if t.get(key):
            t[key] = min(t[key], 2)
    for key in [k for k in t if k.endswith("_token_id")]:  # ids of the real vocabulary
        del t[key]
    # random weights are bf16; fp8 blocks of 128 would not fit tiny widths
    out.pop("quantization_config", None)
    return out


def by_family(args) -> int:
    """Each preset family, shrunk, at tp=2 with random weights: verify time, verdict, bytes read per rank."""
    from tpviz.errors import TpvizError
    from tpviz.live import resolve_model, verify
    from tpviz.live.model.config import live_types
    from tpviz.config.sources import presets
    chosen = {}
    for quantized in (False, True):  # each family's first unquantized preset, else its first (random weights)
        for name, raw in presets().items():
            if bool(raw.get("quantization_config")) == quantized:
                chosen.setdefault(raw.get("model_type"), (name, raw))
    if args.families:
        chosen = {f: chosen[f] for f in args.families if f in chosen}
    folder = Path(os.environ["TPVIZ_CACHE"])
    print(f"tp=2 on cpu ({os.cpu_count()} cores), random weights, tiny shapes of each family's preset, "
          f"--layers {args.layers}, input 2 x {args.seq_len}\n")
    for family, (name, raw) in chosen.items():
        path = folder / f"tiny-{family}.json"
        path.write_text(json.dumps(shrink(raw)))
        try:
            resolve_model(str(path), args.layers, random_weights=True)  # the random checkpoint, untimed
            start = time.perf_counter()
            result, _ = verify(str(path), 2, device="cpu", layers=args.layers, seq_len=args.seq_len,
                               random_weights=True)
            wall = time.perf_counter() - start
        except TpvizError as e:
            print(f"{family:<12} {name}: skipped: {e}\n")
            continue
        phases = ", ".join(f"{k} {v:.2f}" for k, v in result.phases.items()
                           if k in ("spawn", "load", "forward", "reference"))
        total = result.ranks[0].checkpoint_bytes
        print(f"{family:<12} {name}: {wall:.2f} s ({phases}), {result.verdict}, checkpoint "
              f"{total / 2**20:.2f} MiB")
        for r in result.ranks:
            print(f"    rank {r.rank}: read {r.bytes_read / 2**20:7.3f} MiB = "
                  f"{100 * r.bytes_read / total:5.1f}%, holds {100 * r.stored_bytes / total:5.1f}% "
                  f"in {r.stored_dtype} ({r.param_bytes / 2**20:.3f} MiB in {r.dtype})")
        print()
    for family in (f for f in live_types() if f not in chosen and f != "gemma3_text" and not args.families):
        print(f"{family:<12} no preset of this family: not benchmarked")
    return 0


def by_tp(args) -> int:
    """One model at each tp: end-to-end and in-process times, bytes read per rank."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    model = args.model
    if model == "tiny":
        model = str(Path(os.environ["TPVIZ_CACHE"]) / "tiny-qwen3.json")
        Path(model).write_text(json.dumps(TINY))

    from tpviz.live import verify
    # make the random checkpoint (or download a preset/hub checkpoint) once, untimed
    verify(model, 1, device="cpu", layers=args.layers, seq_len=4, random_weights=args.random_weights)
    print(f"model {model}  (cpu, {args.dtype}, {os.cpu_count()} cores, seq {args.seq_len} x 2)")
    missed = False
    for tp in args.tps:
        wall, code, line = end_to_end(model, tp, args, env)
        result, _ = verify(model, tp, device="cpu", dtype=args.dtype, layers=args.layers,
                           seq_len=args.seq_len, random_weights=args.random_weights)
        phases = ", ".join(f"{k} {v:.2f}s" for k, v in result.phases.items())
        target = f"  (target <= {TARGET_S:g} s: {'ok' if wall <= TARGET_S else 'MISSED'})" if tp == 2 else ""
        missed |= tp == 2 and wall > TARGET_S
        print(f"\ntp={tp}: end to end {wall:.2f} s, exit {code}{target}\n  {line}\n  "
              f"in-process phases: {phases}")
        total = result.ranks[0].checkpoint_bytes
        for r in result.ranks:
            print(f"  rank {r.rank}: read {r.bytes_read / 2**20:8.2f} MiB = "
                  f"{100 * r.bytes_read / total:5.1f}% of {total / 2**20:.2f} MiB (file span "
                  f"{100 * r.bytes_spanned / total:5.1f}%), holds {r.param_bytes / 2**20:.2f} MiB, load "
                  f"{r.load_s:.2f}s, forward {r.forward_s:.3f}s")
        print(f"  all ranks read {sum(r.bytes_read for r in result.ranks) / total:.2f}x the checkpoint")
    return 1 if args.strict and missed else 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", help="bench this model per tp instead of the families ('tiny': a tiny Qwen3)")
    p.add_argument("--families", nargs="+", help="only these model_types (default: every preset family)")
    p.add_argument("--layers", type=int, help="keep the first K layers (families: default 2)")
    p.add_argument("--tps", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--dtype", default="float32")
    p.add_argument("--seq-len", type=int, default=32)
    p.add_argument("--strict", action="store_true")
    p.add_argument("--random-weights", action="store_true", help="random weights for a preset/hub --model")
    args = p.parse_args()
    os.environ.setdefault("TPVIZ_CACHE", tempfile.mkdtemp(prefix="tpviz-bench-"))
    if args.model:
        return by_tp(args)
    args.layers = args.layers or 2
    return by_family(args)


if __name__ == "__main__":
    sys.exit(main())

"""The behaviour-kept dump: every preset's and shared config's shard map at tp 1, 2, 8 and 16 under every rule
set (a refusal recorded as its error type and message). `python tests/golden/dump.py` writes maps.json.gz; the
golden test compares the code with it."""
import gzip
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))
SHARED = HERE.parents[2] / "shared" / "configs"
TPS = (1, 2, 8, 16)
RULES = ("vllm", "vllm-0.28", "nano-vllm")
DUMP = HERE / "maps.json.gz"
DEPLOY_DUMP = HERE / "deploy.json.gz"  # pp / dp / ep layouts and 8-GPU plans
LIVE_DUMP = HERE / "live.json.gz"  # what Run live builds: its config, random-weight checkpoint and HF config
LAYOUTS = ((2, 2, 1, False), (2, 1, 2, False), (2, 2, 2, True), (4, 1, 2, True))
PLANNED = ("meta-llama/Llama-3.1-8B", "deepseek-ai/DeepSeek-V3", "Qwen/Qwen3-30B-A3B", "google/gemma-2-9b-it")


def models() -> dict[str, object]:
    """{case name: source}: the presets by id, the shared configs by file stem (when ../shared is here)."""
    from tpviz.config.sources import presets
    out = {f"preset:{k}": k for k in presets()}
    if SHARED.is_dir():
        for p in sorted(SHARED.glob("*.json")):
            if not p.name.endswith(".index.json"):
                out[f"shared:{p.stem}"] = json.loads(p.read_text())
    return out


def one(source, tp: int, rules: str) -> dict:
    from tpviz import shard_map
    try:
        return shard_map(source, tp, rules).to_dict()
    except ValueError as e:
        return {"refused": str(e)}


def cases():
    for name, source in models().items():
        for rules in RULES:
            for tp in TPS:
                yield f"{name}|{rules}|{tp}", source, tp, rules


def refused(f):
    try:
        return f()
    except ValueError as e:
        return {"refused": str(e)}


def deploy_cases():
    """(key, thunk) for every preset's layouts under vLLM rules, and the 8-GPU plans of a few."""
    from tpviz.config.sources import load_spec
    from tpviz.deploy.deployment import deploy
    from tpviz.deploy.ranking import plan_rows, rank_layouts
    from tpviz.rules import Layout
    for name, source in models().items():
        for tp, pp, dp, ep in LAYOUTS:
            yield (f"{name}|layout {tp},{pp},{dp},{ep}",
                   lambda s=source, l=Layout(tp, pp, dp, ep): deploy(load_spec(s), l, "vllm").to_dict())
    for name in PLANNED:
        for rules in RULES:
            yield (f"plan {name}|{rules}",
                   lambda n=name, r=rules: plan_rows(rank_layouts(load_spec(n), 8, 80.0, r)))


def live_cases():
    """(key, thunk): Run live's config, random-weight checkpoint shapes and HF config, first 4 layers."""
    from tpviz.live.load.random_weights import checkpoint_shapes, hf_config
    from tpviz.live.load.source import live_config
    from tpviz.config.sources import load_spec

    def live(source):
        cfg = live_config(load_spec(source), 4)
        return {"config": cfg.to_dict(), "shapes": checkpoint_shapes(cfg), "hf_config": hf_config(cfg)}
    for name, source in models().items():
        yield f"{name}|live", lambda s=source: live(s)


def write(path: Path, out: dict) -> None:
    path.write_bytes(gzip.compress(json.dumps(out, sort_keys=True,
                                              separators=(",", ":")).encode(), 9, mtime=0))
    print(f"{path.name}: {len(out)} cases, {path.stat().st_size / 1e6:.2f} MB")


if __name__ == "__main__":
    import torch
    torch.set_num_threads(1)
    write(DUMP, {key: one(source, tp, rules) for key, source, tp, rules in cases()})
    write(DEPLOY_DUMP, {key: refused(f) for key, f in deploy_cases()})
    write(LIVE_DUMP, {key: refused(f) for key, f in live_cases()})

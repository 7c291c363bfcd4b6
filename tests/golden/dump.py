"""The behaviour-kept dump: every preset's and shared config's shard map at tp 1, 2, 8 and 16 under every rule set
(a refusal recorded as its error type and message). `python tests/golden/dump.py` writes maps.json.gz; the golden
test compares the code with it."""
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


def models() -> dict[str, object]:
    """{case name: source}: the presets by id, the shared configs by file stem (when ../shared is here)."""
    from tpviz.sources import presets
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


if __name__ == "__main__":
    import torch
    torch.set_num_threads(1)
    out = {key: one(source, tp, rules) for key, source, tp, rules in cases()}
    DUMP.write_bytes(gzip.compress(json.dumps(out, sort_keys=True, separators=(",", ":")).encode(), 9, mtime=0))
    print(f"{len(out)} cases, {DUMP.stat().st_size / 1e6:.1f} MB")

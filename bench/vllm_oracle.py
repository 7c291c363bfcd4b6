"""vLLM 0.33's own model classes as an independent oracle for tpviz's maps: every parameter's name, per-rank
shape and element size, and whether vLLM's own load_weights takes every checkpoint tensor tpviz names.

tpviz never imports vLLM; this script does, in a venv of its own outside the repo (not the app's), on CPU:

    python3.11 -m venv /work/vllm-oracle-venv
    /work/vllm-oracle-venv/bin/pip install vllm==0.33.0    # pulls torch 2.14.0 (its CUDA build runs on CPU)
    /work/vllm-oracle-venv/bin/pip install -r requirements.txt   # tpviz's own; torch 2.14 meets torch>=2.4
    /work/vllm-oracle-venv/bin/pip install timm   # Gemma-3n's vision tower, which vLLM builds through timm
    /work/vllm-oracle-venv/bin/python bench/vllm_oracle.py [--tp 1 2 4] [--models qwen3 deepseek_v3 ...] [-v]

The ranks run with VLLM_TARGET_DEVICE=cpu, which makes vLLM pick its CPU platform (gloo) on a machine with no
GPU. Each tp runs tp processes (bench/oracle/vllm_rank.py: it imports vLLM, never tpviz); each rank builds
every case's model class as vLLM's default loader does, on the meta device (no memory), from a real config
(the first preset of each mapped model_type, else one in tests/data/indexes) shrunk to 2 layers and 8 experts,
without its quantization_config. It lists the parameters, then feeds load_weights a tensor of the full shape
for every checkpoint tensor tpviz names (untouched memory): all in one pass, then one by one, to learn which
parameter each loads into, which it rejects and which it silently takes nothing from. tpviz's parameters are
renamed to the ones their tensors load into, and per-expert ones stacked as FusedMoE holds them; then names,
per-rank shapes and element sizes must agree, and past tp 1 how each linear or vocabulary layer cuts (column,
column gathered, row, row cutting its whole input, replicated, vocab: a gathered column has a plain one's
shapes). vLLM's loaders narrow a split dimension without checking its full length, so that length is checked
only through the per-rank shapes; which rows go where is not checked.
Exit status 1 on any mismatch; a Python without vLLM (`make bench`) skips with one line.
"""
import argparse
import gzip
import json
import os
import socket
import subprocess
import sys
import tempfile
from importlib.util import find_spec
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tpviz from this checkout
from tpviz import TpvizError, shard_map  # noqa: E402
from tpviz.archs import known_types  # noqa: E402
from tpviz.config.sources import presets  # noqa: E402
from tpviz.plan import build_plan  # noqa: E402
from tpviz.plan.tensors import fill, tensors  # noqa: E402
from tpviz.trace.checkpoint import VISION  # noqa: E402  (the parts a map without its tower leaves out)

INDEXES = Path(__file__).resolve().parents[1] / "tests" / "data" / "indexes"
RANK = Path(__file__).resolve().parent / "oracle" / "vllm_rank.py"  # imports vLLM, never tpviz
# keep a routed-expert layer among the two
# wrappers whose tower needs timm (Gemma-3n's MobileNet-V5): without timm in this venv (pip install timm),
# their text decoder's own class is compared instead
TEXT_ONLY = {"gemma3n": "Gemma3nForCausalLM"} if find_spec("timm") is None else {}
# (a sub-config's edits merge into it: Gemma-3n keeps two KV-shared layers of both kinds among four)
G3N_TYPES = ["sliding_attention", "full_attention"] * 2
EDITS: dict[str, dict] = {"deepseek_v3": {"first_k_dense_replace": 1}, "lfm2_moe": {"num_dense_layers": 1},
                          "step3p5": {"moe_layers_enum": "1"},
                          "step3_vl": {"text_config": {"moe_layers_enum": "1"}},
                          "gemma3n": {"text_config": {"num_hidden_layers": 4, "layer_types": G3N_TYPES,
                                                      "num_kv_shared_layers": 2,
                                                      "activation_sparsity_pattern": [0.95, 0.0, 0.0, 0.0]}},
                          # Zamba2: two hybrid layers for its two shared blocks, with attention adapters too
                          "zamba2": {"num_hidden_layers": 4, "layers_block_type": ["mamba", "hybrid"] * 2,
                                     "hybrid_layer_ids": [1, 3], "use_shared_attention_adapter": True}}
# where this oracle cannot stand in for vLLM on a GPU (the case is listed as skipped, with the reason)
REMOTE = "vLLM reads its config through the checkpoint's remote code (transformers has no class for it)"
SKIP = {"nemotron-nas": REMOTE, "internlm2": REMOTE, "internvl_chat": REMOTE, "minicpmv": REMOTE,
        "kimi_linear": "vLLM 0.33's Kimi-Linear calls a CUDA kernel while it is built"}
# refusals of vLLM's CPU platform alone: the case is not compared at that tp (on a GPU vLLM builds it)
CPU_REFUSALS = {"No Unquantized MoE backend supports": "vLLM's CPU MoE kernels need each rank's "
                "intermediate size a multiple of 32 (fused_moe/experts/cpu_moe.py)",
                "Sparse Attention is not supported on CPU": "vLLM's CPU platform has no sparse attention "
                "(DeepSeek-V3.2's indexer; platforms/cpu.py)",
                "is_act_and_mul=False is supported only for": "vLLM's CPU MoE has no ungated experts "
                "(Nemotron-H's relu2)"}
EXPERT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")
DTYPES = {1: "uint8", 2: "bfloat16", 4: "float32"}


def shrink(cfg: dict, layers: int = 2, experts: int = 8) -> dict:
    """A copy with `layers` decoder (and tower) layers, at most `experts` routed experts, unquantized."""
    cfg = json.loads(json.dumps(cfg))
    cfg.pop("quantization_config", None)
    parts, i = [cfg], 0
    while i < len(parts):  # every sub-config, nested ones too (Qwen2.5-Omni's thinker_config.text_config)
        parts += [v for k, v in parts[i].items() if k.endswith("_config") and isinstance(v, dict)]
        i += 1
    for part in parts:
        for key in ("num_hidden_layers", "depth", "num_layers", "n_layer", "encoder_layers"):
            if isinstance(part.get(key), int):
                part[key] = layers
        for key in ("layer_types", "block_configs", "hybrid_override_pattern"):
            if isinstance(part.get(key), (list, str)):
                part[key] = part[key][:layers]
        for key in EXPERT_KEYS:
            if isinstance(part.get(key), int) and part[key] > experts:
                part[key] = experts
        if isinstance(part.get("num_experts_per_tok"), int):
            part["num_experts_per_tok"] = min(part["num_experts_per_tok"], experts)
        for key in ("n_group", "topk_group"):
            if isinstance(part.get(key), int):
                part[key] = 1
    return cfg


def edited(cfg: dict, edits: dict) -> dict:
    """The config with the edits; a sub-config's edits merge into it, and a per-layer list it leaves sized for
    other layers (Gemma-3n's intermediate_size) is cut to its num_hidden_layers."""
    out = {**cfg}
    for key, value in edits.items():
        if isinstance(value, dict) and isinstance(cfg.get(key), dict):
            sub = {**cfg[key], **value}
            n = sub.get("num_hidden_layers")
            out[key] = {k: (v * n)[:n] if isinstance(v, list) and k == "intermediate_size" else v
                        for k, v in sub.items()}
        else:
            out[key] = value
    return out


def real_configs() -> dict[str, dict]:
    """model_type -> a real config of it: its first preset, else the first in tests/data/indexes."""
    found: dict[str, dict] = {}
    for cfg in presets().values():
        found.setdefault(cfg.get("model_type"), cfg)
    for path in sorted(INDEXES.glob("*.json.gz")):
        cfg = json.loads(gzip.decompress(path.read_bytes())).get("config", {})
        found.setdefault(cfg.get("model_type"), cfg)
    return {t: found[t] for t in known_types() if t in found}


# ---- tpviz's side (the parent process; no vLLM) ----

def expert_stack(name: str, layer_class: str) -> str:
    """vLLM 0.33's FusedMoE holds a layer's experts in one parameter per side, under its RoutedExperts
    module (layers/fused_moe/layer.py: w13 the gate/up side, w2 the down side); tpviz shows each expert's
    share (`experts.*.gate_up_proj.weight`): the stacked name."""
    # Step-3's and Step-3.5's experts sit under the block itself (moe.gate_up_proj.weight)
    head = name[:name.index(".experts.")] if ".experts." in name else name.rsplit(".", 2)[0]
    side = "w2" if layer_class.startswith("Row") else "w13"
    return f"{head}.experts.routed_experts.{side}_{name.rsplit('.', 1)[-1]}"


def copies_of(p) -> tuple:
    """A parameter's copies (decoder layers, or a tower's blocks: '*' their index) and its experts per copy
    (1 but for routed experts)."""
    copies = p.layers if p.layers is not None else range(p.count) if "*" in p.name else [None]
    return copies, p.count // len(copies)


def kind(p, note: str) -> str | None:
    """How tpviz's layer cuts a parameter, in the words vllm_rank.kind uses (None: a class not compared)."""
    linear = p.layer_class.endswith(("Linear", "Embedding", "LMHead"))
    if p.split_dim is None:
        return "replicated" if linear else None
    if p.layer_class in ("VocabParallelEmbedding", "ParallelLMHead"):
        return "vocab"
    if p.layer_class == "RowParallelLinear":
        return "row, input cut here" if "input_is_parallel=False" in note else "row"
    if p.layer_class in ("ColumnParallelLinear", "MergedColumnParallelLinear", "QKVParallelLinear"):
        return "column, gathered" if "gather_output" in note else "column"
    return None


def tpviz_side(cfg: dict, tp: int) -> dict:
    """tpviz's map at tp: per rank {vLLM parameter name: [shape, element bytes]}, and the checkpoint
    tensors (name, full shape, dtype) its plan says vLLM loads; or the one line it refuses with."""
    try:
        m = shard_map(cfg, tp)
    except TpvizError as e:
        return {"refused": str(e)}
    ranks: list[dict] = [{} for _ in range(tp)]
    kinds: dict[str, str] = {}  # parameter -> how tpviz's layer cuts it
    plans = build_plan(m.model, m.rules)
    notes = {pl.name: pl.note for pl in plans}
    # a whole tensor tpviz draws flattened (a patch conv kernel [out, in·p·p], a 2-D position table as rows):
    # vLLM may hold it as stored, which is then the shape compared (a third entry)
    disk = {pl.name: list(pl.sources[0].disk) for pl in plans
            if len(pl.sources) == 1 and pl.sources[0].disk and not pl.sources[0].split}
    # a layer's copy stored under another layer's name (Zamba2's adapters): both '*' filled as the plan says
    stored = {pl.name: pl.stored_at for pl in plans if pl.stored_at}
    for p in m.params:
        size = p.element_bytes or m.model_dtype_bytes
        copies, experts = copies_of(p)
        for i, at in zip(copies, stored.get(p.name) or [None] * len(copies)):
            name = p.name if i is None else p.name.replace("*", str(i), 1)
            if at is not None:
                name = fill(p.name, *at)
            if (k := kind(p, notes.get(p.name, ""))) and experts <= 1:
                kinds[name] = k
            for rank, shape in enumerate(p.local_shapes):
                alt = [disk[p.name]] if p.name in disk and experts <= 1 else []
                if experts > 1:
                    ranks[rank][expert_stack(name, p.layer_class)] = [[experts, *shape], size]
                else:
                    ranks[rank][name] = [list(shape), size, *alt]
    by_name = {p.name: p for p in m.params}
    ckpt = []  # name, full shape, dtype, and the parameter (as keyed above) tpviz loads it into
    for t in tensors(plans):
        p = by_name[t.plan.name]
        key = expert_stack(t.param, p.layer_class) if copies_of(p)[1] > 1 else t.param
        ckpt.append([t.name, list(t.shape), DTYPES[p.element_bytes or m.model_dtype_bytes], key])
    # a tower tpviz leaves out (named in the map's notes) is not compared: every one in a text-only map, the
    # vision one beside a mapped audio one (Gemma-3n's)
    left_out = (() if m.model.tower else tuple(v for v in VISION if v not in m.model.audio.prefixes)
                if m.model.audio else VISION)
    return {"ranks": ranks, "tensors": ckpt, "left_out": left_out, "kinds": kinds}


def compare(want: dict, have: dict, ckpt: list, left_out: tuple, kinds: dict | None = None) -> list[str]:
    """One line per parameter whose name, shape or element size differs, and per load problem. A tpviz
    parameter is the vLLM parameter its checkpoint tensors load into, as vLLM's loader says (tpviz names
    it by the checkpoint's module path: gpt-oss's self_attn is vLLM's attn, GPT-2's h.0 is transformer.h.0);
    its tensors must all load into that one. A parameter vLLM holds as a buffer (Gemma-4's layer_scalar)
    agrees when its shape does."""
    into: dict[str, set] = {}
    for name, _, _, key in ckpt:
        into.setdefault(key, set()).update(have["loads"].get(name, ()))
    out = [f"tpviz loads {k}'s tensors into one parameter, vLLM into {sorted(v)}"
           for k, v in sorted(into.items()) if len(v) > 1]
    named = {n: next(iter(into[n])) if len(into.get(n, ())) == 1 else n for n in want}
    want = {named[n]: v for n, v in want.items()}
    held = {**{n: v for n, v in have["buffers"].items() if n in want}, **have["params"]}
    out += [f"vLLM builds {n} {v[0]} ({v[1]} B), tpviz lacks it" for n, v in sorted(have["params"].items())
           if n not in want and not n.startswith(left_out)]
    out += [f"tpviz maps {n} {v[0]}, vLLM lacks it" for n, v in sorted(want.items()) if n not in held]
    out += [f"{n}: vLLM {held[n]}, tpviz {v[:2]}" for n, v in sorted(want.items())
            if n in held and held[n] != v[:2] and (len(v) < 3 or held[n] != [v[2], v[1]])]
    # how each layer cuts (past tp 1, where every layer is whole): a gathered column or a row fed whole input
    # has the shapes of the plain split
    out += [f"{named.get(n, n)}: vLLM's layer is {have['kinds'][named.get(n, n)]}, tpviz's {k}"
            for n, k in sorted((kinds or {}).items())
            if have.get("kinds", {}).get(named.get(n, n), k) != k]
    if have["load_error"]:
        out.append(f"load_weights raised: {have['load_error']}")
    out += [f"load_weights rejected {r}" for r in have["rejected"]]
    out += [f"load_weights never loaded {n}" for n in have["unloaded"] if not n.startswith(left_out)]
    out += [f"load_weights took nothing from {n}" for n in have["ignored"]]
    return out


def run_tp(tp: int, cases: dict) -> dict:
    """Run the ranks of one tp over every case; rank -> case -> what vLLM built."""
    with tempfile.TemporaryDirectory(prefix=f"oracle-tp{tp}-") as tmp:
        job = Path(tmp) / "job.json"
        job.write_text(json.dumps(cases))
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        env = {**os.environ, "VLLM_TARGET_DEVICE": "cpu", "VLLM_LOGGING_LEVEL": "ERROR",
               "OMP_NUM_THREADS": "1", "TORCHINDUCTOR_COMPILE_THREADS": "1"}
        procs = [subprocess.Popen([sys.executable, str(RANK), "--rank", str(r), "--tp", str(tp), "--port",
                                   str(port), "--job", str(job)], env=env) for r in range(tp)]
        codes = [p.wait() for p in procs]
        if any(codes):
            raise SystemExit(f"tp={tp}: a rank exited with {codes}")
        return {r: json.loads((Path(tmp) / f"rank{r}.json").read_text()) for r in range(tp)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tp", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--models", nargs="+", help="model_types (default: every one with a real config here)")
    ap.add_argument("-v", "--verbose", action="store_true", help="print every mismatch, not the first 8")
    args = ap.parse_args()
    if find_spec("vllm") is None:
        print("skipped: vLLM 0.33.0 is not installed in this Python (the recipe is atop this script)")
        return 0
    found = real_configs()
    if unknown := set(args.models or ()) - set(found):
        ap.error(f"no real config here for {sorted(unknown)}; choose from {sorted(found)}")
    chosen = args.models or found
    rows = [(c, "-", 0, f"skipped: {SKIP[c]}") for c in chosen if c in SKIP]
    configs = {c: edited(shrink(found[c]), EDITS.get(c, {})) for c in chosen if c not in SKIP}
    configs.update({c: {**configs[c]["text_config"], "architectures": [cls]} for c, cls in TEXT_ONLY.items()
                    if c in configs})
    failed = False
    for tp in args.tp:
        ours = {c: tpviz_side(cfg, tp) for c, cfg in configs.items()}
        theirs = run_tp(tp, {c: {"config": cfg, "tensors": ours[c].get("tensors", [])}
                             for c, cfg in configs.items()})
        for c in configs:
            problems, compared = [], 0
            for rank in range(tp):
                have = theirs[rank][c]
                if "refused" in have or "refused" in ours[c]:
                    if ("refused" in have) != ("refused" in ours[c]):
                        problems.append(f"vLLM: {have.get('refused', 'builds it')}; "
                                        f"tpviz: {ours[c].get('refused', 'maps it')}")
                    break
                compared += len(ours[c]["ranks"][rank])
                problems += [f"rank {rank}: {p}"
                             for p in compare(ours[c]["ranks"][rank], have, ours[c]["tensors"],
                                              ours[c]["left_out"], ours[c]["kinds"] if tp > 1 else None)]
            verdict = "both refuse" if "refused" in ours[c] and not problems else str(len(problems))
            cpu = next((v for k, v in CPU_REFUSALS.items() if k in theirs[0][c].get("refused", "")), None)
            if cpu and "refused" not in ours[c]:
                problems, verdict = [], f"not compared: {cpu}"
            rows.append((c, tp, compared, verdict))
            failed |= bool(problems)
            for p in problems if args.verbose else problems[:8]:
                print(f"  {c} tp={tp} {p}")
    print(f"\n{'model':<16}{'tp':>3}{'params compared':>17}  mismatches")
    for c, tp, n, verdict in rows:
        print(f"{c:<16}{tp:>3}{n:>17}  {verdict}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

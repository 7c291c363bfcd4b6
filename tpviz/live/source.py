"""Where a live run's model comes from: a local checkpoint folder, a config, or a preset/hub id with
random weights (made once from a seed, cached as a safetensors checkpoint every rank loads the same way)."""
import hashlib
import json
import os
import shutil
import uuid
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from tpviz.errors import TPSizeError, TpvizError
from tpviz.live.errors import LiveError
from tpviz.live.model import LiveConfig, check_supported
from tpviz.live.moe import MOE_FAMILIES
from tpviz.live.weights import checkpoint_files
from tpviz.spec import ModelSpec, normalize

TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json")
RANDOM_FORMAT = 1  # bump when the random-weight recipe changes, so old caches are not reused
MAX_PARAMS_ENV = "TPVIZ_LIVE_MAX_PARAMS"  # the most parameters a live run may build (each rank, and tp=1)
DEFAULT_MAX_PARAMS = 2e9
CACHE_MAX_ENTRIES, CACHE_MAX_BYTES = 8, 8 << 30  # random checkpoints kept beyond these are pruned, oldest first
ARCHITECTURES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM",
                 "qwen3": "Qwen3ForCausalLM", "mixtral": "MixtralForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM"}


@dataclass
class ModelSource:
    """A model ready to run: its config, a checkpoint folder, and whether the weights are random."""
    name: str
    cfg: LiveConfig
    checkpoint: Path
    random_weights: bool
    tokenizer_dir: Path | None = None

    def to_dict(self) -> dict:
        return {"name": self.name, "checkpoint": str(self.checkpoint), "random_weights": self.random_weights,
                "tokenizer": str(self.tokenizer_dir) if self.tokenizer_dir else None, "config": self.cfg.to_dict()}


def live_config(spec: ModelSpec, raw: dict | None = None, layers: int | None = None) -> LiveConfig:
    """Spec plus the raw-config facts it lacks (rope, mlp_bias, sliding window, norm_topk_prob), optionally shrunk."""
    raw = raw or {}
    if isinstance(raw.get("text_config"), dict):
        raw = raw["text_config"]
    notes = list(spec.notes)
    rope = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
    if isinstance(rope, dict):
        kind = rope.get("rope_type", rope.get("type", "default"))
        if kind not in ("default", None):
            notes.append(f"rope scaling {kind!r} is ignored; TP vs tp=1 is still a fair comparison")
    if raw.get("use_sliding_window") is True:
        raise LiveError("use_sliding_window=true (per-layer sliding windows) is not supported by the live check")
    window = raw.get("sliding_window") if spec.model_type in ("mistral", "mixtral") else None
    norm_topk = raw.get("norm_topk_prob", False)  # Qwen3-MoE's default; Mixtral always renormalizes
    if norm_topk is not None and not isinstance(norm_topk, bool):
        raise LiveError(f"norm_topk_prob={norm_topk!r} must be true or false")
    if layers is not None:
        if isinstance(layers, bool) or not isinstance(layers, int) or layers < 1:
            raise LiveError(f"layers={layers!r} must be a positive integer")
        if layers < spec.num_hidden_layers:
            notes.append(f"shrunk to the first {layers} of {spec.num_hidden_layers} layers")
            spec = replace(spec, num_hidden_layers=layers, moe_layers=[i for i in spec.moe_layers if i < layers])
    cfg = LiveConfig(spec=spec, mlp_bias=spec.mlp_bias and spec.model_type not in MOE_FAMILIES,
                     sliding_window=window if isinstance(window, int) and window > 0 else None,
                     norm_topk_prob=spec.model_type == "mixtral" or bool(norm_topk), notes=notes)
    check_supported(cfg.spec)
    return cfg


def check_split(cfg: LiveConfig, tp_size: int) -> None:
    """Raise the layers' own one-line TPSizeError when cfg cannot be split over tp_size (meta tensors: free)."""
    from tpviz.live.model import LiveForCausalLM
    from tpviz.tracer import first_problem
    problem = first_problem(cfg.spec, tp_size)  # heads before vocab: the rule a user should hear first
    if problem:
        raise TPSizeError(problem)
    with torch.device("meta"):
        LiveForCausalLM(cfg, tp_size, 0)


def resolve_model(model, layers: int | None = None, seed: int = 0, tp_size: int | None = None) -> ModelSource:
    """Turn a checkpoint folder, config.json path, config dict/bytes, or preset/hub id into a ModelSource.

    Local paths obey the explorer's TPVIZ_LOCAL_ROOT confinement; a folder with *.safetensors uses its own
    weights, anything else gets seeded random weights. With tp_size, an invalid split fails before any
    random weights are made.
    """
    from tpviz.sources import check_local_path, local_config, resolve_config
    path = is_dir = None
    if isinstance(model, (str, Path)) and str(model).strip():
        text = str(model).strip()
        if isinstance(model, Path) or text.startswith((".", "/", "~")) or _probe(Path(text).expanduser().exists,
                                                                                     text):
            path = check_local_path(text)
            is_dir = _probe(path.is_dir, text)
    elif not isinstance(model, (dict, bytes, bytearray)):
        raise LiveError("give a model: a checkpoint folder, a config.json, or a preset/hub id")
    raw, name = local_config(path) if is_dir else resolve_config(model)
    cfg = live_config(normalize(raw, name), raw, layers)
    if tp_size is not None:
        check_split(cfg, tp_size)
    check_size(cfg, layers)  # before any weights are made, here or in the tp=1 reference
    if is_dir:
        tokenizer = path if any((path / f).is_file() for f in TOKENIZER_FILES) else None
        if checkpoint_files(path):
            if cfg.spec.quantization:
                raise LiveError(f"{name} is {cfg.spec.quantization}-quantized; the live check loads "
                                "unquantized safetensors (drop the weights to run it with random ones)")
            return ModelSource(name, cfg, path, False, tokenizer)
        return ModelSource(name, cfg, random_checkpoint(cfg, seed), True, tokenizer)
    return ModelSource(name, cfg, random_checkpoint(cfg, seed), True)


def _probe(check, text: str):
    """check() of a path, with an OSError (e.g. a name over 255 characters) as one LiveError line."""
    try:
        return check()
    except OSError as e:
        shown = text if len(text) <= 60 else text[:57] + "..."
        raise LiveError(f"{shown!r} is not a usable path ({e.strerror or type(e).__name__})") from None


def max_params() -> float | None:
    """The parameter cap from $TPVIZ_LIVE_MAX_PARAMS (default 2e9); None when set to off/0."""
    text = os.environ.get(MAX_PARAMS_ENV, "").strip()
    if not text:
        return DEFAULT_MAX_PARAMS
    if text.lower() in ("off", "none", "0"):
        return None
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value > 0 or value == float("inf"):
        raise LiveError(f"{MAX_PARAMS_ENV}={text!r} must be a positive number such as 2e9, or off")
    return value


def param_count(cfg: LiveConfig) -> int:
    """Parameters of the model as it will run (shrunk; a tied lm_head counted once)."""
    total = 0
    for shape in checkpoint_shapes(cfg).values():
        n = 1
        for d in shape:
            n *= d
        total += n
    return total


def check_size(cfg: LiveConfig, layers: int | None = None) -> None:
    """Refuse, in one line, a model too big to build on the CPU (random weights, tp=1 reference)."""
    limit = max_params()
    total = param_count(cfg)
    if limit is None or total <= limit:
        return
    n = cfg.spec.num_hidden_layers
    one = replace(cfg, notes=[], spec=replace(cfg.spec, num_hidden_layers=1,
                                              moe_layers=[i for i in cfg.spec.moe_layers if i < 1]))
    hint = ("keep fewer layers with --layers/Layers to keep" if n > 1 and param_count(one) <= limit
            else "even one layer is too big")
    raise LiveError(f"{cfg.spec.name} with {n} layer{'s' if n != 1 else ''} would be {total / 1e9:.1f}B "
                    f"parameters on CPU (limit {limit / 1e9:.1f}B); {hint}, or set {MAX_PARAMS_ENV}")


def cache_root() -> Path:
    """Where random checkpoints are kept: $TPVIZ_CACHE, else ~/.cache/tpviz."""
    return Path(os.environ.get("TPVIZ_CACHE") or Path.home() / ".cache" / "tpviz")


def random_checkpoint(cfg: LiveConfig, seed: int = 0) -> Path:
    """Make (once) and return a safetensors checkpoint folder of seeded random weights for cfg."""
    cfg.notes.append(f"random weights (seed {seed}): no checkpoint weights were given")
    shape = {k: v for k, v in cfg.to_dict()["spec"].items() if k not in ("name", "notes")}
    key = json.dumps([RANDOM_FORMAT, seed, shape, cfg.mlp_bias] + ([cfg.norm_topk_prob] if cfg.spec.is_moe else []),
                     sort_keys=True)  # norm_topk_prob goes into config.json, so it keys the cache too
    slug = "".join(c if c.isalnum() or c in "-_." else "_" for c in cfg.spec.name)[-48:]
    folder = cache_root() / "random" / f"{slug}-{hashlib.sha256(key.encode()).hexdigest()[:12]}"
    if (folder / "model.safetensors").is_file():
        _touch(folder)
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = folder.parent / f".tmp-{folder.name}-{uuid.uuid4().hex[:8]}"  # build aside, rename atomically
    tmp.mkdir()
    try:
        write_random_safetensors(cfg, seed, tmp / "model.safetensors")
        (tmp / "config.json").write_text(json.dumps(hf_config(cfg), indent=2))
        try:
            os.rename(tmp, folder)
        except OSError:  # another run made it first: keep theirs
            if not (folder / "model.safetensors").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    prune_cache(folder)
    return folder


def _touch(folder: Path) -> None:
    try:
        os.utime(folder)  # recently used: pruned last
    except OSError:
        pass


def _size(folder: Path) -> int:
    try:
        return sum(f.stat().st_size for f in folder.iterdir() if f.is_file())
    except OSError:
        return 0


def prune_cache(keep: Path, max_entries: int = CACHE_MAX_ENTRIES, max_bytes: int = CACHE_MAX_BYTES) -> None:
    """Delete the least recently used random checkpoints beyond max_entries or max_bytes (never `keep`)."""
    try:
        entries = [p for p in keep.parent.iterdir() if p.is_dir() and not p.name.startswith(".") and p != keep]
        entries.sort(key=lambda p: p.stat().st_mtime, reverse=True)  # newest first
    except OSError:
        return
    count, total = 1, _size(keep)
    for p in entries:
        size = _size(p)
        if count + 1 > max_entries or total + size > max_bytes:
            shutil.rmtree(p, ignore_errors=True)
        else:
            count, total = count + 1, total + size


def hf_config(cfg: LiveConfig) -> dict:
    """A Hugging Face style config.json for cfg, so the random folder is a checkpoint like any other."""
    s = cfg.spec
    out = {"architectures": [ARCHITECTURES.get(s.model_type, "LlamaForCausalLM")], "model_type": s.model_type,
           "hidden_size": s.hidden_size, "num_attention_heads": s.num_attention_heads,
           "num_key_value_heads": s.num_key_value_heads, "head_dim": s.head_dim,
           "intermediate_size": s.intermediate_size, "vocab_size": s.vocab_size,
           "num_hidden_layers": s.num_hidden_layers, "tie_word_embeddings": s.tie_word_embeddings,
           "attention_bias": s.attention_bias, "mlp_bias": cfg.mlp_bias,
           "rope_theta": s.rope_theta, "rms_norm_eps": s.rms_norm_eps, "hidden_act": "silu",
           "torch_dtype": "bfloat16"}
    if cfg.sliding_window:
        out["sliding_window"] = cfg.sliding_window
    if s.is_moe:  # both families read num_experts_per_tok; Qwen3-MoE's dense layers come back as mlp_only_layers
        out.update(num_experts_per_tok=s.num_experts_per_tok, norm_topk_prob=cfg.norm_topk_prob)
        if s.model_type == "mixtral":
            out.update(num_local_experts=s.num_experts, intermediate_size=s.moe_intermediate_size)
        else:
            out.update(num_experts=s.num_experts, moe_intermediate_size=s.moe_intermediate_size,
                       decoder_sparse_step=1, mlp_only_layers=s.dense_layers)
    return out


def checkpoint_shapes(cfg: LiveConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor of the Hugging Face checkpoint layout for cfg, with its full shape."""
    s = cfg.spec
    H, hd, I = s.hidden_size, s.head_dim, s.intermediate_size
    q, kv = s.num_attention_heads * hd, s.num_key_value_heads * hd
    out = {"model.embed_tokens.weight": (s.vocab_size, H)}
    for i in range(s.num_hidden_layers):
        p = f"model.layers.{i}."
        out[p + "input_layernorm.weight"] = (H,)
        for proj, rows in (("q_proj", q), ("k_proj", kv), ("v_proj", kv)):
            out[f"{p}self_attn.{proj}.weight"] = (rows, H)
            if cfg.qkv_bias:
                out[f"{p}self_attn.{proj}.bias"] = (rows,)
        if s.qk_norm:
            out[p + "self_attn.q_norm.weight"] = out[p + "self_attn.k_norm.weight"] = (hd,)
        out[p + "self_attn.o_proj.weight"] = (H, q)
        if cfg.o_bias:
            out[p + "self_attn.o_proj.bias"] = (H,)
        out[p + "post_attention_layernorm.weight"] = (H,)
        if s.is_moe and i in s.moe_layers:
            out.update(moe_shapes(s, p))
            continue
        for proj, shp in (("gate_proj", (I, H)), ("up_proj", (I, H)), ("down_proj", (H, I))):
            out[f"{p}mlp.{proj}.weight"] = shp
            if cfg.mlp_bias:
                out[f"{p}mlp.{proj}.bias"] = shp[:1]
    out["model.norm.weight"] = (H,)
    if not s.tie_word_embeddings:
        out["lm_head.weight"] = (s.vocab_size, H)
    return out


def moe_shapes(s: ModelSpec, prefix: str) -> dict[str, tuple[int, ...]]:
    """One MoE layer's checkpoint tensors: the router, then each expert's gate/up/down (Mixtral: w1/w3/w2)."""
    block, _ = MOE_FAMILIES[s.model_type]
    gate, up, down = ("w1", "w3", "w2") if s.model_type == "mixtral" else ("gate_proj", "up_proj", "down_proj")
    H, I = s.hidden_size, s.moe_intermediate_size
    out = {f"{prefix}{block}.gate.weight": (s.num_experts, H)}
    for e in range(s.num_experts):
        ex = f"{prefix}{block}.experts.{e}."
        out.update({f"{ex}{gate}.weight": (I, H), f"{ex}{up}.weight": (I, H), f"{ex}{down}.weight": (H, I)})
    return out


def iter_random_tensors(cfg: LiveConfig, seed: int):
    """Seeded bf16 weights, one (name, tensor) at a time: N(0, 0.02) matrices, norms 1 + N(0, 0.1),
    biases N(0, 0.1) (nothing trivial)."""
    gen = torch.Generator().manual_seed(seed)
    for name, shape in checkpoint_shapes(cfg).items():
        t = torch.randn(shape, generator=gen)
        if name.endswith("norm.weight"):
            t = 1 + 0.1 * t
        else:
            t *= 0.1 if name.endswith(".bias") else 0.02
        yield name, t.to(torch.bfloat16)
        del t


def random_tensors(cfg: LiveConfig, seed: int) -> dict[str, torch.Tensor]:
    """All of iter_random_tensors in one dict (small models and tests)."""
    return dict(iter_random_tensors(cfg, seed))


def write_random_safetensors(cfg: LiveConfig, seed: int, path: Path) -> None:
    """Write the seeded bf16 weights as one safetensors file, a tensor at a time (the shapes give the header)."""
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, shape in checkpoint_shapes(cfg).items():
        n = 2
        for d in shape:
            n *= d
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [offset, offset + n]}
        offset += n
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)  # the data starts 8-byte aligned, as safetensors writes it
    with open(path, "wb") as f:
        f.write(len(blob).to_bytes(8, "little"))
        f.write(blob)
        for name, t in iter_random_tensors(cfg, seed):
            f.write(t.contiguous().view(torch.uint8).numpy().data)


def local_tokenizer(model) -> Path | None:
    """The folder itself when `model` is a local checkpoint folder with tokenizer files, else None
    (also when TPVIZ_LOCAL_ROOT refuses the path)."""
    from tpviz.sources import check_local_path
    if not isinstance(model, (str, Path)) or not str(model).strip():
        return None
    try:
        path = check_local_path(str(model).strip())
        return path if path.is_dir() and any((path / f).is_file() for f in TOKENIZER_FILES) else None
    except (TpvizError, OSError):
        return None

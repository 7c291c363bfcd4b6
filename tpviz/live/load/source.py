"""Where a live run's model comes from: a local checkpoint folder, a preset/hub id (its safetensors
checkpoint, downloaded into the Hugging Face cache), or a config with random weights (made once from a seed,
cached as a safetensors checkpoint every rank loads the same way; any source can ask for them instead of its
own)."""
import os
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from tpviz.errors import DenseEPError, TPSizeError, TpvizError
from tpviz.config.hub import read_json
from tpviz.config.sources import check_local_path
from tpviz.config.sources import local_config, resolve_config
from tpviz.live.load.download import download_checkpoint, shrink_note
from tpviz.live.model.causal_lm import LiveForCausalLM
from tpviz.live.model.config import Stage
from tpviz.live.errors import RANDOM_FLAG, LiveError
from tpviz.live.model.blocks import full_rope_config, sliding_rope
from tpviz.live.model.gemma import read_gemma
from tpviz.live.model.gptoss import is_mxfp4, read_gpt_oss
from tpviz.live.model.config import LiveConfig, check_supported
from tpviz.live.model.mla import read_mla
from tpviz.live.model.moe import routing_config
from tpviz.live.load.random_weights import checkpoint_shapes, random_checkpoint
from tpviz.live.model.rope import rope_parameters
from tpviz.live.load.weights import checkpoint_files
from tpviz.deploy.parallel import EP_DENSE
from tpviz.config.spec import ModelSpec
from tpviz.config.normalize import normalize
from tpviz.trace.validity import split_problem
from tpviz.rules import Layout, ruleset

TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json")
MAX_PARAMS_ENV = "TPVIZ_LIVE_MAX_PARAMS"  # the most parameters a live run may build (each rank, and tp=1)
DEFAULT_MAX_PARAMS = 2e9


@dataclass
class ModelSource:
    """A model ready to run: its config, a checkpoint folder, and whether the weights are random."""
    name: str
    cfg: LiveConfig
    checkpoint: Path
    random_weights: bool
    tokenizer_dir: Path | None = None


def live_config(spec: ModelSpec, layers: int | None = None, rules: str = "vllm") -> LiveConfig:
    """Spec plus the facts of its config it has no field for (rope, sliding window, norm_topk_prob, a
    family's extras), optionally shrunk."""
    raw = spec.config
    notes = list(spec.notes)
    wrapped = isinstance(raw.get("text_config"), dict)
    if wrapped:
        raw = raw["text_config"]
        notes.append("Run live runs the text decoder alone: vision tower and multi-modal "
                     "projector weights, if the checkpoint has them, are not read")
    if raw.get("use_sliding_window") is True:
        raise LiveError("use_sliding_window=true (per-layer sliding windows) is not "
                        "supported by the live check")
    # a model-wide window, as the spec reads it (vLLM: the config's sliding_window when there are no
    # layer_types); OLMo-3's sliding layers carry their own (families.py)
    window = (spec.layers[0].mixer.window
              if {x.mixer.kind for x in spec.layers} == {"sliding_attention"} else None)
    # Qwen*-MoE's and DeepSeek-V2's default (transformers'); DeepSeek-V3's is true; Mixtral always
    # renormalizes
    norm_topk = raw.get("norm_topk_prob", spec.arch.renormalize_default)
    if norm_topk is not None and not isinstance(norm_topk, bool):
        raise LiveError(f"norm_topk_prob={norm_topk!r} must be true or false")
    if layers is not None:
        if isinstance(layers, bool) or not isinstance(layers, int) or layers < 1:
            raise LiveError(f"layers={layers!r} must be a positive integer")
        if layers < spec.num_hidden_layers:
            notes.append(f"shrunk to the first {layers} of {spec.num_hidden_layers} layers")
            spec = spec.first_layers(layers)
        elif layers > spec.num_hidden_layers:
            notes.append(f"layers={layers} is more than the model's "
                         f"{spec.num_hidden_layers}: all of them run")
    if spec.tower or spec.audio:  # Run live runs the text decoder (towers: tests/live/test_tower_live.py)
        spec = replace(spec, tower=None, audio=None)
        if not wrapped:  # a wrapped config's note above says it already
            notes.append("the vision tower is not run: the text decoder alone is checked")
    cfg = LiveConfig(spec=spec, mlp_bias=spec.mlp_bias and not spec.arch.live_moe,
                     sliding_window=window if isinstance(window, int) and window > 0 else None,
                     norm_topk_prob=spec.arch.routing == "fp32" or bool(norm_topk), rules=ruleset(rules).name,
                     notes=notes)
    check_supported(cfg.spec)
    # after the family check, so its error comes first; OLMo-3's sliding layers have a RoPE of their own
    if spec.arch.live in ("gemma2", "gemma3"):  # soft-caps, query_pre_attn_scalar, embedding scale, 2 RoPEs
        read_gemma(cfg, raw, wrapped)
    elif spec.is_mla:  # RoPE over qk_rope_head_dim (interleaved), the mscale-adjusted softmax scale
        read_mla(cfg, raw)
    else:
        cfg.rope = rope_parameters(full_rope_config(raw), spec.head_dim, spec.rope_theta)
        cfg.local_rope = sliding_rope(spec, raw, spec.head_dim, spec.rope_theta)
    cfg.routing = routing_config(spec, raw, notes)  # DeepSeek's grouped top-k; {} for the others
    if spec.arch.live == "gpt_oss":  # the experts' clamped SwiGLU; MXFP4 experts must cut in whole blocks
        read_gpt_oss(cfg, raw)
    # transformers' own Phi-3 turns the partial rotary dims too; the others ignore partial_rotary_factor
    if cfg.rope["rotary_dim"] < spec.head_dim and not spec.arch.hf_partial_rotary and not spec.is_mla:
        notes.append(f"partial_rotary_factor: RoPE turns the first {cfg.rope['rotary_dim']} of "
                     f"{spec.head_dim} dims of each head, as vLLM does (transformers' "
                     f"{spec.model_type} ignores it)")
    return cfg


def check_split(cfg: LiveConfig, tp_size: int, ep: bool = False, layout: Layout | None = None) -> None:
    """Raise the layers' own one-line TPSizeError when cfg cannot be split over tp_size (meta tensors: free);
    with ep the routed experts stay whole, so only the other layers must split. An SGLang layout is checked as
    the map checks it (each role at its own width), then built for its first GPU."""
    if ep and not cfg.spec.is_moe:
        raise DenseEPError(EP_DENSE)
    if layout is not None:
        if problem := split_problem(cfg.spec, layout.tp, cfg.rules, layout=layout)[0]:
            raise TPSizeError(problem)
        with torch.device("meta"):
            LiveForCausalLM(cfg, tp_size, 0, Stage.of(cfg.spec, tp_size, 0, rules=cfg.rules, layout=layout))
        return
    # heads before vocab, as users expect
    problem = split_problem(cfg.spec, tp_size, cfg.rules, moe_tp=1 if ep else None)[0]
    if problem:
        raise TPSizeError(f"{problem.rstrip('.')}. Valid tp sizes for this model: {valid_live_sizes(cfg)}.")
    with torch.device("meta"):
        LiveForCausalLM(cfg, tp_size, 0, Stage.of(cfg.spec, tp_size, 0, ep=ep))


def valid_live_sizes(cfg: LiveConfig, max_tp: int = 64) -> str:
    """The tp sizes (up to max_tp) both the layout rules and the live model's own layers accept."""
    sizes = []
    for tp in range(1, max_tp + 1):
        if split_problem(cfg.spec, tp, cfg.rules)[0] is None:
            try:
                with torch.device("meta"):
                    LiveForCausalLM(cfg, tp, 0)
                sizes.append(str(tp))
            except TPSizeError:
                pass
    return ", ".join(sizes) or "none"


@dataclass(frozen=True)
class ModelRead:
    """A model argument read once: its spec (the raw config inside) and, for a local path, where it is."""
    spec: ModelSpec
    path: Path | None = None
    is_dir: bool = False
    hub_id: bool = False  # a preset or hub id, whose real weights a run downloads

    @property
    def name(self) -> str:
        return self.spec.name


def read_model(model) -> ModelRead:
    """Read a checkpoint folder, config.json path, config dict/bytes, or preset/hub id (its config alone).

    Local paths obey the explorer's TPVIZ_LOCAL_ROOT confinement. A ModelRead is returned as it is."""
    if isinstance(model, ModelRead):
        return model
    path = is_dir = None
    if isinstance(model, (str, Path)) and str(model).strip():
        text = str(model).strip()
        if (isinstance(model, Path) or text.startswith((".", "/", "~"))
                or _probe(Path(text).expanduser().exists, text)):
            path = check_local_path(text)
            is_dir = _probe(path.is_dir, text)
    elif not isinstance(model, (dict, bytes, bytearray)):
        raise LiveError("give a model: a checkpoint folder, a config.json, or a preset/hub id")
    raw, name = local_config(path) if is_dir else resolve_config(model)
    return ModelRead(normalize(raw, name), path, bool(is_dir), path is None and isinstance(model, str))


def resolve_model(model, layers: int | None = None, seed: int = 0, tp_size: int | None = None,
                  ep: bool = False, random_weights: bool = False, download=None, rules: str = "vllm",
                  layout: Layout | None = None) -> ModelSource:
    """Turn a checkpoint folder, config.json path, config dict/bytes, or preset/hub id into a ModelSource.

    Local paths obey the explorer's TPVIZ_LOCAL_ROOT confinement; a folder with *.safetensors uses its own
    weights; a preset or hub id downloads its safetensors checkpoint into the Hugging Face cache (or uses the
    cached one offline), reporting `download(message, bytes_done, bytes_total)`. A config alone, or any source
    with random_weights, gets seeded random weights. An invalid split and a model over the parameter cap fail
    before any weights are made or downloaded. `rules` names the rule set the ranks split by; `layout`, an
    SGLang layout carved out of tp (attention DP, --ep).
    """
    read = read_model(model)
    name, path, is_dir = read.name, read.path, read.is_dir
    cfg = live_config(read.spec, layers, rules)
    if tp_size is not None:
        check_split(cfg, tp_size, ep, layout)
    check_size(cfg, layers)  # before any weights are made, here or in the tp=1 reference
    if is_dir:
        tokenizer = path if any((path / f).is_file() for f in TOKENIZER_FILES) else None
        if not random_weights and checkpoint_files(path):
            if cfg.spec.quantization and not is_mxfp4(cfg):  # gpt-oss MXFP4: dequantized while loading
                raise LiveError(f"{name} is {cfg.spec.quantization}-quantized; the live "
                                f"check loads unquantized safetensors (use {RANDOM_FLAG} to run its "
                                "shapes with random ones)")
            return ModelSource(name, cfg, path, False, tokenizer)
        return ModelSource(name, cfg, _random(cfg, seed, random_weights), True, tokenizer)
    if read.hub_id and not random_weights:  # a preset or hub id: its real weights
        return _hub_source(name, cfg, layers, tp_size, ep, download, layout)
    return ModelSource(name, cfg, _random(cfg, seed, random_weights), True)


def _random(cfg: LiveConfig, seed: int, asked: bool) -> Path:
    """The seeded random checkpoint; its note says when they were asked for instead of the model's own."""
    folder = random_checkpoint(cfg, seed)
    if asked:
        cfg.notes[:] = [f"random weights (seed {seed}), as asked: the model's own weights were not used"
                        if n.startswith("random weights") else n for n in cfg.notes]
    return folder


def _hub_source(repo_id: str, cfg: LiveConfig, layers: int | None, tp_size: int | None, ep: bool,
                download, layout: Layout | None = None) -> ModelSource:
    """A hub repo's real weights: checked against the cap first, then downloaded (or found in the cache)."""

    def unquantized(c: LiveConfig) -> LiveConfig:
        if c.spec.quantization and not is_mxfp4(c):  # gpt-oss MXFP4: dequantized while loading
            raise LiveError(f"{repo_id} is {c.spec.quantization}-quantized; the live check loads unquantized "
                            f"safetensors (use {RANDOM_FLAG} to run its shapes with random ones)")
        return c

    unquantized(cfg)  # before downloading what could not be loaded
    got = download_checkpoint(repo_id, layers=layers, progress=download)  # only the shards those layers need
    raw = read_json(str(got.folder / "config.json"), repo_id, "config.json")
    spec = normalize(raw, repo_id)
    cfg = unquantized(live_config(spec, layers, cfg.rules))  # the config the weights were saved with
    if tp_size is not None:
        check_split(cfg, tp_size, ep, layout)
    check_size(cfg, layers)
    cfg.notes.append(got.note())
    if note := shrink_note(got, layers, spec.num_hidden_layers):
        cfg.notes.append(note)
    tokenizer = got.folder if any((got.folder / f).is_file() for f in TOKENIZER_FILES) else None
    return ModelSource(repo_id, cfg, got.folder, False, tokenizer)


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
    one = replace(cfg, notes=[], spec=cfg.spec.first_layers(1))
    hint = ("keep fewer layers with --layers/Layers to keep" if n > 1 and param_count(one) <= limit
            else "even one layer is too big")
    raise LiveError(f"{cfg.spec.name} with {n} layer{'s' if n != 1 else ''} would be {total / 1e9:.1f}B "
                    f"parameters on CPU (limit {limit / 1e9:.1f}B); {hint}, or set {MAX_PARAMS_ENV}")


def local_tokenizer(model) -> Path | None:
    """The folder itself when `model` is a local checkpoint folder with tokenizer files, else None
    (also when TPVIZ_LOCAL_ROOT refuses the path)."""
    if not isinstance(model, (str, Path)) or not str(model).strip():
        return None
    try:
        path = check_local_path(str(model).strip())
        return path if path.is_dir() and any((path / f).is_file() for f in TOKENIZER_FILES) else None
    except (TpvizError, OSError):
        return None

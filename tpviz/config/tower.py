"""A multimodal checkpoint's vision tower, read from its vision_config as vLLM 0.33 builds it beside the text
decoder. Which tower a model has is its wrapper record's `tower` (tpviz.archs); plan/tower.py lays out its
tensors. vLLM reads vision_config through transformers' class, so the class's defaults hold (olmOCR's
config gives two keys and gets Qwen2-VL's whole tower)."""
from dataclasses import asdict, dataclass, replace

from tpviz.archs import arch_of
from tpviz.config.fields import read_int, read_object
from tpviz.errors import ConfigError

MODES = ("weights", "data")  # --mm-encoder-tp-mode: split the tower's weights, or run it whole per GPU
TOWER_FILES = {"qwen2_vl": "qwen2_vl.py", "qwen2_5_vl": "qwen2_5_vl.py", "qwen3_vl": "qwen3_vl.py",
               "siglip": "siglip.py and gemma3_mm.py"}


@dataclass(frozen=True)
class Tower:
    """The dims that decide a vision tower's tensors, under vLLM's names for them."""
    kind: str  # the builder in plan/tower.py: qwen2_vl, qwen2_5_vl, qwen3_vl
    prefix: str  # its checkpoint names' prefix (before transformers 4.52: "visual.")
    hidden: int
    heads: int
    intermediate: int
    depth: int
    out_hidden: int  # the text decoder's width, which the merger projects to
    merge: int  # spatial_merge_size: the merger takes merge² patches at once
    patch: tuple  # the patch embedding's kernel: (in_channels, temporal, patch, patch)
    positions: int = 0  # a learned position table's rows (Qwen3-VL)
    deepstack: int = 0  # extra mergers fed from middle blocks (Qwen3-VL's deepstack_visual_indexes)
    data_parallel: bool = False  # --mm-encoder-tp-mode data: whole on every GPU, each runs its own images
    supports_data: bool = False  # the model class allows data mode (vLLM's supports_encoder_tp_data)
    block_path: str = "blocks"  # where the blocks sit under prefix (SigLIP: encoder.layers)
    projector: str = ""  # the projector's own prefix, when it sits outside the tower's (Gemma-3)

    @property
    def file(self) -> str:
        return TOWER_FILES[self.kind]

    @property
    def blocks(self) -> str:
        return f"{self.prefix}{self.block_path}.*."

    @property
    def heads_key(self) -> str:
        """Its heads as vision_config names them."""
        return "vision_config." + ("num_attention_heads" if self.kind == "siglip" else "num_heads")

    @property
    def prefixes(self) -> tuple[str, ...]:
        """Where its checkpoint names start (the tower's, then a projector's of its own)."""
        return (self.prefix, self.projector) if self.projector else (self.prefix,)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict | None) -> "Tower | None":
        return cls(**{**d, "patch": tuple(d["patch"])}) if d else None


def _int(vc: dict, *keys, default=None) -> int:
    try:
        return read_int(vc, *keys, default=default)
    except ConfigError as e:  # the key as the user finds it in config.json
        raise type(e)(f"vision_config: {e}") from None


def read_tower(outer: dict) -> Tower | None:
    """The tower of a multimodal config as its wrapper's record names it; None where tpviz does not model
    it."""
    kind = arch_of(str(outer.get("model_type", ""))).tower
    vc = read_object(outer, "vision_config")
    if not kind or not vc:
        return None
    if kind == "siglip":  # Gemma-3: SigLIP (vision_tower.vision_model), then a replicated projector
        patch, text = _int(vc, "patch_size", default=14), read_object(outer, "text_config")
        tower = Tower(kind, "vision_tower.vision_model.", _int(vc, "hidden_size"),
                      _int(vc, "num_attention_heads"), _int(vc, "intermediate_size"),
                      _int(vc, "num_hidden_layers"), _int(text, "hidden_size"), 1,
                      (_int(vc, "num_channels", default=3), patch, patch),
                      positions=(_int(vc, "image_size", default=224) // patch) ** 2,
                      block_path="encoder.layers", projector="multi_modal_projector.")  # no data mode
    else:
        patch = _int(vc, "patch_size", "spatial_patch_size", default=14)
        kernel = (_int(vc, "in_channels", "in_chans", default=3), _int(vc, "temporal_patch_size", default=2),
                  patch, patch)
        common = dict(kind=kind, prefix="visual.", depth=_int(vc, "depth"), heads=_int(vc, "num_heads"),
                      merge=_int(vc, "spatial_merge_size", default=2), patch=kernel,
                      supports_data=True)  # qwen2_vl.py, qwen2_5_vl.py and qwen3_vl.py all set it
        if kind == "qwen2_vl":  # embed_dim wide, mlp_ratio × wider MLP; hidden_size is the decoder's width
            hidden = _int(vc, "embed_dim")
            tower = Tower(hidden=hidden, intermediate=int(hidden * float(vc.get("mlp_ratio", 4))),
                          out_hidden=_int(vc, "hidden_size"), **common)
        else:
            qwen3 = kind == "qwen3_vl"
            tower = Tower(hidden=_int(vc, "hidden_size"), intermediate=_int(vc, "intermediate_size"),
                          out_hidden=_int(vc, "out_hidden_size"),
                          positions=_int(vc, "num_position_embeddings", default=0) if qwen3 else 0,
                          deepstack=len(vc.get("deepstack_visual_indexes") or []) if qwen3 else 0, **common)
    if tower.hidden % tower.heads:
        raise ConfigError(f"vision_config: hidden size {tower.hidden} is not divisible by "
                          f"{tower.heads} heads")
    return tower


def encoder_mode(tower: Tower | None, mode: str) -> tuple[Tower | None, str]:
    """The tower under --mm-encoder-tp-mode, and a note when vLLM falls back (a model without data mode)."""
    if mode not in MODES:
        raise ConfigError(f"mm_encoder_tp_mode={mode!r}: use one of {', '.join(MODES)}")
    if tower is None:
        return None, ""
    if mode == "data" and not tower.supports_data:
        return replace(tower, data_parallel=False), ("this model does not support --mm-encoder-tp-mode data; "
                                                     "vLLM falls back to weights, as drawn")
    return replace(tower, data_parallel=mode == "data"), (
        "--mm-encoder-tp-mode data: every GPU holds the whole vision tower and encodes its own share of the "
        "images" if mode == "data" else "")

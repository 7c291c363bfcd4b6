"""A multimodal checkpoint's vision tower, read from its vision_config as vLLM 0.33 builds it beside the text
decoder. Which tower a model has is its wrapper record's `tower` (tpviz.archs); plan/tower.py lays out its
tensors. vLLM reads vision_config through transformers' class, so the class's defaults hold (olmOCR's
config gives two keys and gets Qwen2-VL's whole tower)."""
from dataclasses import asdict, dataclass, replace
from functools import partial

from tpviz.archs import arch_of
from tpviz.archs.vision import deepseek_ocr
from tpviz.config.fields import read_object
from tpviz.config.fields import vision_int as _int
from tpviz.config.tower_dims import deepseek_ocr as deepencoder, glm4v, interns1, internvit
from tpviz.config.tower_llava import LLAVA, VISION, llava_tower
from tpviz.config.tower_readers import deepseek_vl2, llama4, minicpmv, minicpmv4_6, moonvit
from tpviz.errors import ConfigError

MODES = ("weights", "data")  # --mm-encoder-tp-mode: split the tower's weights, or run it whole per GPU
TOWER_FILES = {"qwen2_vl": "qwen2_vl.py", "qwen2_5_vl": "qwen2_5_vl.py", "qwen3_vl": "qwen3_vl.py",
               "siglip": "siglip.py and gemma3_mm.py", "pixtral": "pixtral.py and mistral3.py",
               "llama4": "mllama4.py", "moonvit": "kimi_k25_vit.py and kimi_k25.py",
               "moonvit_vl": "moonvit.py and kimi_vl.py",
               "internvit": "intern_vit.py and internvl.py", "glm4v": "glm4_1v.py",
               "interns1": "interns1_vit.py and interns1.py",
               "minicpmv": "idefics2_vision_model.py and minicpmv.py",
               "deepseek_vl2": "deepseek_vl2.py, timm's vit_so400m_patch14_siglip_384"}
# audio towers (config/tower_audio.py)
TOWER_FILES["qwen2_audio"] = "qwen2_audio.py, transformers' Qwen2AudioEncoder"
AUDIO = ("qwen2_audio", "qwen2_5_omni_audio", "qwen3_omni_audio")
TOWER_FILES |= {"qwen2_5_omni": "qwen2_5_vl.py and qwen2_5_omni_thinker.py",
                "qwen2_5_omni_audio": "qwen2_5_omni_thinker.py, transformers' Qwen2_5OmniAudioEncoder",
                "qwen3_omni": "qwen3_omni_moe_thinker.py", "qwen3_omni_audio": "qwen3_omni_moe_thinker.py"}
# towers vLLM builds as transformers' own modules, whole on every GPU (config/tower_hf.py, plan/tower_hf.py)
TOWER_FILES |= {"gemma4_vision": "gemma4_mm.py, transformers' Gemma4VisionModel",
                "gemma4_audio": "gemma4_mm.py, transformers' Gemma4AudioModel",
                "gemma3n_audio": "gemma3n_mm.py, transformers' Gemma3nAudioEncoder"}
HF_KINDS = ("gemma4_vision", "gemma4_audio", "gemma3n_audio")
AUDIO += ("gemma4_audio", "gemma3n_audio")
QWEN_KINDS = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen2_5_omni", "qwen3_omni")  # heads named num_heads
# the towers whose vLLM class supports --mm-encoder-tp-mode data (supports_encoder_tp_data: qwen2_vl.py,
# qwen2_5_vl.py, qwen3_vl.py, mllama4.py, kimi_k25.py, minicpmv.py); gemma3_mm.py, mistral3.py and
# deepseek_vl2.py do not, so vLLM falls back to weights
# (qwen2_5_omni_thinker.py does not, though its tower is qwen2_5_vl.py's)
DATA_MODE = (*QWEN_KINDS[:3], "llama4", "moonvit", "moonvit_vl", "minicpmv")  # kimi_vl.py too
DATA_MODE += ("internvit", "glm4v")  # internvl.py and glm4_1v.py support it too
OWN_READERS = {"internvit": internvit, "glm4v": glm4v, "interns1": interns1}  # config/tower_dims.py
# config/tower_llava.py: each LLaVA wrapper's record kind, then the tower it builds ('{wrapper}_{vision}')
OWN_READERS |= {k: partial(llava_tower, kind=k) for k in ("pixtral", *LLAVA)}
TOWER_FILES |= {"llava": "llava.py with pixtral.py, clip.py or siglip.py",
                "llava_pixtral": "pixtral.py and llava.py"}
TOWER_FILES |= {w: f"{w}.py with clip.py or siglip.py" for w in LLAVA[1:]}
TOWER_FILES |= {f"{w}_{v}": f"{v}.py and {w}.py" for w in LLAVA for v in VISION.values()}
# DeepSeek-OCR: deepseek_vl2's model_type, told apart by architectures; no supports_encoder_tp_data
TOWER_FILES["deepseek_ocr"] = "deepseek_ocr.py and deepencoder.py (SAM ViT-B, CLIP-L)"
OWN_READERS["deepseek_ocr"] = deepencoder
# config/tower_readers.py; None: a projector built otherwise (Kimi, DeepSeek-VL2), or MiniCPM-V 2.5 on
# without a vision_config, left out
OWN_READERS |= {"llama4": llama4, "moonvit": partial(moonvit, kind="moonvit"), "deepseek_vl2": deepseek_vl2,
                "moonvit_vl": partial(moonvit, kind="moonvit_vl"), "minicpmv": minicpmv,
                **{k: partial(minicpmv4_6, kind=k) for k in ("minicpmv4_6", "minicpmv4_7")}}
# minicpmv4_6.py (4.7: minicpmv4_7.py, its subclass); supports_encoder_tp_data
TOWER_FILES |= {"minicpmv4_6": "idefics2_vision_model.py and minicpmv4_6.py",
                "minicpmv4_7": "idefics2_vision_model.py and minicpmv4_7.py"}
DATA_MODE += ("minicpmv4_6", "minicpmv4_7")
# MiniCPM-V 2.0 (minicpmv.py's MiniCPMV2_0): timm's so400m, none of it split (its registry class takes the
# data flag, which changes nothing there)
TOWER_FILES |= {"minicpmv2_0": "minicpmv.py, timm's vit_so400m_patch14_siglip_384"}
DATA_MODE += ("minicpmv2_0",)


@dataclass(frozen=True)
class Tower:
    """The dims that decide a vision tower's tensors, under vLLM's names for them."""
    kind: str  # its builder in plan/tower.py: qwen2_vl, qwen2_5_vl, qwen3_vl, siglip, pixtral, llama4 ...
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
    proj_bias: bool = False  # the projector's linears carry biases (multimodal_projector_bias)
    # Llama-4's pixel-shuffle adapter and projector: (projector_input_dim, projector_output_dim,
    # vision_output_dim)
    adapter: tuple = ()
    grid: tuple = ()  # a 2-D position table's (height, width): MoonViT's pos_emb [height, width, hidden]
    options: tuple = ()  # its builder's switches the config sets (InternViT: qkv_bias, qk_norm, rms_norm)
    queries: int = 0  # a perceiver resampler's learned queries (MiniCPM-V's query_num)
    mlp: tuple = ()  # a projector MLP's widths, input first (DeepSeek-VL2's downsample_mlp_gelu)
    extras: tuple = ()  # names outside both prefixes (DeepSeek-VL2's image_newline, view_seperator)
    stored: int = 0  # the checkpoint's blocks where vLLM builds fewer (vision_feature_layer) and skips some
    dropped: tuple = ()  # checkpoint names its loader drops (CLIP's post_layernorm without require_post_norm)
    hf_config: str = ""  # a transformers-built tower's sub-config as JSON (HF_KINDS), which its modules read

    @property
    def file(self) -> str:
        return TOWER_FILES[self.kind]

    @property
    def medium(self) -> str:
        """What it encodes, which names its family and figure tab: vision or audio."""
        return "audio" if self.kind in AUDIO else "vision"

    @property
    def blocks(self) -> str:
        return f"{self.prefix}{self.block_path}.*."

    @property
    def heads_key(self) -> str:
        """Its heads as vision_config names them."""
        if self.kind == "deepseek_ocr":  # set in deepseek_ocr.py, not read from the config
            return "deepseek_ocr.py's CLIP-L num_attention_heads"
        return "vision_config." + ("num_heads" if self.kind in (*QWEN_KINDS, "glm4v")
                                   else "num_attention_heads")

    @property
    def prefixes(self) -> tuple[str, ...]:
        """Where its checkpoint names start (the tower's, then a projector's of its own)."""
        return (self.prefix, self.projector, *self.extras) if self.projector else (self.prefix,)

    def to_dict(self) -> dict:
        d = asdict(self)
        if not d["hf_config"]:  # a transformers-built tower's alone: other towers' records stay as they were
            del d["hf_config"]
        return d

    @classmethod
    def from_dict(cls, d: dict | None) -> "Tower | None":
        d = {**d, "options": tuple(d.get("options", ()))} if d else d
        return cls(**{**d, "patch": tuple(d["patch"]), "adapter": tuple(d.get("adapter", ())),
                      "grid": tuple(d.get("grid", ())), "mlp": tuple(d.get("mlp", ())),
                      "extras": tuple(d.get("extras", ())),
                      "dropped": tuple(d.get("dropped", ()))}) if d else None


def deepstack(vc: dict, depth: int) -> list[int]:
    """Qwen3-VL's deepstack_visual_indexes: the blocks whose outputs feed a deepstack merger each."""
    found = vc.get("deepstack_visual_indexes") or []
    if not (isinstance(found, list) and all(type(i) is int and 0 <= i < depth for i in found)):  # not bools
        raise ConfigError(f"vision_config: deepstack_visual_indexes={found!r} is not a list of block indexes "
                          f"below depth={depth}")
    return found


def read_tower(outer: dict) -> Tower | None:
    """The tower of a multimodal config as its wrapper's record names it; None where tpviz does not model
    it."""
    kind = arch_of(str(outer.get("model_type", ""))).tower
    kind = "deepseek_ocr" if kind == "deepseek_vl2" and deepseek_ocr(outer) else kind
    vc = read_object(outer, "vision_config")
    if not kind or not (vc or kind == "minicpmv"):  # MiniCPM-V 2.0 names timm's model, not a vision_config
        return None
    if kind in HF_KINDS:  # transformers' own modules: config/tower_hf.py
        return None
    if kind == "siglip":  # Gemma-3: SigLIP (vision_tower.vision_model), then a replicated projector
        patch, text = _int(vc, "patch_size", default=14), read_object(outer, "text_config")
        tower = Tower(kind, "vision_tower.vision_model.", _int(vc, "hidden_size"),
                      _int(vc, "num_attention_heads"), _int(vc, "intermediate_size"),
                      _int(vc, "num_hidden_layers"), _int(text, "hidden_size"), 1,
                      (_int(vc, "num_channels", default=3), patch, patch),
                      positions=(_int(vc, "image_size", default=224) // patch) ** 2,
                      block_path="encoder.layers", projector="multi_modal_projector.")
    elif kind in OWN_READERS:  # None: left out (a quantized checkpoint, a tower the wrapper does not build)
        if (dims := OWN_READERS[kind](outer, vc)) is None:
            return None
        tower = Tower(**dims)
    else:
        patch = _int(vc, "patch_size", "spatial_patch_size", default=14)
        kernel = (_int(vc, "in_channels", "in_chans", default=3), _int(vc, "temporal_patch_size", default=2),
                  patch, patch)
        common = dict(kind=kind, prefix="visual.", depth=_int(vc, "depth"), heads=_int(vc, "num_heads"),
                      merge=_int(vc, "spatial_merge_size", default=2), patch=kernel)
        if kind == "qwen2_vl":  # embed_dim wide, mlp_ratio × wider MLP; hidden_size is the decoder's width
            hidden = _int(vc, "embed_dim")
            tower = Tower(hidden=hidden, intermediate=int(hidden * float(vc.get("mlp_ratio", 4))),
                          out_hidden=_int(vc, "hidden_size"), **common)
        else:
            qwen3, positions = kind in ("qwen3_vl", "qwen3_omni"), 0
            if kind == "qwen3_omni":  # qwen3_omni_moe_thinker.py: an nn.Embedding of (image / patch)² cells
                if vc.get("apply_vit_abs_pos_embed", True) is not True:
                    raise ConfigError("vision_config: apply_vit_abs_pos_embed other than true (a bare "
                                      "position parameter) is not modelled")
                positions = (_int(vc, "image_size") // common["patch"][-1]) ** 2
            elif qwen3:
                positions = _int(vc, "num_position_embeddings", default=0)
            tower = Tower(hidden=_int(vc, "hidden_size"), intermediate=_int(vc, "intermediate_size"),
                          out_hidden=_int(vc, "out_hidden_size"), positions=positions,
                          deepstack=len(deepstack(vc, common["depth"])) if qwen3 else 0, **common)
    tower = replace(tower, supports_data=kind in DATA_MODE)
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

"""The dims of InternVL's InternViT, GLM-4.1V / 4.5V's vision tower and DeepSeek-OCR's DeepEncoder as vLLM
0.33 builds them, read into the fields of config/tower.py's Tower (which builds the record: this module stays
below it)."""
from functools import partial

from tpviz.config.fields import read_int, read_int_in, read_object
from tpviz.config.fields import vision_int as _int
from tpviz.errors import ConfigError, MissingFieldError

NORMS = ("rms_norm", "layer_norm")  # intern_vit.py's NORM2FN


def _given(vc: dict, key: str, kinds: tuple) -> object:
    """A key intern_vit.py reads that only the checkpoint's remote-code InternVisionConfig would default
    (tpviz never runs it): given in config.json, or refused."""
    if vc.get(key) is None:
        raise MissingFieldError(f"vision_config is missing {key}, which vLLM 0.33's intern_vit.py reads (the "
                                "checkpoint's own remote-code config class would default it)", key)
    if not isinstance(vc[key], kinds) or (kinds == (str,) and vc[key] not in NORMS):
        raise ConfigError(f"vision_config: {key}={vc[key]!r} is not one intern_vit.py reads")
    return vc[key]


def internvit(outer: dict, vc: dict) -> dict | None:
    """internvl.py's InternVisionModel, built up to select_layer, and its mlp1 projector (pixel shuffle by
    downsample_ratio, then LayerNorm, Linear, GELU, Linear). None (left out, named) when the checkpoint is
    quantized: internvl.py hands the quantization to the tower, which tpviz does not draw."""
    if outer.get("quantization_config"):
        return None
    depth, select = _int(vc, "num_hidden_layers"), outer.get("select_layer", -1)
    if not isinstance(select, int) or isinstance(select, bool) or not -depth <= select < depth:
        raise ConfigError(f"select_layer={select!r} is no layer of the {depth}-layer vision tower")
    ratio = outer.get("downsample_ratio", 0.5)
    if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0 < ratio <= 1:
        raise ConfigError(f"downsample_ratio={ratio!r} is not a number in (0, 1]")
    if vc.get("use_moe"):
        raise ConfigError("vision_config: use_moe=true, but vLLM 0.33's intern_vit.py builds dense MLPs "
                          "alone")
    qkv_bias, qk_norm = _given(vc, "qkv_bias", (bool,)), _given(vc, "qk_normalization", (bool,))
    norm_type = _given(vc, "norm_type", (str,))
    patch, image = _int(vc, "patch_size"), _int(vc, "image_size")
    return dict(kind="internvit", prefix="vision_model.", hidden=_int(vc, "hidden_size"),
                heads=_int(vc, "num_attention_heads"), intermediate=_int(vc, "intermediate_size"),
                depth=depth + select + 1 if select < 0 else select + 1,  # internvl.py's _init_vision_model
                out_hidden=read_int(read_object(outer, "text_config"), "hidden_size"),
                merge=int(1 / ratio),  # mlp1 takes int(1 / downsample_ratio)² patches at once
                patch=(3, patch, patch),  # InternVisionEmbeddings' Conv2d: 3 input channels, always
                positions=(image // patch) ** 2 + 1,  # the patches and the class token
                block_path="encoder.layers", projector="mlp1.", proj_bias=True,
                options=tuple(name for name, on in (("qkv_bias", qkv_bias), ("qk_norm", qk_norm),
                                                    ("rms_norm", norm_type == "rms_norm")) if on))


def glm4v(outer: dict, vc: dict) -> dict | None:
    """glm4_1v.py's Glm4vVisionTransformer (vision_config read through transformers' Glm4vVisionConfig, so its
    defaults hold). None (left out, named) when the checkpoint is quantized: glm4_1v.py hands the quantization
    to the tower."""
    if outer.get("quantization_config"):
        return None
    if vc.get("attention_bias"):  # Glm4vVisionAttention builds qkv without a bias, so vLLM could not load one
        raise ConfigError("vision_config: attention_bias=true, but vLLM 0.33's glm4_1v.py builds the vision "
                          "attention without biases and cannot load them")
    patch = _int(vc, "patch_size")
    return dict(kind="glm4v", prefix="visual.", hidden=_int(vc, "hidden_size"), heads=_int(vc, "num_heads"),
                intermediate=_int(vc, "intermediate_size"), depth=_int(vc, "depth"),
                out_hidden=_int(vc, "out_hidden_size"), merge=_int(vc, "spatial_merge_size"),
                patch=(_int(vc, "in_channels"), _int(vc, "temporal_patch_size"), patch, patch),
                positions=(_int(vc, "image_size") // patch) ** 2)


def _pair(vc: dict, key: str) -> tuple[int, int]:
    """An image or patch size InternVLVisionConfig gives as [height, width] (or one number)."""
    value = vc.get(key)
    values = value if isinstance(value, list) and len(value) == 2 else [value, value]
    return tuple(_int({key: v}, key) for v in values)


def interns1(outer: dict, vc: dict) -> dict | None:
    """interns1_vit.py's InternS1VisionModel and interns1.py's projector, as vLLM 0.33 builds InternVL's
    transformers-format checkpoints (InternVLForConditionalGeneration; vision_config read through
    transformers' InternVLVisionConfig, so its defaults hold). None (left out, named) when the checkpoint is
    quantized: interns1.py hands the quantization to the tower."""
    if outer.get("quantization_config"):
        return None
    ratio = outer.get("downsample_ratio", 0.5)
    if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0 < ratio <= 1:
        raise ConfigError(f"downsample_ratio={ratio!r} is not a number in (0, 1]")
    (ih, iw), (ph, pw) = _pair(vc, "image_size"), _pair(vc, "patch_size")
    flags = (("qkv_bias", "attention_bias"), ("qk_norm", "use_qk_norm"), ("mask_token", "use_mask_token"),
             ("positions", "use_absolute_position_embeddings"))
    norm_type = vc.get("norm_type", "layer_norm")
    if norm_type not in NORMS:
        raise ConfigError(f"vision_config: norm_type={norm_type!r} is not one interns1_vit.py reads")
    return dict(kind="interns1", prefix="vision_tower.", hidden=_int(vc, "hidden_size"),
                heads=_int(vc, "num_attention_heads"), intermediate=_int(vc, "intermediate_size"),
                depth=_int(vc, "num_hidden_layers"),
                out_hidden=read_int(read_object(outer, "text_config"), "hidden_size"), merge=int(1 / ratio),
                patch=(_int(vc, "num_channels"), ph, pw), positions=(ih // ph) * (iw // pw) + 1,
                block_path="encoder.layer", projector="multi_modal_projector.", proj_bias=True,
                options=tuple(name for name, key in flags if vc.get(key))
                + (("rms_norm",) if norm_type == "rms_norm" else ())
                + (() if vc.get("use_mean_pooling", True) else ("final_norm",)))


# deepencoder.py's build_sam_vit_b (what deepseek_ocr.py builds, whatever vision_config says): width, heads,
# blocks, MLP width (mlp_ratio 4), patch, image size, the window of the windowed blocks and the global ones,
# the neck's channels and the two stride-2 convolutions after it (net_2, net_3)
SAM_VIT_B = dict(hidden=768, heads=12, depth=12, intermediate=3072, patch=16, image=1024, window=14,
                 global_blocks=(2, 5, 8, 11), neck=256, downsample=(512, 1024))
# deepseek_ocr.py's CLIPVisionConfig, given in the file: CLIP-L/14 at 224 (its input is SAM's features, so the
# patch embedding is loaded but unused)
CLIP_L = dict(hidden=1024, heads=16, intermediate=4096, depth=24, patch=14, image=224)
OCR_PROJECTORS = ("linear", "downsample_mlp_gelu")  # deepseek_vl2.py's MlpProjector raises for any other


def deepseek_ocr(outer: dict, vc: dict) -> dict | None:
    """deepseek_ocr.py's DeepEncoder: SAM ViT-B (SAM_VIT_B) under model.sam_model., CLIP-L (CLIP_L, clip.py's
    encoder layers) under model.vision_model., then MlpProjector (projector_config, read as
    MlpProjectorConfig with its defaults) and two learned vectors of its width. None (left out, named) when
    the checkpoint is quantized: deepseek_ocr.py hands the quantization to CLIP's layers."""
    if outer.get("quantization_config"):
        return None
    pc = outer.get("projector_config") or {}
    if not isinstance(pc, dict):
        raise ConfigError(f"projector_config={pc!r} is not an object")
    kind = pc.get("projector_type", "downsample_mlp_gelu")
    if kind not in OCR_PROJECTORS:
        raise ConfigError(f"projector_config: projector_type={kind!r}, which vLLM 0.33's MlpProjector "
                          f"(deepseek_vl2.py) does not build: it builds {' or '.join(OCR_PROJECTORS)}")
    if pc.get("token_pooling"):
        raise ConfigError("projector_config: token_pooling, which vLLM 0.33's MlpProjector refuses")
    size = partial(read_int_in, "projector_config", pc)  # MlpProjectorConfig's default where not given
    n, inp = size("n_embed", default=2048), size("input_dim", default=1152)
    if kind == "linear":  # one nn.Linear in the Sequential's place: layers.weight
        widths = (inp, n)
    else:  # a GELU between each two: layers.0, layers.2, ...
        down, wide = size("downsample_ratio", default=2), n * size("mlp_ratio", default=1)
        widths = (inp * down ** 2, *[wide] * (1 + max(size("depth", default=2) - 2, 0)), n)
    c = CLIP_L
    return dict(kind="deepseek_ocr", prefix="model.vision_model.", hidden=c["hidden"], heads=c["heads"],
                intermediate=c["intermediate"], depth=c["depth"], out_hidden=n, merge=1,
                patch=(3, c["patch"], c["patch"]), positions=(c["image"] // c["patch"]) ** 2 + 1,
                block_path="transformer.layers", projector="model.projector.", proj_bias=True, mlp=widths,
                options=("linear_projector",) if kind == "linear" else (),
                extras=("model.sam_model.", "model.image_newline", "model.view_seperator"))

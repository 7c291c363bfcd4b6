"""The dims of the towers llava.py, llava_next.py, llava_onevision.py and mistral3.py build, as vLLM 0.33
does: Pixtral's (PixtralHFVisionModel), CLIP's (clip.py) or SigLIP's (siglip.py), each only up to
vision_feature_layer, then the wrapper's projector. Read into the fields of config/tower.py's Tower (which
builds the record: this module stays below it)."""

from tpviz.config.fields import read_object
from tpviz.config.fields import vision_int as _int
from tpviz.errors import ConfigError

# the wrappers whose config class defaults to a biased projector (LlavaConfig, LlavaNextConfig and
# LlavaOnevisionConfig; Mistral3Config's is unbiased), and the feature layer each defaults to (Mistral3's: -1)
LLAVA = ("llava", "llava_next", "llava_onevision")
FEATURE_LAYER = {"llava": -2, "llava_next": -2, "llava_onevision": -1}
VISION = {"clip_vision_model": "clip", "siglip_vision_model": "siglip"}  # vision_config's model_type


def built_blocks(outer: dict, depth: int, kind: str) -> int:
    """The blocks vLLM builds: up to the deepest vision_feature_layer (llava.py's get_layer_index); its loader
    skips the checkpoint's others."""
    feature = outer.get("vision_feature_layer", FEATURE_LAYER.get(kind, -1))
    layers = feature if isinstance(feature, list) and feature else [feature]
    if not all(isinstance(i, int) and not isinstance(i, bool) and -depth <= i < depth for i in layers):
        raise ConfigError(f"vision_feature_layer={feature!r} is no layer of the {depth}-layer vision tower")
    return max(depth + i + 1 if i < 0 else i for i in layers)


def _projector_bias(outer: dict, llava: bool) -> bool:
    bias = outer.get("multimodal_projector_bias", llava)
    if not isinstance(bias, bool):
        raise ConfigError(f"multimodal_projector_bias={bias!r} is not true or false")
    return bias


def pixtral(outer: dict, vc: dict, kind: str) -> dict:
    """PixtralHFVisionModel (mistral3.py, or llava.py for Pixtral-12B); neither class has a data mode."""
    patch, text, depth = _int(vc, "patch_size", default=16), read_object(outer, "text_config"), \
        _int(vc, "num_hidden_layers", default=24)
    llava = kind == "llava"
    return dict(kind="llava_pixtral" if llava else kind, prefix="vision_tower.",
                hidden=_int(vc, "hidden_size", default=1024),
                heads=_int(vc, "num_attention_heads", default=16),
                intermediate=_int(vc, "intermediate_size", default=4096),
                depth=built_blocks(outer, depth, kind), out_hidden=_int(text, "hidden_size"),
                merge=_int(outer, "spatial_merge_size", default=2),
                patch=(_int(vc, "num_channels", default=3), patch, patch), block_path="transformer.layers",
                projector="multi_modal_projector.", proj_bias=_projector_bias(outer, llava), stored=depth)


def clip(outer: dict, vc: dict, kind: str, siglip: bool = False) -> dict:
    """clip.py's CLIPVisionModel (or siglip.py's SiglipVisionModel) as llava.py / llava_next.py build it
    (require_post_norm=False: no post_layernorm; SigLIP without its pooling head), the config class's defaults
    where vision_config leaves a size out; LLaVA-NeXT and LLaVA-OneVision add their image_newline, whole."""
    patch, text, depth = _int(vc, "patch_size", default=16 if siglip else 32), \
        read_object(outer, "text_config"), _int(vc, "num_hidden_layers", default=12)
    image = _int(vc, "image_size", default=224)
    if image % patch and not siglip:  # clip.py asserts it; siglip.py floors (SO400M: 384 / 14 -> 27 x 27)
        raise ConfigError(f"vision_config: image_size={image} is not a multiple of patch_size={patch}")
    dropped = ("post_layernorm.weight", "post_layernorm.bias") + (
        ("head.probe", "head.attention.in_proj_weight", "head.attention.in_proj_bias",
         "head.attention.out_proj.weight", "head.attention.out_proj.bias", "head.layernorm.weight",
         "head.layernorm.bias", "head.mlp.fc1.weight", "head.mlp.fc1.bias", "head.mlp.fc2.weight",
         "head.mlp.fc2.bias") if siglip else ())
    return dict(kind=f"{kind}_{'siglip' if siglip else 'clip'}", prefix="vision_tower.vision_model.",
                hidden=_int(vc, "hidden_size", default=768),
                heads=_int(vc, "num_attention_heads", default=12),
                intermediate=_int(vc, "intermediate_size", default=3072),
                depth=built_blocks(outer, depth, kind), out_hidden=_int(text, "hidden_size"), merge=1,
                patch=(_int(vc, "num_channels", default=3), patch, patch),
                positions=(image // patch) ** 2 + (0 if siglip else 1),  # CLIP's class token has one
                block_path="encoder.layers", projector="multi_modal_projector.",
                proj_bias=_projector_bias(outer, True), stored=depth,
                extras=("image_newline",) if kind != "llava" else (),
                dropped=tuple(f"vision_tower.vision_model.{name}" for name in dropped))


def llava_tower(outer: dict, vc: dict, kind: str) -> dict | None:
    """The tower a LLaVA wrapper (or Mistral-3) builds from vision_config; None (left out, named) for one it
    builds otherwise: llava_next.py and llava_onevision.py take no Pixtral tower here."""
    if not isinstance(vc.get("model_type", ""), str):
        raise ConfigError(f"vision_config: model_type={vc['model_type']!r} is not a name")
    if kind == "pixtral" or (kind == "llava" and vc.get("model_type") == "pixtral"):
        return pixtral(outer, vc, kind)
    vision = VISION.get(vc.get("model_type"))
    return clip(outer, vc, kind, siglip=vision == "siglip") if vision else None

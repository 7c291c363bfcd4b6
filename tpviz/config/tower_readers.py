"""The towers whose wrapper builds more than a plain ViT: Llama-4's (mllama4.py), Kimi's MoonViT
(kimi_k25_vit.py, moonvit.py), MiniCPM-V's (minicpmv.py, minicpmv4_6.py) and DeepSeek-VL2's (deepseek_vl2.py),
read as vLLM 0.33 reads them into the fields of config/tower.py's Tower (which builds the record: this module
stays below it). None: left out, and named there."""
from math import isqrt

from tpviz.archs.vision import minicpmv_version
from tpviz.config.fields import read_object
from tpviz.config.fields import vision_int as _int
from tpviz.errors import ConfigError

# timm's vit_so400m_patch14_siglip_384, which deepseek_vl2.py builds whatever vision_config says: width,
# heads, MLP width (int(1152 x 3.7362)), blocks, patch, image size
SO400M = dict(hidden=1152, heads=16, intermediate=4304, depth=27, patch=14, image=384)
# the text_config keys that shape Kimi-VL's decoder weights (or its router's score bias) and that vLLM's
# KimiVLConfig fills from DeepseekV2Config's defaults when absent (q_lora_rank 1536, topk_method greedy, ...)
KIMI_VL_TEXT_KEYS = ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim",
                     "n_routed_experts", "n_shared_experts", "moe_intermediate_size", "intermediate_size",
                     "first_k_dense_replace", "topk_method")


def llama4(outer: dict, vc: dict) -> dict:
    """mllama4.py: an unfold patch embedding, a class token and a position table, the encoder, the
    pixel-shuffle adapter; then the projector outside the tower. Llama4ForConditionalGeneration supports
    data mode."""
    patch, text = _int(vc, "patch_size", default=14), read_object(outer, "text_config")
    bias = vc.get("multi_modal_projector_bias", False)
    if not isinstance(bias, bool):
        raise ConfigError(f"vision_config: multi_modal_projector_bias={bias!r} is not true or false")
    mid, out = _int(vc, "projector_input_dim", default=4096), _int(vc, "projector_output_dim", default=4096)
    if mid != out:  # vLLM builds the adapter's fc2 [output, input], transformers [output, output]
        raise ConfigError(f"vision_config: projector_input_dim={mid} differs from "
                          f"projector_output_dim={out}; vLLM 0.33's adapter (mllama4.py) cannot load such a "
                          "checkpoint")
    return dict(kind="llama4", prefix="vision_model.", hidden=_int(vc, "hidden_size", default=768),
                heads=_int(vc, "num_attention_heads", default=16),
                intermediate=_int(vc, "intermediate_size", default=5632),
                depth=_int(vc, "num_hidden_layers", default=34), out_hidden=_int(text, "hidden_size"),
                merge=1,
                patch=(_int(vc, "num_channels", default=3), patch, patch),
                positions=(_int(vc, "image_size", default=448) // patch) ** 2 + 1,
                block_path="model.layers", projector="multi_modal_projector.", proj_bias=bias,
                adapter=(mid, out, _int(vc, "vision_output_dim", default=7680)))


def moonvit(outer: dict, vc: dict, kind: str) -> dict | None:
    """kimi_k25_vit.py's MoonViT (its vision_config read through transformers' Kimi_K25VisionConfig, which
    names the vt_* keys as usual) and kimi_k25.py's patchmerger projector. None, so left out and named, for
    what vLLM 0.33 builds otherwise: another projector type, or a quantization other than compressed-tensors,
    which kimi_k25.py passes to the tower (compressed-tensors it drops there).
    moonvit_vl: Kimi-VL's (moonvit.py, vision_config read as vLLM's MoonViTConfig with its defaults) and
    kimi_vl.py's projector under multi_modal_projector.; neither is ever given the quantization."""
    quant = outer.get("quantization_config")
    if kind == "moonvit" and (vc.get("mm_projector_type", "patchmerger") != "patchmerger" or (
            quant and not (isinstance(quant, dict) and quant.get("quant_method") == "compressed-tensors"))):
        return None
    if kind == "moonvit_vl":  # MoonViTConfig's defaults: SigLIP-so400m's shape, a 64 x 64 position table
        text = read_object(outer, "text_config")
        if missing := [k for k in KIMI_VL_TEXT_KEYS if k not in text]:
            raise ConfigError(f"text_config is missing {', '.join(missing)}: vLLM 0.33 reads Kimi-VL's "
                              "text_config as DeepseekV2Config, whose defaults (not DeepSeek-V3's) tpviz "
                              "does not assume")
        vc = {"hidden_size": 1152, "num_attention_heads": 16, "intermediate_size": 4304,
              "num_hidden_layers": 27, "init_pos_emb_height": 64, "init_pos_emb_width": 64, **vc}
    patch, text = _int(vc, "patch_size", default=14), read_object(outer, "text_config")
    merge = vc.get("merge_kernel_size", [2, 2])
    if not (isinstance(merge, list) and len(merge) == 2 and merge[0] == merge[1] and isinstance(merge[0], int)
            and merge[0] > 0):
        raise ConfigError(f"vision_config: merge_kernel_size={merge!r} is not two equal positive integers")
    grid = (_int(vc, "pos_emb_height", "init_pos_emb_height"),
            _int(vc, "pos_emb_width", "init_pos_emb_width"))
    channels = 3 if kind == "moonvit_vl" else _int(vc, "num_channels", default=3)
    return dict(kind=kind, prefix="vision_tower.", hidden=_int(vc, "hidden_size"),
                heads=_int(vc, "num_attention_heads"), intermediate=_int(vc, "intermediate_size"),
                depth=_int(vc, "num_hidden_layers"), out_hidden=_int(text, "hidden_size"), merge=merge[0],
                patch=(channels, patch, patch), positions=grid[0] * grid[1], block_path="encoder.blocks",
                projector="multi_modal_projector." if kind == "moonvit_vl" else "mm_projector.",
                proj_bias=True, grid=grid)


def minicpmv(outer: dict, vc: dict) -> dict | None:
    """minicpmv.py 2.5 to 4.5: Idefics2VisionTransformer under vpm. (SigLIP's names; vision_config read as
    SiglipVisionConfig, with its defaults), its last layer dropped with drop_vision_last_layer
    (MiniCPMVConfig's default: true); then the resampler, as wide as the decoder, over query_num queries.
    2.0: timm's so400m (its model name, not a vision_config) and Resampler2 over int(sqrt(query_num))²."""
    drop = outer.get("drop_vision_last_layer", True)
    if not isinstance(drop, bool):
        raise ConfigError(f"drop_vision_last_layer={drop!r} is not true or false")
    queries, text = _int(outer, "query_num", default=64), _int(outer, "hidden_size")
    if minicpmv_version(outer) == (2, 0):  # timm's so400m whatever vision_config says; Resampler2
        p = SO400M["patch"]
        return dict(kind="minicpmv2_0", prefix="vpm.", hidden=SO400M["hidden"], heads=SO400M["heads"],
                    intermediate=SO400M["intermediate"], depth=SO400M["depth"] - (1 if drop else 0),
                    out_hidden=text, merge=1, patch=(3, p, p), positions=(SO400M["image"] // p) ** 2,
                    projector="resampler.",
                    queries=isqrt(queries) ** 2)
    if not vc:  # MiniCPMVConfig's own default tower then, which tpviz does not assume
        return None
    patch = _int(vc, "patch_size", default=16)
    depth = _int(vc, "num_hidden_layers", default=12) - (1 if drop else 0)
    return dict(kind="minicpmv", prefix="vpm.", hidden=_int(vc, "hidden_size", default=768),
                heads=_int(vc, "num_attention_heads", default=12),
                intermediate=_int(vc, "intermediate_size", default=3072), depth=depth, out_hidden=text,
                merge=1, patch=(_int(vc, "num_channels", default=3), patch, patch),
                positions=(_int(vc, "image_size", default=224) // patch) ** 2, block_path="encoder.layers",
                projector="resampler.", queries=queries)


def minicpmv4_6(outer: dict, vc: dict, kind: str) -> dict:
    """minicpmv4_6.py: the same Idefics2 tower (vision_config read as MiniCPMV4_6VisionConfig), its last
    layer dropped with drop_vision_last_layer (never in 4.7, whose class keeps every layer), a
    window-attention merger and the downsample merger; the decoder is Qwen3.5's (Qwen3_5ForCausalLM),
    whatever text_config says, so a text_config of another model_type cannot load."""
    text = read_object(outer, "text_config")
    if text.get("model_type", "qwen3_5_text") != "qwen3_5_text":
        raise ConfigError(f"text_config: model_type {text.get('model_type')!r}; vLLM 0.33's minicpmv4_6.py "
                          "builds Qwen3.5's dense decoder (qwen3_5_text) alone")
    drop = outer.get("drop_vision_last_layer", False) if kind == "minicpmv4_6" else False
    if not isinstance(drop, bool):
        raise ConfigError(f"drop_vision_last_layer={drop!r} is not true or false")
    patch = _int(vc, "patch_size", default=16)
    return dict(kind=kind, prefix="vision_tower.", hidden=_int(vc, "hidden_size", default=768),
                heads=_int(vc, "num_attention_heads", default=12),
                intermediate=_int(vc, "intermediate_size", default=3072),
                depth=_int(vc, "num_hidden_layers", default=12) - (1 if drop else 0),
                out_hidden=_int(text, "hidden_size"), merge=2,
                patch=(_int(vc, "num_channels", default=3), patch, patch),
                positions=(_int(vc, "image_size", default=224) // patch) ** 2, block_path="encoder.layers",
                projector="merger.")


def deepseek_vl2(outer: dict, vc: dict) -> dict | None:
    """deepseek_vl2.py: timm's so400m (SO400M) under vision., then MlpProjector (projector_config, read as
    MlpProjectorConfig with its defaults) and two learned vectors of its width. None for a projector_type
    other than downsample_mlp_gelu (a plain linear: not modelled, left out)."""
    pc = outer.get("projector_config") or {}
    if not isinstance(pc, dict) or pc.get("projector_type", "downsample_mlp_gelu") != "downsample_mlp_gelu":
        return None
    if pc.get("token_pooling"):
        raise ConfigError("projector_config: token_pooling, which vLLM 0.33's deepseek_vl2.py refuses")
    down, n = _int(pc, "downsample_ratio", default=2), _int(pc, "n_embed", default=2048)
    wide = n * _int(pc, "mlp_ratio", default=1)
    widths = (_int(pc, "input_dim", default=1152) * down ** 2,
              *[wide] * (1 + max(_int(pc, "depth", default=2) - 2, 0)), n)  # a GELU between each two
    p = SO400M["patch"]
    return dict(kind="deepseek_vl2", prefix="vision.", hidden=SO400M["hidden"], heads=SO400M["heads"],
                intermediate=SO400M["intermediate"], depth=SO400M["depth"], out_hidden=n, merge=down,
                patch=(3, p, p), positions=(SO400M["image"] // p) ** 2, projector="projector.",
                proj_bias=True, mlp=widths, extras=("image_newline", "view_seperator"))

"""Multimodal wrappers whose text decoder is another family's record: GLM-4.5V, whose text_config vLLM
0.33's glm4_1v.py builds as Glm4MoeForCausalLM (glm4_moe.py), under the same checkpoint names
(model.language_model.*, the tower under model.visual.*: plan/tower_glm.py); MiniCPM-V
(minicpmv.py), whose flat config is its decoder's, built by version as Llama, Qwen2 or Qwen3 under llm.*;
DeepSeek-VL2 (deepseek_vl2.py), whose language_config vLLM reads as DeepseekV2Config and builds as
DeepSeek-V2 under language.*, and DeepSeek-OCR (deepseek_ocr.py: the same model_type, told apart by
architectures), whose decoder sits under model.*. Their towers: config/tower.py."""
from dataclasses import replace

from tpviz.archs.base import Arch
from tpviz.archs.glm import RECORDS as GLM
from tpviz.archs.llama import RECORDS as LLAMAS
from tpviz.errors import ConfigError, MissingFieldError

_GLM4_MOE = next(a for a in GLM if a.model_type == "glm4_moe")
# minicpmv.py's _SUPPORT_VERSION: the decoder each version's class builds (init_llm)
MINICPMV_DECODERS = {(2, 0): "minicpm", (2, 5): "minicpmv_2_5_text", (2, 6): "qwen2", (4, 0): "llama",
                     (4, 5): "qwen3"}


def minicpmv_version(cfg: dict) -> tuple[int, ...]:
    """The version minicpmv.py reads (get_version_by_config): the config's, else 2.0 for a 2304-wide decoder
    with 64 queries (MiniCPMVConfig's query_num default), else 2.5."""
    version = cfg.get("version")
    if version is None:
        return (2, 0) if cfg.get("hidden_size") == 2304 and cfg.get("query_num", 64) == 64 else (2, 5)
    try:
        return tuple(int(x) for x in str(version).split("."))
    except ValueError:
        raise ConfigError(f"version={version!r} is no MiniCPM-V version vLLM 0.33 reads") from None


def minicpmv_decoder(cfg: dict) -> dict:
    """The flat config as the decoder minicpmv.py builds for its version (the vision keys dropped)."""
    version = minicpmv_version(cfg)
    if version not in MINICPMV_DECODERS:
        raise ConfigError(f"MiniCPM-V version {'.'.join(map(str, version))}: vLLM 0.33's minicpmv.py "
                          "serves 2.0, 2.5, 2.6, 4.0 and 4.5 alone")
    drop = ("vision_config", "slice_config", "auto_map")
    return {**{k: v for k, v in cfg.items() if k not in drop}, "model_type": MINICPMV_DECODERS[version]}


def deepseek_ocr(cfg: dict) -> bool:
    """Whether a deepseek_vl_v2 config is DeepSeek-OCR's, which vLLM's DeepseekVLV2Config tells apart by
    architectures (and builds with deepseek_ocr.py)."""
    return "DeepseekOCRForCausalLM" in (cfg.get("architectures") or [])


def deepseek_vl2_decoder(cfg: dict) -> dict:
    """language_config as DeepseekVLV2Config reads it (a DeepseekV2Config); DeepSeek-OCR's configs share
    the model_type and are told apart by architectures, as vLLM's config class does."""
    if "DeepseekOCR2ForCausalLM" in (cfg.get("architectures") or []):
        raise ConfigError("DeepSeek-OCR-2 (deepseek_ocr2.py: a Qwen2 encoder over SAM's features) is not "
                          "modelled; tpviz maps DeepSeek-OCR (DeepseekOCRForCausalLM) alone")
    text = cfg.get("language_config")
    if not isinstance(text, dict):
        raise MissingFieldError("config is missing language_config, DeepSeek-VL2's text decoder",
                                "language_config")
    if cfg.get("tile_tag", "tile_tag") != "2D":  # deepseek_vl2.py and deepseek_ocr.py raise for any other
        raise ConfigError(f"tile_tag={cfg.get('tile_tag')!r}: vLLM 0.33's "
                          f"{'deepseek_ocr' if deepseek_ocr(cfg) else 'deepseek_vl2'}.py builds 2D alone")
    for key in ("num_hidden_layers", "num_attention_heads"):  # deepseek-vl2 (the largest) gives neither
        if text.get(key) is None:
            raise MissingFieldError(f"language_config is missing {key}; vLLM 0.33 would take "
                                    "DeepseekV2Config's default, which changes with the transformers release "
                                    "(32 layers in 5.x, where deepseek-vl2's checkpoint holds 30), so tpviz "
                                    "does not guess it", key)
    return {**text, "model_type": "deepseek_v2"}

# SGLang 0.5.23's glm4v_moe.py: glm4_moe.py's Glm4MoeModel, its lm_head on the last stage alone (glm4_moe.py
# builds one on every stage); no fused shared expert is claimed (its class has no fusion hook of its own)
_GLM4V_MOE_SGL = replace(_GLM4_MOE.sglang, file="glm4v_moe.py (glm4_moe.py's Glm4MoeModel)", fuses_shared="",
                         head_every_stage=False)

RECORDS = [
    replace(_GLM4_MOE, model_type="glm4v_moe", hf_class="Glm4vMoeForConditionalGeneration",
            text_model="glm4v_moe_text", tower="glm4v", sglang=_GLM4V_MOE_SGL),
    replace(_GLM4_MOE, model_type="glm4v_moe_text", hf_class="Glm4vMoeForConditionalGeneration",
            sglang=_GLM4V_MOE_SGL),
    Arch("minicpmv", "MiniCPMV", tower="minicpmv", decoder=minicpmv_decoder),
    # 2.5's decoder is a Llama; SGLang 0.5.23's minicpmv.py serves no 2.5 (a config without version it reads
    # as 2.6, a Qwen2), so it has a record of its own without SGLang groups: SGLang rules refuse it
    replace(next(a for a in LLAMAS if a.model_type == "llama"), model_type="minicpmv_2_5_text",
            hf_class="MiniCPMV", sglang=None, live=""),
    Arch("deepseek_vl_v2", "DeepseekVLV2ForCausalLM", tower="deepseek_vl2", decoder=deepseek_vl2_decoder),
    # minicpmv4_6.py, minicpmv4_7.py: Qwen3.5's decoder from text_config, under model.language_model.*
    *(Arch(t, c, text_model="qwen3_5_text", tower=t)
      for t, c in (("minicpmv4_6", "MiniCPMV4_6ForConditionalGeneration"),
                   ("minicpmv4_7", "MiniCPMV4_7ForConditionalGeneration"))),
]

"""A multimodal checkpoint's audio tower, read from its audio_config as vLLM 0.33 builds it beside the text
decoder; which one a model has is its wrapper record's `audio` (tpviz.archs). qwen2_audio.py builds
transformers' own Qwen2AudioEncoder (Whisper-large's encoder: two Conv1d, a position table, plain nn.Linear
attention and MLP) and an nn.Linear projector, qwen2_5_omni_thinker.py transformers' Qwen2_5OmniAudioEncoder
(the same layers, a sinusoid table it does not store, its own output projection): plain torch layers, whole on
every GPU whatever tp or --mm-encoder-tp-mode. qwen3_omni_moe_thinker.py builds its own encoder of vLLM
parallel layers instead (SPLIT_AUDIO). audio_config is read through transformers' class, defaults and all, as
vLLM reads it (config/hf.py's TOWERS)."""
from functools import partial

from tpviz.archs import arch_of
from tpviz.config.fields import read_int_in, read_object
from tpviz.config.tower import HF_KINDS, Tower
from tpviz.errors import ConfigError

_int = partial(read_int_in, "audio_config")
SPLIT_AUDIO = ("qwen3_omni_audio",)  # built of vLLM parallel layers (qwen3_omni_moe_thinker.py), not whole


def read_audio(outer: dict) -> Tower | None:
    """The audio tower its record names; None where the model has none tpviz models."""
    kind = arch_of(str(outer.get("model_type", ""))).audio
    ac = read_object(outer, "audio_config")
    if not kind or not ac or kind in HF_KINDS:  # transformers-built: config/tower_hf.py
        return None
    text = read_object(outer, "text_config")
    common = dict(kind=kind, prefix="audio_tower.", hidden=_int(ac, "d_model"),
                  heads=_int(ac, "encoder_attention_heads"), intermediate=_int(ac, "encoder_ffn_dim"),
                  depth=_int(ac, "encoder_layers"), merge=1, block_path="layers")
    mels = _int(ac, "num_mel_bins")
    if kind == "qwen3_omni_audio":  # three Conv2d over the mel bins, conv_out, ln_post, proj1 and proj2
        tower = Tower(out_hidden=_int(ac, "output_dim"), patch=(mels, _int(ac, "downsample_hidden_size")),
                      **common)
    elif kind == "qwen2_5_omni_audio":  # its own proj to output_dim and two learned bos / eos rows; no table
        tower = Tower(out_hidden=_int(ac, "output_dim"), patch=(mels, 3), **common)
    else:
        if text.get("model_type", "qwen2") != "qwen2":  # architectures=["Qwen2ForCausalLM"] in qwen2_audio.py
            raise ConfigError(f"text_config: model_type {text.get('model_type')!r}; vLLM 0.33's "
                              "qwen2_audio.py builds a Qwen2 decoder (qwen2) alone")
        tower = Tower(out_hidden=_int(text, "hidden_size"), patch=(mels, 3),
                      positions=_int(ac, "max_source_positions"), projector="multi_modal_projector.",
                      proj_bias=True, **common)
    if tower.hidden % tower.heads:
        raise ConfigError(f"audio_config: d_model {tower.hidden} is not divisible by {tower.heads} heads")
    return tower

"""Towers vLLM 0.33 builds as transformers' own modules (AutoModel.from_config on the sub-config), each with
an embedder of vLLM layers into the decoder's width:
- gemma4_mm.py: Gemma4VisionModel and Gemma4AudioModel, every nn.Linear swapped for a ReplicatedLinear
  (recursive_replace_linear), and Gemma4MultimodalEmbedder (embed_vision / embed_audio: a ReplicatedLinear
  embedding_projection; its norms hold no weight);
- gemma3n_mm.py: Gemma3nAudioEncoder as transformers builds it, and Gemma3nMultimodalEmbedder (embed_audio:
  a vocab-parallel table, two RMSNorms, a RowParallelLinear with input_is_parallel=False). Its vision tower,
  timm's MobileNet-V5, is left out.
The towers are whole on every GPU whatever tp or --mm-encoder-tp-mode; plan/tower_hf.py reads their tensors
off the transformers class itself. A quantized checkpoint hands its quantization to these towers by their
sizes (gemma4_mm.py _get_tower_quant_config): not modelled, so the tower is left out and named."""
import json
from typing import NamedTuple

from tpviz.archs import arch_of
from tpviz.config.fields import read_int_in, read_object
from tpviz.config.tower import HF_KINDS, Tower



class Layout(NamedTuple):
    """Where a transformers-built tower sits and what its sub-config calls its sizes."""
    key: str  # its sub-config
    prefix: str  # its checkpoint names'
    embedder: str  # its embedder's checkpoint names'
    block_path: str  # where its blocks sit under prefix
    depth: str  # the sub-config's key of its blocks
    heads: str  # ... and of its heads
    config_class: str  # transformers' class that reads the sub-config (and builds the tower from it)


LAYOUT = {"gemma4_vision": Layout("vision_config", "vision_tower.", "embed_vision.", "encoder.layers",
                                  "num_hidden_layers", "num_attention_heads", "Gemma4VisionConfig"),
          "gemma4_audio": Layout("audio_config", "audio_tower.", "embed_audio.", "layers",
                                 "num_hidden_layers", "num_attention_heads", "Gemma4AudioConfig"),
          "gemma3n_audio": Layout("audio_config", "audio_tower.", "embed_audio.", "conformer",
                                  "conf_num_hidden_layers", "conf_num_attention_heads", "Gemma3nAudioConfig")}
# Gemma-3n's table rows the Gemma-4 embedder no longer has, which gemma4_mm.py's loader ignores
GEMMA4_VESTIGIAL = "embedding.weight"


def read_hf_tower(outer: dict, medium: str) -> Tower | None:
    """The vision ('vision') or audio ('audio') tower a record builds from transformers' modules; None where
    it has none, or the checkpoint is quantized (left out, named by the caller)."""
    arch = arch_of(str(outer.get("model_type", "")))
    kind = arch.tower if medium == "vision" else arch.audio
    if kind not in HF_KINDS:
        return None
    at = LAYOUT[kind]
    sub, text = read_object(outer, at.key), read_object(outer, "text_config")
    if not sub or outer.get("quantization_config"):
        return None
    read = lambda k: read_int_in(at.key, sub, k)
    return Tower(kind, at.prefix, read("hidden_size"), read(at.heads), 0, read(at.depth),
                 read_int_in("text_config", text, "hidden_size"), 1, (), block_path=at.block_path,
                 projector=at.embedder,
                 dropped=(f"{at.embedder}{GEMMA4_VESTIGIAL}",) if kind.startswith("gemma4") else (),
                 hf_config=json.dumps(sub, sort_keys=True, default=str))

"""InternLM2 (vLLM 0.33 models/internlm2.py; InternLM3 is built as Llama) and InternVL's tower.

InternLM2's wqkv lies on disk per KV group, [q of the group's heads | k | v] group after group, but loads
through QKVParallelLinear as if it were [all q | all k | all v]: each GPU holds a tp-th of each of those three
row ranges, not its own heads. split_qkv all-gathers the whole qkv output every layer and cuts it again by KV
group.

InternVL (internvl.py's InternVLChatModel) keeps its decoder in llm_config, which vLLM reads as text_config
and builds by its own model_type (Qwen2, InternLM2, Llama, Qwen3, ...): the decoder maps by that type's
record, and this one names the tower (InternViT and the mlp1 projector: config/tower_dims.py,
plan/tower_intern.py); a config of this type without llm_config, or whose decoder no record maps, is
refused, never drawn as a decoder of its own. InternVL's transformers-format checkpoints (model_type internvl,
text_config) vLLM builds with interns1.py, whose tower (interns1_vit.py) holds the attention whole."""
from dataclasses import replace

from tpviz.archs.base import Arch
from tpviz.archs.names import LLAMA
from tpviz.errors import ConfigError, MissingFieldError
from tpviz.rules.sglang_files import Groups

INTERNLM2 = replace(LLAMA, embed="model.tok_embeddings.weight", lm_head="output.weight",
                    mixer_norms=("attention_norm",), ffn_norms=("ffn_norm",), attn="attention.",
                    qkv_fused="wqkv", qkv_order="per_kv_group_as_qkv", o="wo", mlp="feed_forward.",
                    gate="w1", up="w3", down="w2")


def decoder_in(key: str):
    """The decoder config InternVL keeps under key (llm_config; text_config in transformers' format), which
    read_spec takes as text_config before it asks a record's decoder: reached only without one."""
    def decoder(cfg: dict) -> dict:
        if not isinstance(cfg.get(key), dict):
            raise MissingFieldError(f"config is missing {key}, InternVL's text decoder", key)
        return cfg[key]
    return decoder


def unrecorded_decoder(cfg: dict) -> dict:
    """Reached only by a decoder of a model_type tpviz has no record for under InternVLChatModel (read_spec
    then asks the record of the class): vLLM builds that type's own model, which tpviz does not draw."""
    raise ConfigError("InternVL's text decoder (llm_config) is of a model_type tpviz has no record for; "
                      "vLLM 0.33 builds it by that type's own model file")


RECORDS = [
    Arch("internlm2", "InternLM2ForCausalLM", INTERNLM2, qkv_bias=False, o_bias=False, regroups_qkv=True,
         note="InternLM2's wqkv is stored per KV group but split as if it were [q | k | v], so a GPU's rows "
              "are not its heads: vLLM 0.33 all-gathers the whole q/k/v output in every layer "
              "(split_qkv) and cuts it again by KV group", embed_every_stage=True,
         # internlm2.py: wqkv regrouped into q, k and v at load, so each GPU holds its own heads; no PP
         sglang=Groups("internlm2.py", pp=False, qkv_order="per_kv_group", note=(
             "SGLang's internlm2.py regroups wqkv into q, k and v as it loads it, so each GPU holds the rows "
             "of its own heads and the forward gathers nothing"))),
    Arch("internvl_chat", "InternVLChatModel", tower="internvit", decoder=decoder_in("llm_config"),
         adapt=unrecorded_decoder),
    # transformers' format (OpenGVLab's *-hf releases): vLLM 0.33 builds InternS1ForConditionalGeneration
    Arch("internvl", "InternVLForConditionalGeneration", tower="interns1", decoder=decoder_in("text_config"),
         adapt=unrecorded_decoder),
]

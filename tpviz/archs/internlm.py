"""InternLM2 (vLLM 0.33 models/internlm2.py; InternLM3 is built as Llama). wqkv lies on disk per KV group,
[q of the group's heads | k | v] group after group, but loads through QKVParallelLinear as if it were
[all q | all k | all v]: each GPU holds a tp-th of each of those three row ranges, not its own heads.
split_qkv all-gathers the whole qkv output every layer and cuts it again by KV group."""
from dataclasses import replace

from tpviz.archs.base import Arch
from tpviz.archs.names import LLAMA

INTERNLM2 = replace(LLAMA, embed="model.tok_embeddings.weight", lm_head="output.weight",
                    mixer_norms=("attention_norm",), ffn_norms=("ffn_norm",), attn="attention.",
                    qkv_fused="wqkv", qkv_order="per_kv_group_as_qkv", o="wo", mlp="feed_forward.",
                    gate="w1", up="w3", down="w2")

RECORDS = [
    Arch("internlm2", "InternLM2ForCausalLM", INTERNLM2, qkv_bias=False, o_bias=False, regroups_qkv=True,
         note="InternLM2's wqkv is stored per KV group but split as if it were [q | k | v], so a GPU's rows "
              "are not its heads: vLLM 0.33 all-gathers the whole q/k/v output in every layer "
              "(split_qkv) and cuts it again by KV group", embed_every_stage=True),
]

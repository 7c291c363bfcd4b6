"""Qwen2, Qwen3 and their MoE, Qwen3-Next and Qwen3.5 (vLLM 0.33 models/qwen2*.py, qwen3*.py, qwen3_next.py).

Qwen2 puts biases on q/k/v but not o; Qwen3 norms q and k per head; the Qwen MoE blocks refuse tp above the
expert count; windows apply only as transformers and vLLM's Qwen2Model read use_sliding_window
(config/windows.py)."""
from dataclasses import replace

from tpviz.archs.base import Arch
from tpviz.rules.served import architecture
from tpviz.rules.sglang_files import Groups
from tpviz.archs.names import LLAMA

GATED_SHARED = replace(LLAMA, shared_gate="shared_expert_gate")  # the shared expert's sigmoid gate


def qwen3_vl_moe_fields(cfg: dict) -> dict:
    """Untied: the released configs set tie_word_embeddings false at the top level only, where transformers
    5's Qwen3VLMoeTextConfig defaults to true, and every release ships its own lm_head.weight (622 MB in the
    30B-A3B's index, whose total_size the untied map equals)."""
    return {**cfg, "tie_word_embeddings": False}


# SGLang 0.5.23's vision-language wrappers around qwen2.py's, qwen3.py's and qwen3_moe.py's decoders (the
# tower is left out under SGLang rules, plan/tower.py): the lm_head on the last stage alone (qwen2_5_vl.py,
# qwen3_vl.py: a head of its own there at --pp-size > 1 when tied), cut over attn_tp under
# --enable-dp-lm-head in qwen3_vl.py; qwen2_vl.py's forward takes no pp_proxy_tensors
SGL_QWEN2_VL = Groups("qwen2_vl.py (qwen2.py's Qwen2Model)", embed="attn_tp", pp=False)
SGL_QWEN2_5_VL = Groups("qwen2_5_vl.py (qwen2.py's Qwen2Model)", embed="attn_tp")
SGL_QWEN3_VL = Groups("qwen3_vl.py (qwen3.py's Qwen3Model)", "attn_tp", "attn_tp", "attn_tp",
                      deepstack_first=True)
# qwen3_5.py: full and linear attention over attn_tp, the full layers' tables named without self_attn,
# the embedding whole under attention DP (enable_tp=not dp), both ends on their own stages; the MoE's
# shared expert kept apart on NVIDIA (fused with aiter alone)
QWEN3_5_CLASSES = ("Qwen3_5ForConditionalGeneration", "Qwen3_5ForCausalLM",
                   "Qwen3_5MoeForConditionalGeneration", "Qwen3_5MoeForCausalLM")


def sgl_qwen3_5(spec, layout) -> str | None:
    """Another model around the decoder (MiniCPM-V 4.6's minicpmv.py) names and stages it its own way."""
    if (cls := architecture(spec.config)) not in QWEN3_5_CLASSES:
        return (f"builds the decoder, but {cls} wraps it in a file of its own (its names, lm_head and "
                "stages): not modelled; choose vLLM rules")
    return None


SGL_QWEN3_5 = Groups("qwen3_5.py", "attn_tp", "dp_whole", "attn_tp", check=sgl_qwen3_5, params=tuple(
    (f"model.layers.*.self_attn.{n}.weight", f"model.layers.*.{n}.weight")
    for n in ("qkv_proj", "o_proj", "q_norm", "k_norm")))
SGL_QWEN3_VL_MOE = Groups("qwen3_vl_moe.py (qwen3_moe.py's Qwen3MoeModel)", "attn_tp", "attn_tp", "attn_tp",
                          expert_limit="moe_tp")

RECORDS = [
    Arch("qwen2", "Qwen2ForCausalLM", qkv_bias=True, o_bias=False, window="qwen2",
         window_flag=True, live="llama", sglang=Groups("qwen2.py", embed="attn_tp")),
    Arch("qwen2_moe", "Qwen2MoeForCausalLM", GATED_SHARED, qkv_bias=True, o_bias=False, window="qwen2_moe",
         window_flag=True, moe_tp_limit=True, live="llama", live_moe=True, live_shared=True,
         sglang=Groups("qwen2_moe.py", "attn_tp", "attn_tp", "attn_tp", expert_limit="tp",
                       head_every_stage=True), embed_every_stage=True),
    Arch("qwen3", "Qwen3ForCausalLM", qk_norm="head", window="qwen2", window_flag=True, live="llama",
         sglang=Groups("qwen3.py", "attn_tp", "attn_tp", "attn_tp")),
    Arch("qwen3_moe", "Qwen3MoeForCausalLM", qk_norm="head", window="qwen3_moe",
         window_flag=True, moe_tp_limit=True, live="llama", live_moe=True,
         sglang=Groups("qwen3_moe.py", "attn_tp", "attn_tp", "attn_tp", expert_limit="moe_tp",
                       head_every_stage=True), embed_every_stage=True),
    # the vision-language wrappers (qwen2_vl.py, qwen2_5_vl.py: Qwen2Model; qwen3_vl.py: Qwen3's) and their
    # vision towers (config/tower.py, plan/tower.py); M-RoPE changes no weight
    *(Arch(t, c, text_model=text, tower=tower, qkv_bias=True, o_bias=False, window="qwen2", window_flag=True,
           sglang=SGL_QWEN2_VL if t.startswith("qwen2_vl") else SGL_QWEN2_5_VL)
      for t, c, text, tower in (("qwen2_vl", "Qwen2VLForConditionalGeneration", "qwen2_vl_text", "qwen2_vl"),
                                ("qwen2_vl_text", "Qwen2VLForConditionalGeneration", "", ""),
                                ("qwen2_5_vl", "Qwen2_5_VLForConditionalGeneration", "qwen2_5_vl_text",
                                 "qwen2_5_vl"),
                                ("qwen2_5_vl_text", "Qwen2_5_VLForConditionalGeneration", "", ""))),
    *(Arch(t, "Qwen3VLForConditionalGeneration", text_model=text, tower=tower, qk_norm="head", window="qwen2",
           window_flag=True, sglang=SGL_QWEN3_VL)
      for t, text, tower in (("qwen3_vl", "qwen3_vl_text", "qwen3_vl"), ("qwen3_vl_text", "", ""))),
    # qwen3_vl_moe.py: Qwen3-VL's tower around the Qwen3-MoE decoder, whose experts are stored fused and
    # transposed (experts.gate_up_proj, experts.down_proj: FusedMoE's is_fused_checkpoint_transposed)
    *(Arch(t, "Qwen3VLMoeForConditionalGeneration", text_model=text, tower=tower, qk_norm="head",
           window="qwen3_moe", window_flag=True, moe_tp_limit=True, experts="transposed",
           adapt=qwen3_vl_moe_fields, embed_every_stage=True, sglang=SGL_QWEN3_VL_MOE)
      for t, text, tower in (("qwen3_vl_moe", "qwen3_vl_moe_text", "qwen3_vl"),
                             ("qwen3_vl_moe_text", "", ""))),
    # qwen2_audio.py: transformers' Qwen2AudioEncoder and a projector before Qwen2ForCausalLM, which vLLM
    # builds from text_config whatever its model_type (config/tower_audio.py)
    Arch("qwen2_audio", "Qwen2AudioForConditionalGeneration", text_model="qwen2", audio="qwen2_audio",
         qkv_bias=True, o_bias=False, window="qwen2", window_flag=True),
    # qwen2_5_omni_thinker.py: the thinker alone (thinker_config), Qwen2.5-VL's tower with q/k/v stored apart,
    # transformers' Qwen2_5OmniAudioEncoder whole, Qwen2ForCausalLM; talker.* and token2wav.* mapped to
    # nothing
    Arch("qwen2_5_omni", "Qwen2_5OmniModel", text_model="qwen2_5_omni_text", tower="qwen2_5_omni",
         audio="qwen2_5_omni_audio", inner="thinker_config", qkv_bias=True,
         o_bias=False, window="qwen2", window_flag=True,
         note="Qwen2.5-Omni: vLLM 0.33 serves its thinker (thinker_config) alone, which answers in text; the "
              "talker and token2wav that speak are not built, and the loader drops their tensors"),
    # its thinker's decoder, the record an Omni spec carries: so it names what the wrapper's loader drops
    Arch("qwen2_5_omni_text", "Qwen2_5OmniModel", qkv_bias=True, o_bias=False, window="qwen2",
         window_flag=True, unloaded=("talker.", "token2wav.")),
    # qwen3_omni_moe_thinker.py: its thinker alone; a Qwen3-VL-like tower (merger / merger_list named as
    # Qwen2.5-VL's), an audio encoder split over its heads where they divide tp, Qwen3-MoE's decoder
    Arch("qwen3_omni_moe", "Qwen3OmniMoeForConditionalGeneration", text_model="qwen3_omni_moe_text",
         tower="qwen3_omni", audio="qwen3_omni_audio", inner="thinker_config", qk_norm="head",
         window="qwen3_moe", window_flag=True, moe_tp_limit=True,
         note="Qwen3-Omni: vLLM 0.33 serves its thinker (thinker_config) alone, which answers in text; the "
              "talker and code2wav that speak are not built, and the loader drops their tensors"),
    Arch("qwen3_omni_moe_text", "Qwen3OmniMoeForConditionalGeneration", qk_norm="head", window="qwen3_moe",
         window_flag=True, moe_tp_limit=True, embed_every_stage=True, unloaded=("talker.", "code2wav.")),
    Arch("qwen3_next", "Qwen3NextForCausalLM", GATED_SHARED, qk_norm="head", output_gate=True,
         full_attention_interval=4, window_flag=True, moe_tp_limit=True, embed_every_stage=True),
    # Qwen3.5-MoE builds Qwen3-Next's MoE block (qwen3_5.py), shared_expert_gate included
    *(Arch(t, c, GATED_SHARED if "moe" in t else LLAMA, text_model=text, tower="qwen3_vl" if text else "",
           qk_norm="head", output_gate=True,
           deltanet_split=True, window_flag=True, moe_tp_limit="moe" in t, embed_every_stage=True,
           sglang=replace(SGL_QWEN3_5, expert_limit="tp") if "moe" in t else SGL_QWEN3_5)
      for t, c, text in (("qwen3_5", "Qwen3_5ForConditionalGeneration", "qwen3_5_text"),
                         ("qwen3_5_text", "Qwen3_5ForCausalLM", ""),
                         ("qwen3_5_moe", "Qwen3_5MoeForConditionalGeneration", "qwen3_5_moe_text"),
                         ("qwen3_5_moe_text", "Qwen3_5MoeForCausalLM", ""))),
]

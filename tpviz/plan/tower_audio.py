"""Audio towers as vLLM 0.33 builds them: qwen2_audio.py's and qwen2_5_omni_thinker.py's are transformers' own
encoders (and qwen2_audio.py's nn.Linear projector), plain torch layers that every GPU holds whole, nothing
cut and no tp limit; qwen3_omni_moe_thinker.py's is its own, of vLLM parallel layers split over the audio
heads. Names as the released checkpoints store them (audio_tower.*, multi_modal_projector.linear.*)."""
from dataclasses import replace

from tpviz.archs.names import Names
from tpviz.config.kinds import Mixer
from tpviz.config.tower import Tower
from tpviz.plan.attention import qkv
from tpviz.plan.core import ParamPlan, column, norm, replicated, row
from tpviz.plan.tower_hf import gemma3n_audio, gemma4_audio
from tpviz.plan.tower_intern import whole_unless_heads_divide
from tpviz.plan.tower_minicpm import whole, whole_linear


def _layers(t: Tower) -> list[ParamPlan]:
    """Whisper's encoder layer, its k_proj unbiased."""
    p, w, f = t.blocks, t.hidden, t.intermediate
    return (whole_linear(f"{p}self_attn.q_proj", w, w) + [replicated(f"{p}self_attn.k_proj.weight", w, w)]
            + whole_linear(f"{p}self_attn.v_proj", w, w) + whole_linear(f"{p}self_attn.out_proj", w, w)
            + norm(f"{p}self_attn_layer_norm", w, bias=True)
            + whole_linear(f"{p}fc1", f, w) + whole_linear(f"{p}fc2", w, f)
            + norm(f"{p}final_layer_norm", w, bias=True))


def _convs(t: Tower) -> list[ParamPlan]:
    """Two Conv1d of kernel 3, over the mel bins then over the width."""
    a, w, (mels, kernel) = t.prefix, t.hidden, t.patch
    return [whole(f"{a}conv1.weight", (w, mels, kernel)), whole(f"{a}conv1.bias", (w,)),
            whole(f"{a}conv2.weight", (w, w, kernel)), whole(f"{a}conv2.bias", (w,))]


def qwen2_audio(spec, t: Tower, rules) -> tuple[list[ParamPlan], list[ParamPlan]]:
    """(per-block plans, once-per-tower plans): the layers; the convs, the position table and the closing
    layer_norm; then the projector."""
    a, w = t.prefix, t.hidden
    once = [*_convs(t), whole(f"{a}embed_positions.weight", (t.positions, w)),
            *norm(f"{a}layer_norm", w, bias=True),
            *whole_linear(f"{t.projector}linear", t.out_hidden, w)]
    return _layers(t), once


def qwen2_5_omni_audio(spec, t: Tower, rules) -> tuple[list[ParamPlan], list[ParamPlan]]:
    """The same layers and convs; then ln_post, proj (d_model -> output_dim, the decoder's width) and
    audio_bos_eos_token (two rows of that width); no stored position table, no projector of its own."""
    a, w = t.prefix, t.hidden
    once = [*_convs(t), whole(f"{a}audio_bos_eos_token.weight", (2, t.out_hidden)),
            *norm(f"{a}ln_post", w, bias=True), *whole_linear(f"{a}proj", t.out_hidden, w)]
    return _layers(t), once


def qwen3_omni_audio(spec, t: Tower, rules) -> tuple[list[ParamPlan], list[ParamPlan]]:
    """qwen3_omni_moe_thinker.py's own encoder: q/k/v stored apart into one biased QKVParallelLinear over the
    audio heads, out_proj row-, fc1 column- and fc2 row-parallel, each built with disable_tp (whole on every
    GPU) where tp does not divide the heads; the LayerNorms, three Conv2d, conv_out (unbiased), ln_post and
    proj1 / proj2 whole (ReplicatedLinear, nn modules)."""
    p, w, f, h = t.blocks, t.hidden, t.intermediate, t.heads
    mels, down = t.patch
    key, mlp = ("audio_config.d_model", w), ("audio_config.encoder_ffn_dim", f)
    split = (qkv(replace(spec, hidden_size=w, quant=None), Names(layer=p, attn="self_attn."), rules,
                 Mixer("attention", h, h, w // h), None, True)
             + row(f"{p}self_attn.out_proj", w, w, "audio", None, True, key)
             + column(f"{p}fc1", w, f, "audio", None, True, mlp)
             + row(f"{p}fc2", f, w, "audio", None, True, mlp))
    blocks = [whole_unless_heads_divide(plan, h, AUDIO_WHOLE) for plan in split] + [
        pl for n in ("self_attn_layer_norm", "final_layer_norm") for pl in norm(f"{p}{n}", w, bias=True)]
    a, bins = t.prefix, mels
    for _ in range(3):  # each Conv2d (kernel 3, stride 2, padding 1) halves the mel bins, rounding up
        bins = (bins + 1) // 2
    convs = [whole(f"{a}conv2d1.weight", (down, 1, 3, 3)), whole(f"{a}conv2d1.bias", (down,)),
             *(x for n in ("conv2d2", "conv2d3") for x in (whole(f"{a}{n}.weight", (down, down, 3, 3)),
                                                         whole(f"{a}{n}.bias", (down,))))]
    for plan in convs:
        plan.layer_class = "nn.Conv2d"
    # conv_out, proj1 and proj2 are vLLM ReplicatedLinear layers, the class the probe builds and names
    once = convs + [replicated(f"{a}conv_out.weight", w, down * bins), *norm(f"{a}ln_post", w, bias=True),
                    *whole_linear(f"{a}proj1", w, w), *whole_linear(f"{a}proj2", t.out_hidden, w)]
    return blocks, once


AUDIO_WHOLE = "whole on every GPU (disable_tp) where tp does not divide the audio heads"
BUILDERS = {"qwen2_audio": qwen2_audio, "qwen2_5_omni_audio": qwen2_5_omni_audio,
            "qwen3_omni_audio": qwen3_omni_audio, "gemma4_audio": gemma4_audio,
            "gemma3n_audio": gemma3n_audio}
NAMED_BY_TORCH = ("qwen2_audio", "qwen2_5_omni_audio")  # hand-planned transformers encoders


def audio_plans(spec, rules) -> list[ParamPlan]:
    """Every parameter of the spec's audio tower (none when it has none tpviz models)."""
    t = spec.audio
    if t is None:
        return []
    blocks, once = BUILDERS[t.kind](spec, t, rules)
    for group, count in ((blocks, t.depth), (once, 0)):
        for plan in group:
            plan.family, plan.tower, plan.blocks = "audio", "audio", count
            if t.kind in NAMED_BY_TORCH:  # transformers' modules; vLLM's own layers name their class
                plan.layer_class = torch_class(plan.name)
    return blocks + once


def torch_class(name: str) -> str:
    """A transformers encoder's own torch module for a tensor (the probe's stand-in is drawn, not named)."""
    part = name.rsplit(".", 2)[-2]
    return ("nn.Conv1d" if part.startswith("conv") else "nn.LayerNorm" if "norm" in part or part == "ln_post"
            else "nn.Embedding" if part in ("embed_positions", "audio_bos_eos_token") else "nn.Linear")

"""Gemma-3n as vLLM 0.33 models/gemma3n.py builds it: AltUp's stream projections and per-layer tables,
LAuReL's low-rank residual, per-layer input embeddings, an MLP size per layer and KV-shared layers. Names and
shapes are checked against a tiny checkpoint transformers writes; counts, splits and collectives by hand
here."""
import math

import pytest
import torch
import transformers
from tests.helpers.checkpoint import written_shapes

from tpviz import shard_map
from tpviz.config.normalize import normalize
from tpviz.config.sources import presets
from tpviz.errors import ConfigError, TPSizeError
from tpviz.plan import build_plan
from tpviz.plan.tensors import tensors
from tpviz.rules import Layout, ruleset
from tpviz.trace.checkpoint import checkpoint_sentence
from tpviz.trace.collectives import collectives

E2B, E4B = "google/gemma-3n-E2B-it", "google/gemma-3n-E4B-it"
TYPES = ["sliding_attention", "sliding_attention", "full_attention"] * 2
TINY = dict(num_hidden_layers=6, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
            intermediate_size=[96, 96, 128, 96, 96, 64], vocab_size=512, vocab_size_per_layer_input=300,
            hidden_size_per_layer_input=8, layer_types=TYPES, num_kv_shared_layers=3, laurel_rank=8,
            activation_sparsity_pattern=[0.95] * 2 + [0.0] * 4)


def text(**over) -> dict:
    return {**presets()[E2B]["text_config"], **over}


def wrapped(**over) -> dict:
    return {**presets()[E2B], "text_config": text(**over)}


def saved(folder) -> dict[str, tuple]:
    torch.manual_seed(0)
    return written_shapes(transformers.Gemma3nForCausalLM(transformers.Gemma3nTextConfig(**TINY)), folder)


def test_names_and_shapes_are_what_transformers_saves(tmp_path):
    """Every AltUp, LAuReL and per-layer input tensor, the per-layer MLP sizes (96, 128, 64), and the shared
    layers' q_proj, q_norm and o_proj alone."""
    written = saved(tmp_path)
    cfg = {**transformers.Gemma3nTextConfig(**TINY).to_dict(), "architectures": ["Gemma3nForCausalLM"]}
    m = shard_map(cfg, 2, tensor_names=set(written), checkpoint_source="tiny")
    assert m.checkpoint["verified"], m.checkpoint
    assert {t.name: tuple(t.shape) for t in tensors(build_plan(m.model))} == written
    assert [layer.ffn.size for layer in m.model.layers] == TINY["intermediate_size"]
    assert [layer.mixer.kv_shared for layer in m.model.layers] == [False] * 3 + [True] * 3


def test_e2b_text_decoder_is_its_hand_count():
    """30 layers (20 owning a cache, the last 10 KV-shared), each: 5 norms, the per-layer gate and projection,
    AltUp (4x4, 16x4, 4x2048, router_norm, correct_output_scale), LAuReL (2 x 64x2048 and a norm) and an MLP
    of 8192; the tables, the projection and 6 AltUp stream projections once. With the shared layers' k/v
    and k_norm the release still ships (dropped at load), it is the 4.46B text-only count GGUF ports print."""
    h, ple, layers, heads = 2048, 256, 30, 8 * 256
    per_layer = (5 * h + 2 * ple * h + (16 + 64 + 4 * h + 2 * h) + (2 * 64 * h + h) + 3 * 8192 * h
                 + heads * h * 2 + 256)  # q, o, q_norm
    own_kv = 2 * 512 * h + 256  # k, v, k_norm
    total = (262400 * h + 262144 * layers * ple + layers * ple * h + ple + h + 6 * h * h
             + layers * per_layer + 20 * own_kv)
    assert total == 4_435_182_688
    m = shard_map(presets()[E2B], 1)
    assert sum(math.prod(t.shape) for t in tensors(build_plan(m.model)) if not t.plan.tower) == total
    # correct_output_scale is float32; the audio tower and its embedder (below) are whole on the one GPU
    assert m.total_weight_bytes == 2 * total + 2 * layers * h + 2 * 684_694_048
    assert round((total + 10 * own_kv) / 1e9, 2) == 4.46


def test_e2b_audio_tower_and_embedder_are_their_hand_count():
    """gemma3n_mm.py's audio tower, transformers' Gemma3nAudioEncoder (USM): two sub-sampling convs (128 then
    32 channels, each with its norm) and a 32 x 32 -> 1536 projection, then 12 conformer blocks of 1536 (two
    macaron feed-forwards of 6144 with their norms, attention with a position projection and a 192-wide
    per-dim scale, a light conv of kernel 5), and embed_audio: a 128-row table, two norms and the 1536 -> 2048
    projection."""
    h = 1536
    ffw = 2 * h + 2 * h * 4 * h
    block = 2 * ffw + (h + 192 + 5 * h * h + h) + (h + 3 * h * h + 5 * h + h) + h
    tower = 12 * block + (128 * 9 + 128) + (32 * 128 * 9 + 32) + h * 32 * 32
    embedder = 128 * h + 2 * h + 2048 * h
    m = shard_map(presets()[E2B], 1)
    assert sum(math.prod(t.shape) for t in tensors(build_plan(m.model)) if t.plan.tower) == tower + embedder
    assert tower + embedder == 684_694_048
    # the runtime dump's 5,439.44M in all (docs/presets.md): the map's text and audio, the k / v / k_norm the
    # release ships for its 10 KV-shared layers, and the vision side the map leaves out: timm's
    # mobilenetv5_300m_enc (294,126,912, counted off timm in the oracle's venv) and embed_vision
    shipped, vision = 10 * (2 * 512 * 2048 + 256), 294_126_912 + 128 * 2048 + 2 * 2048 + 2048 * 2048
    mapped = sum(math.prod(t.shape) for t in tensors(build_plan(m.model)))
    assert round((mapped + shipped + vision) / 1e6, 2) == 5439.44


def test_e2b_splits_at_tp2_by_hand():
    """LAuReL's linear_left [64, 2048] by rows (32 a GPU), linear_right [2048, 64] by columns; AltUp's stream
    projections [2048, 2048] by rows; its per-layer tables and correct_output_scale whole (float32)."""
    m = shard_map(presets()[E2B], 2)
    by_name = {t.name: t for t in m.tensors}
    for name, dim, held in (("model.layers.*.laurel.linear_left.weight", 0, 32),
                            ("model.layers.*.laurel.linear_right.weight", 1, 32),
                            ("model.altup_projections.0.weight", 0, 1024),
                            ("model.altup_unembed_projections.2.weight", 0, 1024),
                            ("model.layers.*.altup.prediction_coefs.weight", None, 16),
                            ("model.layers.*.altup.modality_router.weight", None, 4),
                            ("model.layers.*.altup.correct_output_scale", None, 2048)):
        t = by_name[name]
        assert t.split_dim == dim, name
        assert [sum(p.stop - p.start for p in t.rank_pieces(r)) for r in (0, 1)] == [held] * 2, name
    scale = next(p for p in m.params if p.name.endswith("correct_output_scale"))
    assert scale.element_bytes == 4 and scale.count == 30


def test_e2b_collectives_at_tp2():
    """Besides o_proj's and down_proj's, LAuReL all-reduces in each of the 30 layers, and AltUp's 3 + 3
    stream projections all-gather a hidden state each."""
    m = shard_map(presets()[E2B], 2)
    found = {(c.op, c.where.split(" (")[0]): c for c in collectives(m)}
    laurel = found[("all-reduce", "after laurel.linear_right")]
    assert laurel.count == 30 and laurel.bytes_per_token == 2048 * 2 and laurel.sent_per_rank == 2048 * 2
    gather = found[("all-gather", "after altup_projections and altup_unembed_projections")]
    assert gather.count == 6 and gather.sent_per_rank == 2048


def test_e4b_is_transformers_defaults_and_caches_its_own_layers():
    """E4B: 35 layers of MLP 16384, the last 15 KV-shared: 20 layers own a cache (4 full layers of two KV
    heads of 256, 16 sliding up to 512 tokens)."""
    m = shard_map(presets()[E4B], 1)
    assert {layer.ffn.size for layer in m.model.layers} == {16384}
    assert sum(layer.mixer.kv_shared for layer in m.model.layers) == 15
    assert m.ranks[0].kv_cache_bytes_per_token == 4 * 2 * 2 * 256 * 2
    assert m.ranks[0].kv_cache_windowed[0]["layers"] == 16


def test_tp_is_bound_by_heads_and_pp_is_refused():
    assert shard_map(presets()[E2B], 8).tp_size == 8  # two KV heads replicated 4 times
    with pytest.raises(TPSizeError):
        shard_map(presets()[E2B], 16)  # 8 query heads
    problem = ruleset("vllm").layout_problem(Layout(tp=1, pp=2), normalize(presets()[E2B]))
    assert "Gemma3nForConditionalGeneration does not support pipeline parallelism" in problem
    assert "--pipeline-parallel-size 1" in problem
    with pytest.raises(TPSizeError, match="pipeline"):
        shard_map(presets()[E2B], 1, layout=Layout(tp=1, pp=2))


def test_notes_name_the_towers_left_out_and_the_local_sparsity_statistics():
    notes = " ".join(shard_map(presets()[E2B], 2).model.notes)
    assert "left out of the map" in notes and "vision tower" in notes
    assert "each GPU's own slice" in notes
    assert "hands each token's" not in notes  # no PP hand-off note: it runs no pp


def test_release_checkpoint_names_line_up(tmp_path):
    """The release stores the decoder under model.language_model.*, the audio tower and its embedder (mapped),
    the vision tower and its embedder (left out),
    and k/v/k_norm for the shared layers (dropped at load, as vLLM's weights mapper does)."""
    written = {f"model.language_model.{n.removeprefix('model.')}" for n in saved(tmp_path)}
    shipped = {f"model.language_model.layers.{i}.self_attn.{n}.weight" for i in (3, 4, 5)
               for n in ("k_proj", "v_proj", "k_norm")}
    with torch.device("meta"):  # the audio tower as transformers builds it (mapped); the vision one left out
        config = transformers.Gemma3nAudioConfig(**presets()[E2B]["audio_config"])
        audio = transformers.Gemma3nAudioEncoder(config)
    towers = {"model.vision_tower.timm_model.conv_stem.conv.weight", "model.embed_vision.embedding.weight",
              *(f"model.audio_tower.{n}" for n in audio.state_dict()),
              *(f"model.embed_audio.{n}.weight" for n in ("embedding", "hard_embedding_norm",
                                                          "soft_embedding_norm", "embedding_projection"))}
    cfg = {**presets()[E2B], "text_config": {**text(), **TINY}}
    m = shard_map(cfg, 2, tensor_names=written | shipped | towers, checkpoint_source="release")
    assert m.checkpoint["verified"] and m.checkpoint["dropped"] == 9, m.checkpoint
    assert "KV-shared layers" in checkpoint_sentence(m.checkpoint)


@pytest.mark.parametrize("over, match", [
    ({"hidden_activation": "gelu"}, "gelu_pytorch_tanh"),
    ({"altup_correct_scale": False}, "altup_correct_scale"),
    ({"altup_active_idx": 4}, "altup_active_idx"),
    ({"num_kv_shared_layers": 29}, "num_kv_shared_layers"),
    ({"num_kv_shared_layers": 30}, "num_kv_shared_layers"),
    ({"intermediate_size": [8192] * 29}, "intermediate_size"),
])
def test_configs_vllm_cannot_build_are_refused_in_one_line(over, match):
    with pytest.raises(ConfigError, match=match) as e:
        shard_map(wrapped(**over), 2)
    assert "\n" not in str(e.value)


def test_kv_shared_target_of_another_kind_is_refused():
    """vLLM takes a shared full layer's cache from the layer just before the shared ones and a sliding one's
    from two before: with E2B's pattern shifted by one, layer 18 is full, so sliding layer 20 would read a
    full layer's cache (though layer 19 is sliding)."""
    types = (["sliding_attention"] * 3 + ["full_attention", "sliding_attention"]) * 6
    with pytest.raises(ConfigError, match=r"gives shared layer 20 \(sliding_attention\) the KV cache of "
                                          "layer 18, a full_attention layer"):
        shard_map(wrapped(layer_types=types), 2)


def test_quantized_checkpoint_is_refused():
    fp8 = {**presets()[E2B], "quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]}}
    with pytest.raises(ConfigError, match="bf16 checkpoint maps"):
        shard_map(fp8, 2)

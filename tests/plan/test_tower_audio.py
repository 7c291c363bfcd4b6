"""Qwen2-Audio (vLLM 0.33 qwen2_audio.py): transformers' Qwen2AudioEncoder and an nn.Linear projector, whole
on every GPU, before a Qwen2 decoder built from text_config (its sizes left to Qwen2Config's defaults in the
release). Checked by hand against the release's count and against what transformers saves."""
import json

import pytest
import transformers

from tpviz import load_spec, shard_map
from tpviz.config.sources import presets
from tpviz.errors import ConfigError, TPSizeError
from tpviz.plan import build_plan
from tpviz.plan.tensors import tensors
from tpviz.render.plots import all_figures
from tpviz.render.plots.strip import layer_strip
from tpviz.render.summary import memory_rows
from tpviz.trace.shardmap import ShardMap, numel
from tests.helpers.checkpoint import written_shapes
from tests.helpers.errors import one_line
from tests.plan.test_tower import TEXT

KEY = "Qwen/Qwen2-Audio-7B"


def test_qwen2_audio_7b_is_the_release_count_with_its_tower_whole_on_every_gpu():
    """Qwen2-Audio-7B holds 8,397,094,912 values: Qwen2Config's default decoder (4096 wide, 32 layers of 32
    heads, q/k/v biased) over 156032 tokens with an 11008 MLP, Whisper-large's encoder (32 layers of 1280,
    k_proj unbiased, two kernel-3 convs over 128 mel bins, 1500 positions) and a 1280 -> 4096 projector."""
    h, i, V = 4096, 11008, 156032
    text = 2 * V * h + h + 32 * (3 * (h * h + h) + h * h + 3 * h * i + 2 * h)
    w, f = 1280, 5120
    layer = 4 * w * w + 3 * w + 2 * 2 * w + (w * f + f) + (f * w + w)
    audio = w * 128 * 3 + w + w * w * 3 + w + 1500 * w + 32 * layer + 2 * w
    assert text + audio + (w * h + h) == 8_397_094_912
    m = shard_map(KEY, 1)
    assert m.total_weight_bytes == 8_397_094_912 * 2  # bf16; 156032 is a multiple of 64, so no vocab padding
    tower = [t for t in shard_map(KEY, 8).tensors if t.tower]
    assert len(tower) == 24 and {t.tower for t in tower} == {"audio"}
    assert all(t.split_dim is None and t.family == "audio" for t in tower)
    # named by the transformers module vLLM builds (no vLLM parallel layer among them)
    assert {t.layer_class for t in tower} == {"nn.Linear", "nn.LayerNorm", "nn.Conv1d", "nn.Embedding"}
    spec = load_spec(KEY)
    assert spec.audio.file.startswith("qwen2_audio.py") and spec.tower is None
    assert any("audio tower (32 blocks, 1280 wide)" in n for n in spec.notes)
    assert any(n.startswith("text_config leaves hidden_size (4096)") for n in spec.notes)
    assert not any("only the text decoder is mapped" in n for n in spec.notes)


def test_every_gpu_holds_the_whole_tower_and_only_the_decoder_limits_tp():
    """At any tp each GPU holds the tower's 636,968,960 values and the projector whole (its memory counts them
    on every rank); tp 64 fails on the decoder's 32 heads, never on the tower's 20."""
    tower_bytes = (636_968_960 + 1280 * 4096 + 4096) * 2
    for tp in (2, 4, 8):
        m = shard_map(KEY, tp)
        assert all(r.weight_bytes_by_family["audio"] == tower_bytes for r in m.ranks)
        assert all(row["audio"] == tower_bytes for row in memory_rows(m))
    with pytest.raises(TPSizeError) as e:
        shard_map(KEY, 64)
    assert one_line(e.value) and "num_attention_heads=32" in str(e.value) and "audio" not in str(e.value)


def test_the_audio_tower_has_its_own_tab_and_strip_bar():
    m = shard_map(KEY, 4)
    figs = all_figures(m)
    assert "audio" in figs and figs["audio"].layout.title.text.startswith("Audio tower · whole")
    assert len(figs["audio"].layout.yaxis.ticktext) == 24  # the tower's tensors, not the decoder's norms
    assert not any("conv1" in t for t in figs["replicated"].layout.yaxis.ticktext)
    strip = layer_strip(m)
    assert strip.layout.xaxis.ticktext[0] == "audio" and "whole on every GPU" in strip.data[1].hovertext[0]
    again = ShardMap.from_dict(json.loads(m.to_json()))  # an exported map draws the same tab
    assert again.model.audio == m.model.audio and "audio" in all_figures(again)


def saved(tmp_path) -> tuple[dict, dict]:
    """A tiny Qwen2-Audio as transformers saves it: the released layout (audio_tower.*,
    multi_modal_projector.*, language_model.model.*, language_model.lm_head), but transformers 5 writes the
    decoder's body under language_model.model.model.*, which no release has: renamed."""
    cfg = dict(model_type="qwen2_audio", text_config=dict(model_type="qwen2", **TEXT),
               audio_config=dict(d_model=32, encoder_layers=2, encoder_attention_heads=4, encoder_ffn_dim=48,
                                 num_mel_bins=16, max_source_positions=20))
    model = transformers.Qwen2AudioForConditionalGeneration(transformers.AutoConfig.for_model(**cfg))
    shapes = {n.replace("language_model.model.model.", "language_model.model.", 1): s
              for n, s in written_shapes(model, tmp_path).items()}
    return json.loads((tmp_path / "config.json").read_text()), shapes


def test_the_map_names_and_shapes_what_transformers_saves(tmp_path):
    cfg, shapes = saved(tmp_path)
    m = shard_map(cfg, 2, tensor_names=set(shapes), checkpoint_source="tiny")
    planned = {t.name: t.shape for t in tensors(build_plan(m.model)) if t.plan.tower}
    assert planned == {n: s for n, s in shapes.items() if n.startswith(("audio_tower.", "multi_modal_proj"))}
    assert m.checkpoint["verified"] and not m.checkpoint.get("dropped"), m.checkpoint


@pytest.mark.parametrize("change, words", [
    ({"audio_config": {"d_model": 1280, "encoder_attention_heads": 3}}, "audio_config: d_model 1280 is not "),
    ({"audio_config": {"d_model": -4}}, "audio_config: "),
    ({"text_config": {"model_type": "llama", "vocab_size": 1000, "hidden_size": 64, "num_attention_heads": 4,
                      "num_hidden_layers": 2, "intermediate_size": 96}}, "builds a Qwen2 decoder"),
])
def test_a_bad_audio_config_is_one_line(change, words):
    cfg = {**presets()[KEY], **{k: {**presets()[KEY][k], **v} if k == "audio_config" else v
                                for k, v in change.items()}}
    with pytest.raises(ConfigError) as e:
        shard_map(cfg, 2)
    assert one_line(e.value) and words in str(e.value), str(e.value)


# Qwen2.5-Omni (qwen2_5_omni_thinker.py): the thinker alone, Qwen2.5-VL's vision tower with q/k/v stored
# apart, transformers' Qwen2_5OmniAudioEncoder whole, the Qwen2 decoder; talker.* and token2wav.* dropped at
# load
OMNI_THINKER = dict(
    model_type="qwen2_5_omni_thinker", text_config=dict(model_type="qwen2_5_omni_text", **TEXT),
    audio_config=dict(d_model=32, encoder_layers=2, encoder_attention_heads=4, encoder_ffn_dim=48,
                      num_mel_bins=16, max_source_positions=20, output_dim=64, n_window=4),
    vision_config=dict(depth=2, hidden_size=32, intermediate_size=48, num_heads=2, out_hidden_size=64,
                       fullatt_block_indexes=[1]))


def omni_saved(tmp_path) -> tuple[dict, dict]:
    """A tiny thinker as transformers saves it, under thinker.* as the release stores it, with a talker and a
    token2wav tensor beside it; the config wraps it as Qwen2_5OmniModel's does."""
    model = transformers.Qwen2_5OmniThinkerForConditionalGeneration(
        transformers.AutoConfig.for_model(**OMNI_THINKER))
    shapes = {f"thinker.{n}": s for n, s in written_shapes(model, tmp_path).items()}
    shapes |= {"talker.model.norm.weight": (8,), "token2wav.code2wav_dit_model.proj.weight": (3, 3)}
    return {"model_type": "qwen2_5_omni", "architectures": ["Qwen2_5OmniModel"],
            "thinker_config": json.loads((tmp_path / "config.json").read_text())}, shapes


def test_omni_maps_its_thinker_as_transformers_saves_it_and_drops_the_talker(tmp_path):
    cfg, shapes = omni_saved(tmp_path)
    m = shard_map(cfg, 2, tensor_names=set(shapes), checkpoint_source="tiny")
    planned = {t.name: t.shape for t in tensors(build_plan(m.model)) if t.plan.tower}
    assert planned == {n.removeprefix("thinker."): s for n, s in shapes.items()
                       if n.startswith(("thinker.visual.", "thinker.audio_tower."))}
    assert m.checkpoint["verified"] and m.checkpoint["dropped"] == 2, m.checkpoint
    assert (m.model.tower.kind, m.model.audio.kind) == ("qwen2_5_omni", "qwen2_5_omni_audio")
    # q/k/v stored apart load into one QKVParallelLinear over the vision heads, named as vLLM's (attn.qkv)
    q = m.tensor("visual.blocks.*.attn.q.weight")
    assert q.param == "visual.blocks.*.attn.qkv.weight" and q.split_dim == 0
    assert [(p.start, p.stop) for p in q.rank_pieces(1)] == [(16, 32)]
    assert all(t.split_dim is None for t in m.tensors if t.tower == "audio")
    assert any("talker and token2wav" in n for n in m.model.notes)
    with pytest.raises(TPSizeError) as e:  # 2 vision heads; qwen2_5_omni_thinker.py has no data mode
        shard_map(cfg, 4)
    assert one_line(e.value) and "vision_config.num_heads=2" in str(e.value) and "has no" in str(e.value)


def test_omni_without_its_thinker_config_is_one_line():
    with pytest.raises(ConfigError) as e:
        shard_map({"model_type": "qwen2_5_omni", "architectures": ["Qwen2_5OmniModel"]}, 1)
    assert one_line(e.value) and "thinker_config" in str(e.value)


def omni_thinker_values(c: dict) -> dict[str, int]:
    """Qwen2.5-Omni's thinker by hand, per part: Whisper-large's encoder with its two convs, ln_post, proj to
    output_dim and two bos / eos rows; Qwen2.5-VL's ViT (gated MLP, RMS norms, a Conv3d patch kernel, the
    merger over 2 x 2 patches); the Qwen2 decoder with q/k/v biases; its lm_head untied."""
    t, a, v = (c["thinker_config"][k] for k in ("text_config", "audio_config", "vision_config"))
    w, f, out = a["d_model"], a["encoder_ffn_dim"], a["output_dim"]
    audio = (w * a["num_mel_bins"] * 3 + w + w * w * 3 + w + 2 * out + 2 * w + out * w + out
             + a["encoder_layers"] * (4 * w * w + 3 * w + 4 * w + 2 * w * f + f + w))
    e, i, wide = v["hidden_size"], v["intermediate_size"], v["hidden_size"] * 4
    block = 3 * e * e + 3 * e + e * e + e + 3 * e * i + 2 * i + e + 2 * e
    visual = (e * 3 * 2 * 14 * 14 + v["depth"] * block
              + e + wide * wide + wide + out * wide + out)
    h, V, n, kv = t["hidden_size"], t["vocab_size"], t["num_hidden_layers"], t["num_key_value_heads"] * 128
    model = V * h + h + n * (h * h + h + 2 * (h * kv + kv) + h * h + 3 * h * t["intermediate_size"] + 2 * h)
    return {"audio_tower": audio, "visual": visual, "model": model, "lm_head": V * h}


def parts(key: str) -> dict[str, int]:
    m = shard_map(key, 1)
    out: dict[str, int] = {}
    for p in m.params:
        out[p.name.split(".")[0]] = out.get(p.name.split(".")[0], 0) + p.count * numel(p.shape)
    return out


def test_omni_3b_thinker_is_the_measured_checkpoint_and_7b_follows_the_same_count():
    """A parameter table of the loaded Qwen2.5-Omni-3B checkpoint gives its thinker as audio_tower
    637,676,544, visual 668,684,288, model 3,085,938,688 and lm_head 311,164,928 (4,703,464,448 in all): the
    hand count and the map equal each part. The 7B's map equals the same count of its own config."""
    measured = {"audio_tower": 637_676_544, "visual": 668_684_288, "model": 3_085_938_688,
                "lm_head": 311_164_928}
    assert omni_thinker_values(presets()["Qwen/Qwen2.5-Omni-3B"]) == measured == parts("Qwen/Qwen2.5-Omni-3B")
    assert parts("Qwen/Qwen2.5-Omni-7B") == omni_thinker_values(presets()["Qwen/Qwen2.5-Omni-7B"])
    assert shard_map("Qwen/Qwen2.5-Omni-7B", 4).ranks[0].weight_bytes_by_family["audio"] == 639_647_232 * 2
    # its vision MLP (3420) is not cut 8 ways, and no data mode avoids it
    with pytest.raises(TPSizeError) as e:
        shard_map("Qwen/Qwen2.5-Omni-3B", 8)
    assert one_line(e.value) and "intermediate_size=3420" in str(e.value) and "has no" in str(e.value)


# Qwen3-Omni (qwen3_omni_moe_thinker.py): the thinker alone; its audio encoder of vLLM parallel layers, split
# over the audio heads where they divide tp and whole (disable_tp) where not; its ViT with Qwen2.5-VL-named
# mergers
OMNI3_THINKER = dict(
    model_type="qwen3_omni_moe_thinker",
    text_config=dict(model_type="qwen3_omni_moe_text", hidden_size=64, intermediate_size=96,
                     moe_intermediate_size=16, num_experts=4, num_experts_per_tok=2, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=512),
    audio_config=dict(d_model=32, encoder_layers=2, encoder_attention_heads=2, encoder_ffn_dim=48,
                      num_mel_bins=16, downsample_hidden_size=8, output_dim=64, max_source_positions=20,
                      n_window=4),
    vision_config=dict(depth=3, hidden_size=32, intermediate_size=48, num_heads=4, out_hidden_size=64,
                       deepstack_visual_indexes=[0, 1], num_position_embeddings=16, patch_size=4))


def test_qwen3_omni_names_what_transformers_saves_and_splits_audio_only_where_heads_divide(tmp_path):
    model = transformers.Qwen3OmniMoeThinkerForConditionalGeneration(
        transformers.AutoConfig.for_model(**OMNI3_THINKER))
    shapes = {f"thinker.{n}": s for n, s in written_shapes(model, tmp_path).items()}
    shapes |= {"talker.model.norm.weight": (8,), "code2wav.decoder.0.conv.weight": (3, 3)}
    cfg = {"model_type": "qwen3_omni_moe", "architectures": ["Qwen3OmniMoeForConditionalGeneration"],
           "thinker_config": json.loads((tmp_path / "config.json").read_text())}
    # 4 x 4 cells
    cfg["thinker_config"]["vision_config"] |= {"image_size": 16, "apply_vit_abs_pos_embed": True}
    m = shard_map(cfg, 2, tensor_names=set(shapes), checkpoint_source="tiny")
    planned = {t.name: t.shape for t in tensors(build_plan(m.model)) if t.plan.tower}
    assert planned == {n.removeprefix("thinker."): s for n, s in shapes.items()
                       if n.startswith(("thinker.visual.", "thinker.audio_tower."))}
    assert m.checkpoint["verified"] and m.checkpoint["dropped"] == 2, m.checkpoint
    fc1 = m.tensor("audio_tower.layers.*.fc1.weight")  # 2 audio heads: cut at tp 2 ...
    assert fc1.layer_class == "ColumnParallelLinear"
    assert [(p.start, p.stop) for p in fc1.rank_pieces(1)] == [(24, 48)]
    k_proj = m.tensor("audio_tower.layers.*.self_attn.k_proj.weight")
    assert k_proj.param.endswith("self_attn.qkv_proj.weight")
    whole = shard_map(cfg, 4).tensor("audio_tower.layers.*.fc1.weight")  # ... whole on each of 4 GPUs
    assert [(p.start, p.stop) for p in whole.rank_pieces(3)] == [(0, 48)] and "disable_tp" in whole.note
    assert any("split over its 2 heads where they divide tp" in n for n in m.model.notes)
    bad = json.loads(json.dumps(cfg))
    bad["thinker_config"]["vision_config"]["apply_vit_abs_pos_embed"] = False
    with pytest.raises(ConfigError) as e:
        shard_map(bad, 2)
    assert one_line(e.value) and "apply_vit_abs_pos_embed" in str(e.value)


def test_qwen3_omni_30b_thinker_by_hand():
    """Qwen3-Omni-30B-A3B's thinker: Qwen3-MoE's decoder (48 layers of 32 / 4 heads with q/k norms, 128
    experts of 768, untied), its ViT (27 blocks, position table of (768 / 16)² cells, a merger and three
    deepstack ones)
    and its audio encoder (32 layers, three Conv2d of 480 channels, conv_out, ln_post, proj1 and proj2):
    31,719,205,488 values."""
    c = presets()["Qwen/Qwen3-Omni-30B-A3B-Instruct"]["thinker_config"]
    t, a, v = c["text_config"], c["audio_config"], c["vision_config"]
    h, V, n, E, mi = t["hidden_size"], t["vocab_size"], t["num_hidden_layers"], t["num_experts"], \
        t["moe_intermediate_size"]
    q, kv = t["num_attention_heads"] * t["head_dim"], t["num_key_value_heads"] * t["head_dim"]
    text = 2 * V * h + h + n * (2 * h * q + 2 * h * kv + 2 * t["head_dim"] + h * E + E * 3 * h * mi + 2 * h)
    w, f, d, out = a["d_model"], a["encoder_ffn_dim"], a["downsample_hidden_size"], a["output_dim"]
    bins = a["num_mel_bins"]
    for _ in range(3):
        bins = (bins + 1) // 2
    audio = (a["encoder_layers"] * (4 * w * w + 4 * w + 2 * w * f + f + w + 4 * w)
             + d * 9 + d + 2 * (d * d * 9 + d) + d * bins * w + 2 * w + w * w + w + out * w + out)
    e, m, p, wide = v["hidden_size"], v["intermediate_size"], v["patch_size"], v["hidden_size"] * 4
    merger = wide * wide + wide + out * wide + out
    visual = (v["depth"] * (4 * e * e + 4 * e + 2 * e * m + m + e + 4 * e) + e * 3 * 2 * p * p + e
              + (v["image_size"] // p) ** 2 * e + 2 * e + merger
              + len(v["deepstack_visual_indexes"]) * (2 * wide + merger))
    assert text + audio + visual == 31_719_205_488
    assert shard_map("Qwen/Qwen3-Omni-30B-A3B-Instruct", 1).total_weight_bytes == 31_719_205_488 * 2


def test_a_config_its_class_refuses_names_that_first_and_a_null_text_config_its_defaults():
    """audio_config given as a string: transformers' Qwen2AudioConfig refuses the config, and tpviz says so
    before what the reading as given then lacks; text_config null: vLLM builds Qwen2Config's whole default
    decoder, and the note names every size taken from it."""
    base = presets()[KEY]
    with pytest.raises(ConfigError) as e:
        shard_map({**base, "audio_config": "x"}, 2)
    assert one_line(e.value) and str(e.value).startswith("transformers' Qwen2AudioConfig refuses it (")
    assert "read as given, text_config is missing hidden_size" in str(e.value)
    spec = load_spec({**base, "text_config": None})
    note = next(n for n in spec.notes if n.startswith("text_config leaves"))
    assert all(f"{key} ({n})" in note for key, n in (("hidden_size", 4096), ("vocab_size", 151936),
                                                      ("intermediate_size", 22016)))

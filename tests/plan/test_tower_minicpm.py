"""MiniCPM-V (plan/tower_minicpm.py, archs/vision.py) as vLLM 0.33's minicpmv.py builds it: the decoder by
version, the Idefics2 tower's names and shapes against what transformers' own class writes, the split of its
heads and MLP rows at tp 2 by hand, the resampler whole on every GPU, the vision heads' limit on tp and
--mm-encoder-tp-mode data; the real 2.6 and 4.5 indexes (tests/trace/test_real_indexes.py) check every name
and their total_size; 4.6 (minicpmv4_6.py) against its release's safetensors header."""
import gzip
import json
from pathlib import Path

import pytest
import torch
import transformers

from tpviz import shard_map
from tpviz.config.sources import load_spec, presets
from tpviz.errors import ConfigError, TPSizeError
from tpviz.plan import build_plan
from tpviz.plan.tensors import tensors
from tpviz.trace.checkpoint import expand
from tpviz.trace.shardmap import numel
from tests.helpers.errors import one_line

INDEXES = Path(__file__).resolve().parents[1] / "data" / "indexes"
VISION = dict(hidden_size=32, num_attention_heads=4, intermediate_size=48, num_hidden_layers=3, image_size=56,
              patch_size=14)
TINY = dict(model_type="minicpmv", architectures=["MiniCPMV"], version=2.6, hidden_size=64,
            num_attention_heads=4, num_key_value_heads=2, intermediate_size=96, num_hidden_layers=2,
            vocab_size=512, tie_word_embeddings=False, query_num=8, drop_vision_last_layer=True,
            vision_config=dict(model_type="siglip", **VISION))


def real(name: str) -> dict:
    return json.loads(gzip.decompress((INDEXES / f"{name}.json.gz").read_bytes()))["config"]


@pytest.mark.parametrize("version, decoder", [(2.5, "minicpmv_2_5_text"), (2.6, "qwen2"), (4.0, "llama"),
                                              (4.5, "qwen3")])
def test_each_version_builds_its_own_decoder(version, decoder):
    """minicpmv.py's _SUPPORT_VERSION: 2.5 and 4.0 LlamaForCausalLM, 2.6 Qwen2, 4.5 Qwen3 (q/k norms);
    the decoder's names sit under llm., which the checkpoint check strips. SGLang 0.5.23's minicpmv.py builds
    2.6, 4.0 and 4.5 alike but no 2.5: refused under its rules."""
    spec = load_spec({**TINY, "version": version})
    assert spec.model_type == decoder and spec.tower.kind == "minicpmv"
    assert spec.attention_bias == (decoder == "qwen2") and spec.qk_norm == (decoder == "qwen3")
    if version == 2.5:
        with pytest.raises(TPSizeError) as e:
            shard_map(spec, 2, rules="sglang")
        assert one_line(e.value) and "minicpmv_2_5_text" in str(e.value)
    else:  # the decoder by SGLang's own groups, the tower left out and named
        m = shard_map(spec, 2, rules="sglang")
        assert not any(t.tower for t in m.tensors) and any("vision tower" in w for w in m.warnings)


def test_versions_vllm_does_not_build_are_refused():
    """No version: 2.0 for a 2304-wide decoder with 64 queries (MiniCPM's decoder), else 2.5; a version
    minicpmv.py has no class for raises there, so here."""
    two = load_spec({k: v for k, v in {**TINY, "hidden_size": 2304, "query_num": 64}.items()
                     if k != "version"})
    assert two.model_type == "minicpm" and two.tower.kind == "minicpmv2_0"
    assert load_spec({k: v for k, v in TINY.items() if k != "version"}).model_type == "minicpmv_2_5_text"
    for version in (3.0, 4, "4.6"):
        with pytest.raises(ConfigError) as e:
            load_spec({**TINY, "version": version})
        assert one_line(e.value) and "2.0, 2.5, 2.6, 4.0 and 4.5" in str(e.value)


def test_the_tower_names_and_shapes_what_transformers_writes():
    """Idefics2VisionTransformer (SigLIP's names) as transformers builds it, its last layer dropped as
    drop_vision_last_layer says (vLLM's loader skips it; MiniCPM-V's own code never saves it)."""
    config = transformers.Idefics2VisionConfig(**VISION)
    with torch.device("meta"):
        model = transformers.models.idefics2.modeling_idefics2.Idefics2VisionTransformer(config)
    saved = {f"vpm.{n}": tuple(p.shape) for n, p in model.named_parameters() if "layers.2." not in n}
    planned = {t.name: tuple(t.shape) for t in tensors(build_plan(load_spec(TINY)))}
    assert {n: planned[n] for n in saved} == saved
    assert {n for n in planned if n.startswith("vpm.")} == set(saved)


def test_the_resampler_by_hand():
    """BaseResampler: 8 queries of the decoder's 64, kv_proj 32 -> 64 (no bias), nn.MultiheadAttention's
    in_proj [192, 64] and out_proj, three LayerNorms, proj [64, 64]."""
    shapes = {t.name: tuple(t.shape) for t in tensors(build_plan(load_spec(TINY)))
              if t.name.startswith("resampler.")}
    assert shapes == {"resampler.query": (8, 64), "resampler.kv_proj.weight": (64, 32),
                      "resampler.attn.in_proj_weight": (192, 64), "resampler.attn.in_proj_bias": (192,),
                      "resampler.attn.out_proj.weight": (64, 64), "resampler.attn.out_proj.bias": (64,),
                      "resampler.proj": (64, 64),
                      **{f"resampler.{n}.{s}": (64,) for n in ("ln_q", "ln_kv", "ln_post")
                         for s in ("weight", "bias")}}
    same = {**TINY, "vision_config": {**TINY["vision_config"], "hidden_size": 64, "num_attention_heads": 4}}
    assert not any("kv_proj" in t.name for t in tensors(build_plan(load_spec(same))))  # an identity there


def test_minicpm_v_2_6_at_tp_2_by_hand():
    """16 vision heads of 72: q (1152 rows) halves per rank; out_proj's columns; fc1's 4304 rows in 2152;
    the kernel, position table (70 × 70) and the whole resampler on both GPUs."""
    m = shard_map(real("openbmb__MiniCPM-V-2_6"), 2)
    q = m.tensor("vpm.encoder.layers.*.self_attn.q_proj.weight")
    assert q.blocks == 27 and q.shape == [1152, 1152] and q.layer_class == "QKVParallelLinear"
    assert [(p.start, p.stop) for p in q.rank_pieces(1)] == [(576, 1152)]
    assert m.tensor("vpm.encoder.layers.*.self_attn.out_proj.weight").split_dim == 1
    assert [(p.start, p.stop) for p in m.tensor("vpm.encoder.layers.*.mlp.fc1.weight").rank_pieces(1)] == [
        (2152, 4304)]
    assert m.tensor("vpm.embeddings.position_embedding.weight").shape == [4900, 1152]
    resampler = [t for t in m.tensors if t.name.startswith("resampler.")]
    assert len(resampler) == 13 and all(t.split_dim is None for t in resampler)
    assert m.tensor("resampler.kv_proj.weight").shape == [3584, 1152]
    d, v, i = 3584, 1152, 4304  # resampler, tower widths; the tower's MLP
    block = 3 * (v * v + v) + v * v + v + 2 * i * v + i + v + 4 * v
    once = v * 3 * 14 * 14 + v + 4900 * v + 2 * v
    resampled = 64 * d + d * v + 3 * d * d + 3 * d + d * d + d + 6 * d + d * d
    tower = sum(p.count * numel(p.shape) for p in m.params if p.tower)
    assert tower == 27 * block + once + resampled
    # rank 1 holds half of each split linear weight and the rest whole
    split = 27 * (3 * v * v // 2 + 3 * v // 2 + v * v // 2 + i * v)
    assert m.ranks[1].weight_bytes_by_family["vision"] == 2 * (tower - split - 27 * (i // 2))


def test_vision_heads_limit_tp_unless_the_encoder_runs_data_parallel():
    """4.5 (Qwen3-8B: 32 heads) splits 32 ways; Idefics2's attention asserts its 16 heads divide tp, with no
    fallback; minicpmv.py supports --mm-encoder-tp-mode data, where tp 32 maps with the tower whole."""
    cfg = real("openbmb__MiniCPM-V-4_5")
    with pytest.raises(TPSizeError) as e:
        shard_map(cfg, 32)
    assert one_line(e.value) and "vision_config.num_attention_heads=16" in str(e.value)
    assert "--mm-encoder-tp-mode data" in str(e.value)
    m = shard_map(load_spec(cfg).served(mm_encoder="data"), 32)
    assert all(t.split_dim is None for t in m.tensors if t.tower)
    assert m.tensor("vpm.encoder.layers.*.mlp.fc2.bias").layer_class.endswith("(disable_tp)")


def test_minicpm_v_4_6_against_its_released_header():
    """MiniCPM-V 4.6 (minicpmv4_6.py): Qwen3.5's decoder (tied), the Idefics2 tower under vision_tower., its
    window-attention vit_merger and the merger, as the release's safetensors header lists them: 779 tensors
    (432 encoder, 318 decoder layers, 16 vit_merger, 6 merger, 3 embeddings, 2 post_layernorm, the norm and
    the embedding) and 2,600,856,032 bytes (its last data offset) plus 576: vLLM holds the 18 DeltaNet layers'
    A_log (16 heads each) in float32 where the header stores bf16; the merger's shapes as listed there."""
    m = shard_map("openbmb/MiniCPM-V-4.6", 1)
    names = expand(m)
    families = ("vision_tower.encoder.", "model.layers.", "vision_tower.vit_merger.", "merger.mlp.",
                "vision_tower.embeddings.", "vision_tower.post_layernorm.")
    assert [sum(n.startswith(f) for n in names) for f in families] == [432, 318, 16, 6, 3, 2]
    assert len(names) == 779 and m.total_weight_bytes == 2_600_856_032 + 18 * 16 * 2
    assert m.tensor("vision_tower.vit_merger.linear_1.weight").shape == [17216, 4608]
    assert m.tensor("vision_tower.vit_merger.linear_2.weight").shape == [1152, 17216]
    assert m.tensor("merger.mlp.0.linear_1.weight").shape == [4608, 4608]
    assert m.tensor("merger.mlp.0.linear_2.weight").shape == [1024, 4608]


def test_minicpm_v_4_6_at_tp_2_by_hand():
    """The vit_merger's attention is split over the 16 vision heads as the blocks' (QKVParallelLinear,
    out_proj row-parallel); its MLP and the merger are plain nn.Linear, whole on both GPUs; 4.7 keeps every
    layer whatever drop_vision_last_layer says."""
    m = shard_map("openbmb/MiniCPM-V-4.6", 2)
    q = m.tensor("vision_tower.vit_merger.self_attn.q_proj.weight")
    assert [(p.start, p.stop) for p in q.rank_pieces(1)] == [(576, 1152)]
    assert m.tensor("vision_tower.vit_merger.self_attn.out_proj.weight").split_dim == 1
    assert all(m.tensor(n).split_dim is None for n in ("vision_tower.vit_merger.linear_1.weight",
                                                       "merger.mlp.0.linear_2.weight"))
    cfg = presets()["openbmb/MiniCPM-V-4.6"]
    assert load_spec({**cfg, "drop_vision_last_layer": True}).tower.depth == 26
    seven = {**cfg, "model_type": "minicpmv4_7", "architectures": ["MiniCPMV4_7ForConditionalGeneration"],
             "drop_vision_last_layer": True}
    assert load_spec(seven).tower.depth == 27
    with pytest.raises(ConfigError) as e:
        load_spec({**cfg, "text_config": {**cfg["text_config"], "model_type": "qwen3_5_moe_text"}})
    assert one_line(e.value) and "qwen3_5_text" in str(e.value)


def test_minicpm_v_2_0_by_hand():
    """MiniCPMV2_0: MiniCPM's decoder; timm's so400m (its last of 27 blocks dropped) and Resampler2 with its
    [64, 2304] position table, none of it split at tp 2; the released index (tests/trace/
    test_real_indexes.py) matches every name and total_size."""
    cfg = json.loads(gzip.decompress((INDEXES / "openbmb__MiniCPM-V-2.json.gz").read_bytes()))["config"]
    m = shard_map(cfg, 2)
    assert m.model.model_type == "minicpm" and m.model.tower.depth == 26
    tower = [t for t in m.tensors if t.tower]
    assert tower and all(t.split_dim is None for t in tower)
    assert m.tensor("vpm.blocks.*.attn.qkv.weight").shape == [3456, 1152]
    assert m.tensor("resampler.pos_embed").shape == [64, 2304]
    assert m.tensor("resampler.kv_proj.weight").shape == [2304, 1152]
    d, i, r = 1152, 4304, 2304
    block = 3 * d * d + 3 * d + d * d + d + 2 * i * d + i + d + 4 * d
    once = d * 3 * 14 * 14 + d + 729 * d + 2 * d
    resampled = 2 * 64 * r + r * d + 3 * r * r + 3 * r + r * r + r + 6 * r + r * r
    assert sum(p.count * numel(p.shape) for p in m.params if p.tower) == 26 * block + once + resampled

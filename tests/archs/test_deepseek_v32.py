"""DeepSeek-V3.2 and GLM-5 (DeepSeek Sparse Attention) as vLLM 0.33's vllm.models.deepseek_v32 builds them:
DeepSeek-V3's decoder with a lightning indexer beside MLA in every layer (wq_b replicated and quantized as the
model is; wk and weights_proj one unquantized bf16 table built as tp 1; k_norm a float32 LayerNorm) and the
indexer's own key cache. Names and shapes against tiny checkpoints transformers writes; bytes, KV and reads by
hand."""
import pytest
import transformers

from tests.helpers.checkpoint import written_shapes
from tests.helpers.errors import one_line
from tpviz import shard_map
from tpviz.config.normalize import normalize
from tpviz.config.sources import presets
from tpviz.deploy.sizing import Sizer
from tpviz.errors import ConfigError
from tpviz.plan import build_plan
from tpviz.plan.tensors import tensors
from tpviz.rules import Layout

V32 = presets()["deepseek-ai/DeepSeek-V3.2"]
INDEXER = "model.layers.*.self_attn.indexer."
# per layer, as the release stores it (FP8 blocks of 128 x 128): wq_b FP8 [8192, 1536] with float32 scales
# [64, 12]; wk [128, 7168] and weights_proj [64, 7168] held in bf16 (wk dequantized at load); k_norm weight
# and bias float32 [128]
INDEXER_BYTES = 8192 * 1536 + 64 * 12 * 4 + (128 + 64) * 7168 * 2 + 2 * 128 * 4
TINY = dict(num_hidden_layers=3, hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
            num_attention_heads=4, num_key_value_heads=4, q_lora_rank=32, kv_lora_rank=16, qk_nope_head_dim=8,
            qk_rope_head_dim=8, v_head_dim=16, n_routed_experts=4, num_experts_per_tok=2, n_group=1,
            topk_group=1, first_k_dense_replace=1, vocab_size=256, index_n_heads=4, index_head_dim=128,
            index_topk=16, pad_token_id=0)


def saved(model_type: str, hf_class: str, cfg: dict, folder) -> dict[str, tuple]:
    config = transformers.AutoConfig.for_model(model_type, **{k: v for k, v in cfg.items()
                                                              if k not in ("architectures", "model_type")})
    return written_shapes(getattr(transformers, hf_class)(config), folder)


@pytest.mark.parametrize("model_type, hf_class", [("deepseek_v32", "DeepseekV32ForCausalLM"),
                                                  ("glm_moe_dsa", "GlmMoeDsaForCausalLM")])
def test_names_and_shapes_are_what_transformers_saves(model_type, hf_class, tmp_path):
    cfg = {**TINY, "model_type": model_type, "architectures": [hf_class], "topk_method": "noaux_tc"}
    written = saved(model_type, hf_class, cfg, tmp_path)
    assert "model.layers.2.self_attn.indexer.wq_b.weight" in written
    m = shard_map(cfg, 2, tensor_names=set(written), checkpoint_source="tiny")
    assert m.checkpoint["verified"], m.checkpoint
    assert {t.name: tuple(t.shape) for t in tensors(build_plan(m.model))} == written


def test_tp2_holds_the_indexer_whole_on_each_gpu():
    """wq_b [8192, 1536] (and its [64, 12] scales), wk [128, 7168] and weights_proj [64, 7168] (rows 0-127
    and 128-191 of wk_weights_proj) and k_norm reach both GPUs whole; q_b_proj's 128 heads of 192 split in
    two."""
    m = shard_map(V32, 2)
    by_name = {t.name: t for t in m.tensors}
    for name, rows in (("wq_b.weight", 8192), ("wq_b.weight_scale_inv", 64), ("wk.weight", 128),
                       ("weights_proj.weight", 64), ("k_norm.weight", 128), ("k_norm.bias", 128)):
        t = by_name[INDEXER + name]
        assert t.split_dim is None
        for rank in (0, 1):
            assert sum(p.stop - p.start for p in t.rank_pieces(rank)) == rows, name
    params = {p.name: p for p in m.params}
    fused = params[INDEXER + "wk_weights_proj.weight"]
    assert fused.layer_class == "MergedColumnParallelLinear" and fused.local_shapes == [[192, 7168]] * 2
    q_b = by_name["model.layers.*.self_attn.q_b_proj.weight"]
    assert [sum(p.stop - p.start for p in q_b.rank_pieces(r)) for r in (0, 1)] == [64 * 192] * 2


def test_bytes_are_v3s_plus_the_indexers_by_hand():
    """The same decoder without index keys maps as DeepSeek-V3 (as the release's weights otherwise are); the
    indexers add INDEXER_BYTES a layer, 61 layers (the MTP layer is the draft model's)."""
    plain = {k: v for k, v in V32.items() if not k.startswith("index_")}
    v3 = shard_map({**plain, "model_type": "deepseek_v3", "architectures": ["DeepseekV3ForCausalLM"]}, 1)
    assert INDEXER_BYTES == 15_339_520
    assert shard_map(V32, 1).total_weight_bytes - v3.total_weight_bytes == 61 * INDEXER_BYTES
    # DeepSeek-V3's files are 688,586,727,753 bytes with the MTP layer; V3.2 adds 62 indexers to them
    assert abs(shard_map(V32, 1).total_weight_bytes / (688_586_727_753 + 62 * INDEXER_BYTES) - 1) < 0.025


@pytest.mark.parametrize("tp", [1, 8, 16])
def test_kv_per_token_adds_the_index_keys_whole_on_every_gpu(tp):
    """MLA's latent (512 + 64 bf16 values) and the index key (128 FP8 bytes and one float32 scale per 128,
    uint8) per layer, 61 layers, the same on every GPU."""
    m = shard_map(V32, tp)
    assert {r.kv_cache_bytes_per_token for r in m.ranks} == {61 * ((512 + 64) * 2 + 128 + 4)}


def test_index_cache_builds_indexers_where_vllm_does():
    """index_topk_freq 4 from offset 3 (GLM-5.2's): layers 0-2, then every 4th from 6; the others reuse the
    last top-k, holding no indexer weights and no index keys."""
    m = shard_map({**V32, "index_topk_freq": 4, "index_skip_topk_offset": 3}, 8)
    built = [i for i, layer in enumerate(m.model.layers) if layer.mixer.index_heads]
    assert built == [0, 1, 2] + list(range(6, 61, 4))
    wq_b = next(t for t in m.tensors if t.name == INDEXER + "wq_b.weight")
    assert wq_b.layers == built
    assert m.ranks[0].kv_cache_bytes_per_token == 61 * 1152 + len(built) * 132
    pattern = shard_map({**V32, "index_topk_pattern": "FS" * 30 + "F"}, 1)
    assert [i for i, x in enumerate(pattern.model.layers) if x.mixer.index_heads] == list(range(0, 61, 2))


def test_indexer_types_against_vllms_schedule_is_refused():
    with pytest.raises(ConfigError) as e:
        shard_map({**V32, "indexer_types": ["full", "shared"] * 30 + ["full"]}, 8)
    assert one_line(e.value) and "indexer_types disagrees" in str(e.value) and "layer 1" in str(e.value)


@pytest.mark.parametrize("key", ["index_n_heads", "index_head_dim"])
def test_a_missing_indexer_dimension_is_refused(key):
    with pytest.raises(ConfigError) as e:
        shard_map({k: v for k, v in V32.items() if k != key}, 8)
    assert one_line(e.value) and key in str(e.value)


def test_decode_reads_every_index_key_and_the_top_k_latents():
    """One layer's decode on one GPU of tp 8: the indexer scores every cached token (132 bytes, 64 heads of
    128 multiply-adds), then MLA reads at most index_topk = 2048 latents (16 heads, absorbed: 2 x 512 +
    64)."""
    cost = Sizer(normalize(V32), "vllm").stage_cost(Layout(8, 1, 1, False), {5}, True, True)
    assert sorted(cost.attention) == sorted([(1152, 2048, 16 * (2 * 512 + 64)), (132, 0, 64 * 128)])


@pytest.mark.parametrize("model_type, cls", [("deepseek_v3", "DeepseekV3ForCausalLM"),
                                             ("deepseek_v2", "DeepseekV2ForCausalLM")])
def test_index_topk_on_a_deepseek_config_is_refused(model_type, cls):
    """deepseek_v2.py builds its own indexer for such a config, which tpviz does not model."""
    plain = {k: v for k, v in V32.items() if not k.startswith("index_")}
    m = shard_map({**plain, "model_type": model_type, "architectures": [cls]}, 8)
    assert m.model.model_type == model_type
    with pytest.raises(ConfigError) as e:
        shard_map({**V32, "model_type": model_type, "architectures": [cls]}, 8)
    assert one_line(e.value) and str(e.value).startswith("index_topk=2048: ")
    assert "self_attn.indexer" in str(e.value)


def test_kimi_k25_with_index_topk_is_refused():
    cfg = presets()["moonshotai/Kimi-K2.5"]
    with pytest.raises(ConfigError) as e:
        shard_map({**cfg, "text_config": {**cfg["text_config"], "index_topk": 2048}}, 8)
    assert one_line(e.value) and "indexer" in str(e.value)


def test_fp8_kv_cache_is_refused_naming_the_backend_choice():
    with pytest.raises(ConfigError) as e:
        shard_map(V32, 8, kv_cache_dtype="fp8")
    assert one_line(e.value) and "fp8_ds_mla" in str(e.value)

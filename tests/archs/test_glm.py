"""GLM-4.5 / 4.7 (glm4_moe) and GLM-4-0414 (glm4) against hand computation and against the tiny checkpoints
transformers itself writes (vLLM 0.33 models/glm4_moe.py, models/glm4.py)."""
import pytest
import transformers
from tests.helpers.checkpoint import written_shapes

from tpviz import shard_map
from tpviz.config.sources import load_spec, presets
from tpviz.deploy.deployment import deploy
from tpviz.errors import ConfigError, MissingFieldError
from tpviz.plan import build_plan
from tpviz.plan.tensors import tensors
from tpviz.rules import Layout
from tpviz.trace.checkpoint import compare, expand
from tpviz.trace.collectives import collectives
from tpviz.trace.validity import split_error

GLM47, AIR, FLASH = "zai-org/GLM-4.7", "zai-org/GLM-4.5-Air", "zai-org/GLM-4.7-Flash"
GLM4 = "THUDM/GLM-4-9B-0414"
ATTN = "model.layers.*.self_attn."
TINY = dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
            intermediate_size=96, vocab_size=512)


def saved(hf_class: str, cfg: dict, folder) -> dict[str, tuple]:
    """The tensor names and shapes a tiny random model of hf_class saves (transformers' own writer)."""
    config = transformers.AutoConfig.for_model(**{k: v for k, v in cfg.items() if k != "architectures"})
    return written_shapes(getattr(transformers, hf_class)(config), folder)


def glm47_bytes_by_hand() -> int:
    """GLM-4.7's weights in bytes, as vLLM holds them: bf16, the router and its bias in float32."""
    h, v, inter, moe, experts = 5120, 151552, 12288, 1536, 160
    q, kv = 96 * 128, 8 * 128
    attention = (q + 2 * kv) * h + (q + 2 * kv) + h * q + 2 * 128 + 2 * h  # qkv, biases, o, q/k norms, norms
    dense = 3 * inter * h
    routed = experts * 3 * moe * h + 3 * moe * h  # routed experts and the one shared expert
    params = 2 * v * h + h + 92 * attention + 3 * dense + 89 * routed
    return 2 * params + 4 * 89 * (experts * h + experts)


def test_glm47_by_hand_at_tp8():
    """96 q heads and 8 KV heads over 8 GPUs: 12 q heads and one KV head each; 3 dense layers, 89 MoE."""
    m = shard_map(GLM47, 8)
    assert m.total_weight_bytes == glm47_bytes_by_hand()
    q, k = m.tensor(f"{ATTN}q_proj.weight"), m.tensor(f"{ATTN}k_proj.weight")
    assert [(p.rank, p.start, p.stop) for p in q.pieces][:2] == [(0, 0, 1536), (1, 1536, 3072)]
    assert [(p.rank, p.start, p.stop) for p in k.pieces][:2] == [(0, 0, 128), (1, 128, 256)]
    q_norm = m.tensor(f"{ATTN}q_norm.weight").pieces  # per head: every GPU holds it whole
    assert sorted((p.rank, p.start, p.stop) for p in q_norm) == [(r, 0, 128) for r in range(8)]
    assert not any(p.name.startswith(f"{ATTN}o_proj.bias") for p in m.params)
    router = {p.name.rsplit(".", 2)[-2] + "." + p.name.rsplit(".", 1)[-1]: p.element_bytes for p in m.params
              if ".mlp.gate." in p.name}
    assert router == {"gate.weight": 4, "gate.e_score_correction_bias": 4}
    layers = {p.name: len(p.layers) for p in m.params if p.name.startswith("model.layers.*.mlp.")}
    assert layers["model.layers.*.mlp.gate_up_proj.weight"] == 3
    assert layers["model.layers.*.mlp.shared_experts.gate_up_proj.weight"] == 89
    # K and V of one 128-wide head, 92 layers, bf16
    assert [r.kv_cache_bytes_per_token for r in m.ranks] == [92 * 2 * 128 * 2] * 8
    reduces = [(c.count, c.bytes_per_token) for c in collectives(m) if c.op == "all-reduce"]
    # o_proj, the MLP or MoE (the shared expert summed in before the one all-reduce), the embedding
    assert reduces == [(92, 5120 * 2), (92, 5120 * 2), (1, 5120 * 2)]


def test_glm47_valid_tp_follows_the_heads():
    """QKVParallelLinear: tp divides the 96 q heads, and either divides the 8 KV heads or is a multiple of
    them (tp 16 and 32 replicate each KV head on 2 and 4 GPUs)."""
    spec = load_spec(GLM47)
    assert [tp for tp in range(1, 65) if split_error(spec, tp)[0] is None] == [1, 2, 4, 8, 16, 32]
    assert split_error(spec, 64)[0].quantity == "num_attention_heads"
    assert "num_key_value_heads=8" in str(split_error(spec, 12)[0])
    m = shard_map(spec, 16)
    k = m.tensor(f"{ATTN}k_proj.weight")
    assert [(p.rank, p.start, p.stop) for p in k.pieces][:4] == [(0, 0, 128), (1, 0, 128), (2, 128, 256),
                                                                 (3, 128, 256)]
    assert m.ranks[0].kv_cache_bytes_per_token == 92 * 2 * 128 * 2  # one replicated KV head


def test_glm47_expert_parallel_places_20_experts_a_gpu():
    d = deploy(load_spec(GLM47), Layout(8, ep=True))
    assert d.expert_placement == [list(range(20 * i, 20 * i + 20)) for i in range(8)]
    assert [g.experts for g in d.gpus] == d.expert_placement


def test_glm45_air_no_qk_norm_one_dense_layer():
    m = shard_map(AIR, 4)
    names = set(expand(m))
    assert not any("q_norm" in n for n in names) and f"{ATTN.replace('*', '0')}q_proj.bias" in names
    assert "model.layers.0.mlp.gate_proj.weight" in names
    assert "model.layers.1.mlp.gate_proj.weight" not in names
    assert "model.layers.45.mlp.experts.127.down_proj.weight" in names
    assert "model.layers.45.mlp.shared_experts.up_proj.weight" in names


def test_the_mtp_layer_is_left_to_the_draft_model():
    """skip_spec_layers: model.layers.46.* (GLM-4.5-Air's MTP layer) is loaded by the draft model alone."""
    m = shard_map(AIR, 1)
    names = set(expand(m))
    mtp = {n.replace("layers.45.", "layers.46.") for n in names if "layers.45." in n} | {
        f"model.layers.46.{s}" for s in ("eh_proj.weight", "enorm.weight", "hnorm.weight",
                                         "shared_head.norm.weight")}
    assert compare(m, names | mtp, "air")["verified"]


def test_refusals_vllm_makes():
    cfg = presets()[AIR]
    with pytest.raises(ConfigError, match="hidden_act='gelu'.*glm4_moe.py"):
        shard_map({**cfg, "hidden_act": "gelu"}, 2)
    with pytest.raises(MissingFieldError, match="head_dim"):
        shard_map({k: v for k, v in cfg.items() if k != "head_dim"}, 2)


TINY_GLM = dict(TINY, n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=48,
                first_k_dense_replace=1)


@pytest.mark.parametrize("qk_norm", [True, False])
def test_glm4_moe_names_and_shapes_what_transformers_saves(qk_norm, tmp_path):
    cfg = {**presets()[GLM47], **TINY_GLM, "use_qk_norm": qk_norm}
    written = saved("Glm4MoeForCausalLM", cfg, tmp_path)
    m = shard_map(cfg, 2, tensor_names=set(written), checkpoint_source="tiny")
    assert m.checkpoint["verified"], m.checkpoint
    assert {t.name: tuple(t.shape) for t in tensors(build_plan(m.model))} == written
    assert ("model.layers.1.self_attn.q_norm.weight" in written) is qk_norm


def test_glm4_names_and_shapes_what_transformers_saves(tmp_path):
    """GLM-4-0414: gate_up_proj fused on disk, post_self_attn_layernorm and post_mlp_layernorm a layer."""
    cfg = {**presets()[GLM4], **TINY, "pad_token_id": 0}
    written = saved("Glm4ForCausalLM", cfg, tmp_path)
    assert "model.layers.0.mlp.gate_up_proj.weight" in written
    m = shard_map(cfg, 2, tensor_names=set(written), checkpoint_source="tiny")
    assert m.checkpoint["verified"], m.checkpoint
    assert {t.name: tuple(t.shape) for t in tensors(build_plan(m.model))} == written
    gate_up = m.tensor("model.layers.*.mlp.gate_up_proj.weight")  # gate rows, then up rows, each cut in 2
    assert [(p.rank, p.start, p.stop) for p in gate_up.pieces] == [(0, 0, 48), (0, 96, 144), (1, 48, 96),
                                                                   (1, 144, 192)]


def test_glm4_9b_by_hand():
    """GLM-4-9B-0414: 32 q heads and 2 KV heads of 128, biased q/k/v, four norms a layer, 40 layers."""
    h, q, kv = 4096, 32 * 128, 2 * 128
    layer = (q + 2 * kv) * h + (q + 2 * kv) + h * q + 4 * h + 3 * 13696 * h
    m = shard_map(GLM4, 4)
    assert m.total_weight_bytes == 2 * (2 * 151552 * h + h + 40 * layer)
    # tp 4: each of the 2 KV heads on 2 GPUs, so each GPU caches one head a layer
    assert [r.kv_cache_bytes_per_token for r in m.ranks] == [40 * 2 * 128 * 2] * 4
    assert [tp for tp in range(1, 65) if split_error(load_spec(GLM4), tp)[0] is None] == [1, 2, 4, 8, 16, 32]
    with pytest.raises(ConfigError, match="hidden_act='gelu'.*glm4.py"):
        shard_map({**presets()[GLM4], "hidden_act": "gelu"}, 2)


def test_glm47_flash_by_hand():
    """GLM-4.7-Flash: DeepSeek-V2's MLA (q ranks 768, KV latent 512 + 64 rope, 20 heads of 192 + 64 and v 256)
    beside Glm4MoE's float32 router; one dense layer, 46 MoE layers of 64 experts and one shared."""
    h, heads = 2048, 20
    # fused q_a + kv_a, q_a norm, q_b, kv_a norm, kv_b, o_proj, the two layer norms
    mla = ((768 + 576) * h + 768 + heads * 256 * 768 + 512 + heads * (192 + 256) * 512 + h * heads * 256
           + 2 * h)
    params = 2 * 154880 * h + h + 47 * mla + 3 * 10240 * h + 46 * 65 * 3 * 1536 * h
    m = shard_map(FLASH, 4)
    assert m.total_weight_bytes == 2 * params + 4 * 46 * (64 * h + 64)
    # the latent (512) and the rope key (64) of every layer, whole on every GPU
    assert [r.kv_cache_bytes_per_token for r in m.ranks] == [47 * 576 * 2] * 4
    spec = load_spec(FLASH)
    assert [tp for tp in range(1, 21) if split_error(spec, tp)[0] is None] == [1, 2, 4]
    # tp 5 divides the 20 heads and the dense MLP, but not the shared expert's 1536 rows, which stay cut over
    # tp under expert parallelism too
    for layout in (Layout(5), Layout(5, ep=True)):
        assert "shared_expert_intermediate_size=1536" in str(split_error(spec, 5, layout=layout)[0])


def test_glm47_flash_refusals():
    cfg = presets()[FLASH]
    with pytest.raises(ConfigError, match="index_topk"):
        shard_map({**cfg, "index_topk": 2048}, 2)
    with pytest.raises(MissingFieldError, match="first_k_dense_replace"):
        shard_map({k: v for k, v in cfg.items() if k != "first_k_dense_replace"}, 2)


def test_glm4_moe_lite_names_and_shapes_what_transformers_saves(tmp_path):
    mla = dict(q_lora_rank=32, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=16)
    cfg = {**presets()[FLASH], **TINY_GLM, **mla, "pad_token_id": 0}
    written = saved("Glm4MoeLiteForCausalLM", cfg, tmp_path)
    assert "model.layers.0.self_attn.kv_a_proj_with_mqa.weight" in written
    m = shard_map(cfg, 2, tensor_names=set(written), checkpoint_source="tiny")
    assert m.checkpoint["verified"], m.checkpoint
    assert {t.name: tuple(t.shape) for t in tensors(build_plan(m.model))} == written

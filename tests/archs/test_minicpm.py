"""MiniCPM (vLLM 0.33 models/minicpm.py) and MiniCPM3 (models/minicpm3.py) against hand computation and, for
MiniCPM3, the tiny checkpoint transformers itself writes (transformers has no MiniCPM class)."""
import pytest
import transformers
from tests.helpers.checkpoint import written_shapes

from tpviz import shard_map
from tpviz.config.sources import load_spec
from tpviz.deploy.deployment import deploy
from tpviz.errors import ConfigError, LayoutError, MissingFieldError
from tpviz.plan import build_plan
from tpviz.plan.tensors import tensors
from tpviz.render.summary import kv_cache_total_per_token, mla_kv_sentence
from tpviz.rules import Layout
from tpviz.trace.checkpoint import expand
from tpviz.trace.validity import split_error

MINICPM_2B = "openbmb/MiniCPM-2B-sft-bf16"
TINY = dict(architectures=["MiniCPMForCausalLM"], model_type="minicpm", hidden_size=64, intermediate_size=96,
            num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2, vocab_size=512, scale_emb=12,
            scale_depth=1.4, dim_model_base=16)
TINY_MOE = dict(TINY, num_experts=4, num_experts_per_tok=2, tie_word_embeddings=False)
# MiniCPM3-4B's dims, as transformers' MiniCPM3Config (written for openbmb/MiniCPM3-4B) gives them
MINICPM3_4B = dict(architectures=["MiniCPM3ForCausalLM"], model_type="minicpm3", vocab_size=73448,
                   hidden_size=2560, intermediate_size=6400, num_hidden_layers=62, num_attention_heads=40,
                   num_key_value_heads=40, q_lora_rank=768, kv_lora_rank=256, qk_nope_head_dim=64,
                   qk_rope_head_dim=32, v_head_dim=64, max_position_embeddings=32768,
                   tie_word_embeddings=True)
TINY3 = dict(MINICPM3_4B, hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=4,
             num_hidden_layers=2, vocab_size=512, q_lora_rank=32, kv_lora_rank=16, qk_nope_head_dim=8,
             qk_rope_head_dim=8, v_head_dim=16, tie_word_embeddings=False)


def test_minicpm_2b_by_hand():
    """MiniCPM-2B: 40 layers of 36 heads of 64 (no GQA), a 5760 MLP, the 122753-row table tied to the head:
    the card's 2.4B parameters without the embedding, 2.7B with it."""
    h, v = 2304, 122753
    layer = 4 * h * h + 3 * 5760 * h + 2 * h
    params = v * h + h + 40 * layer
    m = shard_map(MINICPM_2B, 4)
    assert m.total_weight_bytes == 2 * params and round((params - v * h) / 1e9, 1) == 2.4
    assert m.model.tie_word_embeddings and "lm_head.weight" not in expand(m)
    assert [r.kv_cache_bytes_per_token for r in m.ranks] == [40 * 2 * 9 * 64 * 2] * 4  # 9 of 36 heads each
    assert any("scale_emb, scale_depth, dim_model_base" in n for n in m.model.notes)


def test_minicpm_2b_valid_tp():
    """tp must divide the 36 heads, the 5760 MLP and the vocabulary padded to 122816 (64 x 1919): 1, 2, 4."""
    spec = load_spec(MINICPM_2B)
    assert [tp for tp in range(1, 37) if split_error(spec, tp)[0] is None] == [1, 2, 4]
    assert "vocab" in str(split_error(spec, 3)[0]) and "36" in str(split_error(spec, 8)[0])


def test_minicpm_reads_as_vllm_does():
    """head_dim is hidden_size // heads whatever the config says; tie_word_embeddings defaults to true (the
    checkpoint's own config code); silu or fatrelu alone."""
    m = shard_map({**TINY, "head_dim": 128}, 2)
    assert m.tensor("model.layers.*.self_attn.q_proj.weight").shape == [64, 64]
    assert m.model.tie_word_embeddings
    assert not shard_map({**TINY, "tie_word_embeddings": False}, 2).model.tie_word_embeddings
    assert shard_map({**TINY, "hidden_act": "fatrelu"}, 2).total_weight_bytes == m.total_weight_bytes
    with pytest.raises(ConfigError, match="hidden_act='gelu'"):
        shard_map({**TINY, "hidden_act": "gelu"}, 2)
    with pytest.raises(ConfigError, match="hidden_size=66 is not divisible"):
        shard_map({**TINY, "hidden_size": 66}, 2)


def test_minicpm_moe_names_and_cuts():
    """MiniCPMMoE: experts.<e>.w1 / w3 cut by rows and w2 by columns over tp (each intermediate_size wide,
    whatever moe_intermediate_size says), the router mlp.gate whole."""
    m = shard_map({**TINY_MOE, "moe_intermediate_size": 8}, 2)
    names = set(expand(m))
    layer = {n for n in names if n.startswith("model.layers.1.")}
    assert layer == {f"model.layers.1.{n}.weight" for n in (
        "input_layernorm", "post_attention_layernorm", "mlp.gate", *(f"self_attn.{p}_proj" for p in "qkvo"),
        *(f"mlp.experts.{e}.w{i}" for e in range(4) for i in (1, 2, 3)))}
    pieces = {t.name.split(".")[-2]: [(p.rank, p.start, p.stop) for p in t.pieces] for t in m.tensors
              if ".experts." in t.name}
    assert pieces == {"w1": [(0, 0, 48), (1, 48, 96)], "w3": [(0, 0, 48), (1, 48, 96)],
                      "w2": [(0, 0, 48), (1, 48, 96)]}
    assert m.tensor("model.layers.*.mlp.experts.*.w2.weight").split_dim == 1
    h = 64
    # q, o, k, v, the norms, the router, the experts
    layer_params = 2 * h * h + 2 * 32 * h + 2 * h + 4 * h + 4 * 3 * 96 * h
    assert m.total_weight_bytes == 2 * (2 * 512 * h + h + 2 * layer_params)


def test_minicpm_moe_refusals():
    with pytest.raises(MissingFieldError, match="num_experts_per_tok"):
        shard_map({k: v for k, v in TINY_MOE.items() if k != "num_experts_per_tok"}, 2)
    quantized = {**TINY_MOE, "quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]}}
    with pytest.raises(ConfigError, match="MiniCPMMoE builds its experts without"):
        shard_map(quantized, 2)
    spec = load_spec(TINY_MOE)
    for layout in (Layout(2, dp=2), Layout(2, ep=True)):  # not FusedMoE: experts cut over tp alone
        with pytest.raises(LayoutError, match="MiniCPMMoE"):
            deploy(spec, layout)
    assert deploy(load_spec(TINY), Layout(2, dp=2)).gpus  # a dense MiniCPM runs replicas like any model


def test_minicpm3_names_and_shapes_what_transformers_saves(tmp_path):
    config = transformers.AutoConfig.for_model(**{k: v for k, v in TINY3.items() if k != "architectures"})
    written = written_shapes(transformers.MiniCPM3ForCausalLM(config), tmp_path)
    m = shard_map(TINY3, 2, tensor_names=set(written), checkpoint_source="tiny")
    assert m.checkpoint["verified"], m.checkpoint
    assert {t.name: tuple(t.shape) for t in tensors(build_plan(m.model))} == written
    assert "model.layers.0.self_attn.q_a_proj.weight" in written  # two latent tables, not one fused
    for name in ("q_a_proj", "kv_a_proj_with_mqa"):
        assert m.tensor(f"model.layers.*.self_attn.{name}.weight").split_dim is None


def test_minicpm3_4b_by_hand():
    """MiniCPM3-4B: MLA weights (q ranks 768, KV latent 256 + 32 rope, 40 heads of 64 + 32 and v 64), tied
    embeddings: the card's 4B; vLLM runs it as plain attention, caching each head's K and V (96 wide, V
    padded), so the cache splits over tp with the heads and is not the latent."""
    h, heads = 2560, 40
    attention = (768 * h + 768 + heads * 96 * 768 + 288 * h + 256 + heads * 128 * 256 + h * heads * 64)
    params = 73448 * h + h + 62 * (attention + 3 * 6400 * h + 2 * h)
    m = shard_map(MINICPM3_4B, 4)
    assert m.total_weight_bytes == 2 * params and round(params / 1e9, 2) == 4.07
    assert [r.kv_cache_bytes_per_token for r in m.ranks] == [62 * 2 * 10 * 96 * 2] * 4
    assert kv_cache_total_per_token(m) == 62 * 2 * 40 * 96 * 2
    assert mla_kv_sentence(m) is None
    assert [tp for tp in range(1, 41) if split_error(load_spec(MINICPM3_4B), tp)[0] is None] == [1, 2, 4, 8]


def test_minicpm3_refusals():
    with pytest.raises(ConfigError, match="q_lora_rank=None"):
        shard_map({**MINICPM3_4B, "q_lora_rank": None}, 2)
    with pytest.raises(ConfigError, match="hidden_act='gelu'"):
        shard_map({**MINICPM3_4B, "hidden_act": "gelu"}, 2)
    gptq = {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False, "sym": True}
    with pytest.raises(ConfigError, match="replicated attention tables"):  # MiniCPM3-4B-GPTQ-Int4's form
        shard_map({**MINICPM3_4B, "quantization_config": gptq}, 2)


def test_minicpm_embedding_on_every_stage():
    """MiniCPMModel builds embed_tokens with no first-stage guard: a middle pipeline stage holds its ten
    layers and its slice of the table (122816 padded rows over tp 2)."""
    h = 2304
    layer = (4 * h * h // 2 + 3 * 5760 * h // 2 + 2 * h) * 2
    d = deploy(load_spec(MINICPM_2B), Layout(2, pp=4))
    assert [g.weight_bytes for g in d.gpus if g.pp in (1, 2)] == [10 * layer + 122816 // 2 * h * 2] * 4
    assert any("embed_tokens and lm_head on every pipeline stage" in w for w in d.warnings)


def test_minicpm_lm_head_on_every_stage():
    """MiniCPMForCausalLM builds its lm_head with no last-stage guard either: untied, the first of two stages
    holds a slice of both tables beside its layer; tied, the head is the embedding it already holds."""
    h, rows = 64, 512 // 2
    layer = (2 * h * h + 2 * 32 * h) // 2 + 3 * 96 * h // 2 + 2 * h
    for tied, tables in ((False, 2), (True, 1)):
        gpus = deploy(load_spec({**TINY, "tie_word_embeddings": tied}), Layout(2, pp=2)).gpus
        assert [g.weight_bytes for g in gpus if g.pp == 0] == [2 * (layer + tables * rows * h)] * 2


def test_minicpm4_8b_by_hand():
    """MiniCPM4-8B's dims as a FastDeploy port of MiniCPM4.1-8B lists its config.json (32 layers, 4096 hidden,
    32 / 2 heads of 128, a 16384 MLP, 73448 vocab, untied): the card's 8B; tp 4 copies each KV head twice."""
    cfg = dict(TINY, hidden_size=4096, intermediate_size=16384, num_attention_heads=32, num_key_value_heads=2,
               num_hidden_layers=32, vocab_size=73448, tie_word_embeddings=False,
               max_position_embeddings=65536)
    h, kv = 4096, 2 * 128
    params = 2 * 73448 * h + h + 32 * (2 * h * h + 2 * kv * h + 3 * 16384 * h + 2 * h)
    m = shard_map(cfg, 4)
    assert m.total_weight_bytes == 2 * params and round(params / 1e9, 1) == 8.2
    assert [r.kv_cache_bytes_per_token for r in m.ranks] == [32 * 2 * 128 * 2] * 4

"""The architectures vLLM 0.33 serves through its Transformers backend (archs/backend.py), each against the
tiny checkpoint transformers itself writes (names and shapes at tp 1) and against tp 2 slices computed by hand
from how the backend cuts them: q/k/v fused by heads, gate/up merged, o/down by row, an ungated up_proj by
its tp plan's colwise, experts in one FusedMoE over the intermediate size, norms and routers whole."""
import pytest
import transformers
from tests.helpers.checkpoint import written_shapes

from tpviz import shard_map
from tpviz.config.sources import load_spec
from tpviz.errors import ConfigError
from tpviz.plan import build_plan
from tpviz.plan.tensors import tensors
from tpviz.deploy.traffic import comm_per_token
from tpviz.rules import Layout
from tpviz.trace.collectives import collectives
from tpviz.trace.validity import split_error

# 4 heads and 2 KV heads of 16, an MLP of 96, 512 tokens: at tp 2 each GPU takes 2 heads, 1 KV head, 48 rows
TINY = dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
            intermediate_size=96, vocab_size=512, pad_token_id=None)
MOE = dict(num_experts=4, num_experts_per_tok=2)
CASES = {
    "SeedOssForCausalLM": dict(model_type="seed_oss", attention_bias=True, attention_out_bias=True),
    "ArceeForCausalLM": dict(model_type="arcee"),
    "HunYuanDenseV1ForCausalLM": dict(model_type="hunyuan_v1_dense", tie_word_embeddings=True),
    "VaultGemmaForCausalLM": dict(model_type="vaultgemma", sliding_window=32),
    "CwmForCausalLM": dict(model_type="cwm", sliding_window=32),
    "Jais2ForCausalLM": dict(model_type="jais2"),
    "HunYuanMoEV1ForCausalLM": dict(model_type="hunyuan_v1_moe", num_experts=4, moe_topk=2),
    "FlexOlmoForCausalLM": dict(model_type="flex_olmo", eos_token_id=None, **MOE),
    "OlmoForCausalLM": dict(model_type="olmo", clip_qkv=8.0),
}
A, F = "model.layers.*.self_attn.", "model.layers.*.mlp."


def tiny(hf_class: str) -> dict:
    return {**TINY, **CASES[hf_class], "architectures": [hf_class]}


def saved(hf_class: str, folder) -> dict[str, tuple]:
    """The tensor names and shapes a tiny random model of hf_class saves (transformers' own writer)."""
    cfg = tiny(hf_class)
    config = transformers.AutoConfig.for_model(**{k: v for k, v in cfg.items() if k != "architectures"})
    return written_shapes(getattr(transformers, hf_class)(config), folder)


def rows(m, name: str, rank: int) -> list[tuple[int, int]]:
    """The (start, stop) source ranges one GPU holds of a tensor, along its split dim."""
    return [(p.start, p.stop) for p in m.tensor(name).rank_pieces(rank)]


@pytest.mark.parametrize("hf_class", sorted(CASES))
def test_the_map_names_and_shapes_what_transformers_saves(hf_class, tmp_path):
    written = saved(hf_class, tmp_path)
    m = shard_map(tiny(hf_class), 1, tensor_names=set(written), checkpoint_source="tiny")
    assert m.checkpoint["verified"], m.checkpoint
    assert {t.name: tuple(t.shape) for t in tensors(build_plan(m.model))} == written
    assert any("Transformers backend" in n for n in m.model.notes)


@pytest.mark.parametrize("hf_class", sorted(CASES))
def test_tp2_cuts_heads_and_mlp_rows_as_the_backend_does(hf_class):
    """q: 2 heads x 16 rows a GPU; k/v: its one KV head; o_proj / down_proj: the matching input columns;
    gate/up (or relu2's lone up_proj, or each expert's): 48 of the 96 rows; norms and routers whole."""
    m = shard_map(tiny(hf_class), 2)
    for r in range(2):
        assert rows(m, A + "q_proj.weight", r) == [(32 * r, 32 * r + 32)]
        assert rows(m, A + "k_proj.weight", r) == rows(m, A + "v_proj.weight", r) == [(16 * r, 16 * r + 16)]
        assert rows(m, A + "o_proj.weight", r) == [(32 * r, 32 * r + 32)]
        mlp = F + ("experts.*." if m.model.is_moe else "")
        relu2 = hf_class in ("ArceeForCausalLM", "Jais2ForCausalLM")  # one up_proj, no gate
        ups = ("up_proj",) if relu2 else ("gate_proj", "up_proj")
        for up in ups:
            assert rows(m, f"{mlp}{up}.weight", r) == [(48 * r, 48 * r + 48)]
        assert rows(m, f"{mlp}down_proj.weight", r) == [(48 * r, 48 * r + 48)]
        assert rows(m, "model.embed_tokens.weight", r) == [(256 * r, 256 * r + 256)]
    down = F + ("experts.*." if m.model.is_moe else "") + "down_proj.weight"
    assert m.tensor(A + "o_proj.weight").split_dim == m.tensor(down).split_dim == 1
    whole = [t.name for t in m.tensors if t.split_dim is None]
    kept = ("norm.weight", "norm.bias", "layernorm.weight", "layernorm.bias", "gate.weight", "gate.wg.weight",
            "o_proj.bias", "down_proj.bias")  # norms, routers, and the biases added after a reduce
    assert all(name.endswith(kept) for name in whole), whole


def test_seed_oss_biases_follow_attention_bias_and_attention_out_bias():
    """transformers' SeedOssAttention: attention_bias on q/k/v (on by the class's default), attention_out_bias
    on o_proj (off by default)."""
    names = lambda cfg: {t.name for t in shard_map(cfg, 1).tensors if t.name.endswith("bias")}
    base = {k: v for k, v in tiny("SeedOssForCausalLM").items() if not k.startswith("attention_")}
    assert names(base) == {A + f"{p}_proj.bias" for p in "qkv"}
    assert names({**base, "attention_out_bias": True}) == {A + f"{p}_proj.bias" for p in "qkvo"}
    assert names({**base, "attention_bias": False}) == set()
    with pytest.raises(ConfigError, match="attention_out_bias"):
        shard_map({**base, "attention_bias": False, "attention_out_bias": True}, 1)


def test_windows_follow_layer_types():
    """VaultGemma's class slides every other layer, CWM's three in four (their default layer_types); the
    backend gives each sliding layer sliding_window."""
    vault = shard_map({**tiny("VaultGemmaForCausalLM"), "num_hidden_layers": 4}, 1)
    assert [layer.mixer.window for layer in vault.model.layers] == [32, 0, 32, 0]
    cwm = shard_map({**tiny("CwmForCausalLM"), "num_hidden_layers": 8}, 1)
    assert [layer.mixer.window for layer in cwm.model.layers] == [0, 32, 32, 32] * 2


def test_hunyuan_refuses_what_its_transformers_classes_cannot_build():
    for cls in ("HunYuanDenseV1ForCausalLM", "HunYuanMoEV1ForCausalLM"):
        with pytest.raises(ConfigError, match="use_cla"):
            shard_map({**tiny(cls), "use_cla": True}, 1)
        with pytest.raises(ConfigError, match="hidden_act"):
            shard_map({**tiny(cls), "hidden_act": "relu"}, 1)
        with pytest.raises(ConfigError, match="use_qk_norm"):
            shard_map({**tiny(cls), "use_qk_norm": False}, 1)
    moe = tiny("HunYuanMoEV1ForCausalLM")
    with pytest.raises(ConfigError, match="moe_intermediate_size"):
        shard_map({**moe, "moe_intermediate_size": [48, 48]}, 1)
    with pytest.raises(ConfigError, match="moe_topk differs"):
        shard_map({**moe, "moe_topk": [2, 1]}, 1)
    with pytest.raises(ConfigError, match="shared MLP"):
        shard_map({**moe, "num_shared_expert": [2, 2]}, 1)
    same = shard_map({**moe, "moe_topk": [2, 2], "moe_intermediate_size": [96, 96]}, 1)
    assert same.model.layers[0].ffn.top_k == 2 and same.model.layers[0].ffn.size == 96


def test_hunyuan_moe_reduces_experts_and_shared_mlp_once():
    """The shared MLP runs inside FusedMoE (its down_proj's reduce left to the experts'): one all-reduce a
    layer after the MoE block, one after o_proj."""
    m = shard_map(tiny("HunYuanMoEV1ForCausalLM"), 2)
    reduces = {c.where.split(" (")[0]: c.count for c in collectives(m) if c.op == "all-reduce"}
    assert reduces["after o_proj / out_proj"] == 2 and reduces["after down_proj"] == 2
    assert m.model.layers[0].ffn.shared == 96


def test_flex_olmo_norms_span_every_head():
    """FlexOlmo: OLMo-2's post-norms and q/k norms over the whole projection (all-gathered under tp)."""
    spec = load_spec(tiny("FlexOlmoForCausalLM"))
    assert spec.qk_norm and spec.qk_norm_full
    m = shard_map(spec, 2)
    assert m.tensor(A + "q_norm.weight").shape == [64] and m.tensor(A + "k_norm.weight").shape == [32]


def test_seed_oss_36b_stores_what_its_card_counts():
    """Seed-OSS-36B-Instruct: 64 layers of 80 q heads and 8 KV heads of 128 (q/k/v biased, o_proj not), a
    27648 MLP and an untied 155136 vocabulary: 36,151,104,512 values, the card's 36B; at tp 8 each GPU
    holds 10 q heads and one KV head."""
    layer = (10240 * 5120 + 10240 + 2 * (1024 * 5120 + 1024) + 5120 * 10240 + 3 * 27648 * 5120 + 2 * 5120)
    m = shard_map("ByteDance-Seed/Seed-OSS-36B-Instruct", 1)
    assert m.total_weight_bytes == 2 * (64 * layer + 2 * 155136 * 5120 + 5120) == 2 * 36_151_104_512
    m8 = shard_map("ByteDance-Seed/Seed-OSS-36B-Instruct", 8)
    assert [r.kv_heads for r in m8.ranks] == [[h] for h in range(8)]
    assert rows(m8, A + "q_proj.bias", 3) == [(3 * 1280, 4 * 1280)]


# Hunyuan-A13B-Instruct's architecture keys as two code copies give them (no complete config.json was found,
# so it is no preset): 64 experts of 3072, top 8, one shared MLP, tied 128167 vocabulary
A13B = dict(architectures=["HunYuanMoEV1ForCausalLM"], model_type="hunyuan_v1_moe", attention_bias=False,
            head_dim=128, hidden_size=4096, intermediate_size=3072, moe_intermediate_size=[3072] * 32,
            moe_topk=[8] * 32, num_attention_heads=32, num_experts=64, num_hidden_layers=32,
            num_key_value_heads=8, num_shared_expert=[1] * 32, rms_norm_eps=1e-05, tie_word_embeddings=True,
            use_cla=False, use_mixed_mlp_moe=True, use_qk_norm=True, vocab_size=128167)


def test_hunyuan_a13b_stores_its_80b():
    """Per layer: attention 2 x 4096^2 + 2 x 1024 x 4096, q/k norms of 128, 64 experts and the shared MLP of
    3 x 3072 x 4096 each, a 64 x 4096 router, two norms: 80,393,183,232 values (the published 80B, 13B
    active); FusedMoE cuts every expert's 3072 rows over tp, or EP places whole experts."""
    layer = (2 * 4096 * 4096 + 2 * 1024 * 4096 + 2 * 128 + 65 * 3 * 3072 * 4096 + 64 * 4096 + 2 * 4096)
    m = shard_map(A13B, 1)
    assert m.total_weight_bytes == 2 * (32 * layer + 128167 * 4096 + 4096) == 2 * 80_393_183_232
    m4 = shard_map(A13B, 4)
    assert rows(m4, F + "experts.*.up_proj.weight", 2) == [(1536, 2304)]
    assert rows(m4, F + "gate.wg.weight", 2) == [(0, 64)]


def test_olmo_1b_holds_no_norm_weights_and_stores_its_card_count():
    """OLMo-1B-hf: LayerNorms without weights (transformers' OlmoLayerNorm), so its 16 layers hold only the
    projections: 16 x (4 x 2048^2 + 3 x 2048 x 8192) and a tied 50304 x 2048 table, 1,176,764,416 values
    (the card's 1.18B); clip_qkv changes no weight."""
    m = shard_map("allenai/OLMo-1B-hf", 1)
    assert not any("norm" in t.name for t in m.tensors)
    assert m.total_weight_bytes == 2 * (16 * (4 * 2048 ** 2 + 3 * 2048 * 8192) + 50304 * 2048)
    assert m.total_weight_bytes == 2 * 1_176_764_416
    assert shard_map({**load_spec("allenai/OLMo-1B-hf").config, "clip_qkv": 8.0}, 1).total_weight_bytes == (
        m.total_weight_bytes)


GLM = {**TINY, "model_type": "glm", "architectures": ["GlmForCausalLM"], "attention_bias": True}


def test_glm_names_and_shapes_what_transformers_saves(tmp_path):
    """GLM-4-hf: biased q/k/v, o_proj without a bias, one stored gate_up_proj [2 x 96, 64]."""
    config = transformers.AutoConfig.for_model(**{k: v for k, v in GLM.items() if k != "architectures"})
    written = written_shapes(transformers.GlmForCausalLM(config), tmp_path)
    assert written["model.layers.0.mlp.gate_up_proj.weight"] == (192, 64)
    m = shard_map(GLM, 1, tensor_names=set(written), checkpoint_source="tiny")
    assert m.checkpoint["verified"], m.checkpoint
    assert {t.name: tuple(t.shape) for t in tensors(build_plan(m.model))} == written


def test_glm_gate_up_is_one_column_block_a_gpu_then_gathered():
    """Its tp plan's colwise_gather_output: at tp 2 GPU 0 holds all 96 gate rows and GPU 1 all 96 up rows
    (not half of each, as a MergedColumnParallelLinear would), then every layer all-gathers the 192 values
    a token before down_proj (rowwise_split_input: 48 input columns a GPU, then the usual all-reduce)."""
    m = shard_map(GLM, 2)
    assert [rows(m, F + "gate_up_proj.weight", r) for r in range(2)] == [[(0, 96)], [(96, 192)]]
    assert m.tensor(F + "gate_up_proj.weight").layer_class == "ColumnParallelLinear"
    assert [rows(m, F + "down_proj.weight", r) for r in range(2)] == [[(0, 48)], [(48, 96)]]
    assert [rows(m, A + "k_proj.bias", r) for r in range(2)] == [[(0, 16)], [(16, 32)]]
    assert not any(t.name.endswith("o_proj.bias") for t in m.tensors)
    gathers = [(c.count, c.bytes_per_token, c.sent_per_rank) for c in collectives(m)
               if c.where.startswith("after gate_up_proj")]
    assert gathers == [(2, 192 * 2, 96 * 2)]  # 2 bytes a value: the tiny config names no dtype
    reduces = [(c.count, c.where.split(" ")[1]) for c in collectives(m) if c.op == "all-reduce"]
    assert reduces == [(2, "o_proj"), (2, "down_proj"), (1, "embed_tokens")]
    assert "colwise_gather_output" in m.model.arch.note


def test_glm_4_9b_chat_hf_by_hand():
    """glm-4-9b-chat-hf: 40 layers of q/k/v (32 and 2 heads of 128, biased), o_proj, gate_up 2 x 13696 and
    down, two norms; an untied 151552 vocabulary: 9,399,951,360 values, the published 9.4B. At tp 4 each GPU
    takes a quarter of the gate | up rows (GPU 1 the end of gate, GPU 2 the start of up) and sends 3/4 of the
    27392 gathered values (bf16) a layer."""
    layer = (4608 * 4096 + 4608) + 4096 * 4096 + 3 * 13696 * 4096 + 2 * 4096
    m = shard_map("THUDM/glm-4-9b-chat-hf", 4)
    assert m.total_weight_bytes == 2 * (40 * layer + 2 * 151552 * 4096 + 4096) == 2 * 9_399_951_360
    assert [rows(m, F + "gate_up_proj.weight", r) for r in range(4)] == [
        [(0, 6848)], [(6848, 13696)], [(13696, 20544)], [(20544, 27392)]]
    gather = next(c for c in collectives(m) if c.where.startswith("after gate_up_proj"))
    assert (gather.count, gather.bytes_per_token, gather.sent_per_rank) == (40, 2 * 27392, 3 / 4 * 2 * 27392)
    assert [tp for tp in range(1, 65) if split_error(load_spec("THUDM/glm-4-9b-chat-hf"), tp)[0] is None] == [
        1, 2, 4, 8, 16, 32]
    # the speed bound's TP traffic a token: 80 ring all-reduces of 4096 bf16 values and the 40 gathers
    sent = comm_per_token(load_spec("THUDM/glm-4-9b-chat-hf"), Layout(4))["tp_all_reduce"]
    assert sent == pytest.approx(80 * 2 * 3 / 4 * 4096 * 2 + 40 * 3 / 4 * 2 * 27392)

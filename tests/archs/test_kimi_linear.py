"""Kimi-Linear (vLLM 0.33 vllm.models.kimi_k3, layers/mamba/gdn/kimi_gdn_linear_attn.py): Kimi Delta Attention
and MLA layers with KimiMoE, against every tensor of the published checkpoint (name, shape and dtype, as a
model-information report lists them: docs/presets.md), a tiny checkpoint transformers writes, and layouts,
bytes, caches and states computed by hand from vLLM's weight_loaders."""
import pytest
import transformers
from tests.helpers.checkpoint import written_shapes
from tests.helpers.errors import one_line

from tpviz import shard_map
from tpviz.config.sources import load_spec, presets
from tpviz.deploy.deployment import deploy
from tpviz.errors import ConfigError, LayoutError
from tpviz.plan import build_plan
from tpviz.plan.tensors import tensors
from tpviz.rules import Layout
from tpviz.trace.checkpoint import compare
from tpviz.trace.collectives import collectives
from tpviz.trace.validity import split_error

KIMI = "moonshotai/Kimi-Linear-48B-A3B-Instruct"
BYTES = {"bf16": 2, "f32": 4}
KDA = [i for i in range(27) if i not in (3, 7, 11, 15, 19, 23, 26)]  # kda_layers 1..26 but 4, 8, ..., 27
MLA, MOE = [3, 7, 11, 15, 19, 23, 26], range(1, 27)
L = "model.layers.*."
# the report's weight list: (name, layers, experts, shape, dtype); 20,493 tensors, 49,122,681,728 values
ROWS = [("lm_head.weight", None, None, (163840, 2304), "bf16"),
        ("model.embed_tokens.weight", None, None, (163840, 2304), "bf16"),
        ("model.norm.weight", None, None, (2304,), "bf16"),
        *((f"{L}self_attn.{n}", KDA, None, s, dt) for n, s, dt in (
            ("A_log", (1, 1, 32, 1), "f32"), ("b_proj.weight", (32, 2304), "bf16"),
            ("dt_bias", (4096,), "f32"),
            ("f_a_proj.weight", (128, 2304), "bf16"), ("f_b_proj.weight", (4096, 128), "bf16"),
            ("g_a_proj.weight", (128, 2304), "bf16"), ("g_b_proj.weight", (4096, 128), "bf16"),
            ("k_conv1d.weight", (4096, 1, 4), "bf16"), ("k_proj.weight", (4096, 2304), "bf16"),
            ("o_norm.weight", (128,), "bf16"), ("q_conv1d.weight", (4096, 1, 4), "bf16"),
            ("q_proj.weight", (4096, 2304), "bf16"), ("v_conv1d.weight", (4096, 1, 4), "bf16"),
            ("v_proj.weight", (4096, 2304), "bf16"))),
        *((f"{L}{n}.weight", range(27), None, s, "bf16") for n, s in (
            ("input_layernorm", (2304,)), ("post_attention_layernorm", (2304,)),
            ("self_attn.o_proj", (2304, 4096)))),
        *((f"{L}mlp.{n}.weight", [0], None, s, "bf16") for n, s in (
            ("down_proj", (2304, 9216)), ("gate_proj", (9216, 2304)), ("up_proj", (9216, 2304)))),
        *((f"{L}block_sparse_moe.experts.*.{n}.weight", MOE, range(256), s, "bf16") for n, s in (
            ("w1", (1024, 2304)), ("w2", (2304, 1024)), ("w3", (1024, 2304)))),
        (f"{L}block_sparse_moe.gate.e_score_correction_bias", MOE, None, (256,), "bf16"),
        (f"{L}block_sparse_moe.gate.weight", MOE, None, (256, 2304), "bf16"),
        *((f"{L}block_sparse_moe.shared_experts.{n}.weight", MOE, None, s, "bf16") for n, s in (
            ("down_proj", (2304, 1024)), ("gate_proj", (1024, 2304)), ("up_proj", (1024, 2304)))),
        *((f"{L}self_attn.{n}.weight", MLA, None, s, "bf16") for n, s in (
            ("kv_a_layernorm", (512,)), ("kv_a_proj_with_mqa", (576, 2304)), ("kv_b_proj", (8192, 512)),
            ("q_proj", (6144, 2304))))]


def checkpoint() -> dict[str, tuple[tuple, str]]:
    """Every tensor of the report's list: its shape and dtype."""
    out = {}
    for name, layers, experts, shape, dtype in ROWS:
        for i in layers if layers is not None else [None]:
            one = name if i is None else name.replace("*", str(i), 1)
            for e in experts if experts is not None else [None]:
                out[one if e is None else one.replace("*", str(e), 1)] = (shape, dtype)
    return out


def numel(shape: tuple) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


@pytest.fixture(scope="module")
def stored():
    return checkpoint()


@pytest.fixture(scope="module")
def spec():
    return load_spec(KIMI)


def test_the_list_is_the_reports(stored):
    """20,493 tensors, 49,122,681,728 values and 91.50 GiB, as the report counts them."""
    assert len(stored) == 20_493
    assert sum(numel(s) for s, _ in stored.values()) == 49_122_681_728
    disk = sum(numel(s) * BYTES[dt] for s, dt in stored.values())
    assert round(disk / 2 ** 30, 2) == 91.50


def test_every_tensor_of_the_release_by_name_shape_and_bytes(spec, stored):
    """Name for name and shape for shape (A_log stored [1, 1, heads, 1]); the bytes differ only where vLLM
    holds a bf16-stored tensor in float32: the 60 KDA convolutions and the 26 routers' correction biases."""
    assert {t.name: t.shape for t in tensors(build_plan(spec))} == {n: s for n, (s, _) in stored.items()}
    sizes = {n: numel(s) * BYTES[dt] for n, (s, dt) in stored.items()}
    check = compare(shard_map(spec, 1), set(stored), "report", sizes)
    assert check["verified"] and check["matched"] == 20_493
    assert check["bytes"]["count"] == 20 * 3 + 26
    assert all(("_conv1d." in d or "e_score_correction_bias" in d) for d in check["bytes"]["differ"])


def test_bytes_by_hand(spec, stored):
    """What vLLM holds: the release's values in bf16, A_log and dt_bias in float32 as stored, and conv1d and
    the correction bias upcast to float32."""
    values = 49_122_681_728
    f32 = 20 * (32 + 4096 + 3 * 4096 * 4) + 26 * 256
    assert shard_map(spec, 1).total_weight_bytes == 2 * values + 2 * f32 == 98_247_507_968


def test_each_ranks_slices_at_tp2_follow_vllms_loaders(spec):
    """in_proj_qkvgfab: q, k, v (2048 rows each), b (16), then f_a_proj's 128 rows whole on both GPUs
    (_KimiGDNMergedColumnParallelLinear loads it as rank 0); conv1d: each GPU its half of q, k and v conv
    (_make_fused_conv1d_weight_loader); A_log 16 heads, dt_bias 2048; MLA q_proj and kv_b_proj by heads."""
    m = shard_map(spec, 2)
    cut = {t.name.removeprefix(f"{L}self_attn."): [(p.rank, p.start, p.stop, p.param_start) for p in t.pieces]
           for t in m.tensors if t.name.startswith(f"{L}self_attn.") and 0 in (t.layers or [])}
    assert cut["q_proj.weight"] == [(0, 0, 2048, 0), (1, 2048, 4096, 0)]
    assert cut["v_proj.weight"] == [(0, 0, 2048, 4096), (1, 2048, 4096, 4096)]
    assert cut["b_proj.weight"] == [(0, 0, 16, 6144), (1, 16, 32, 6144)]
    assert cut["f_a_proj.weight"] == [(0, 0, 128, 6160), (1, 0, 128, 6160)]
    assert cut["k_conv1d.weight"] == [(0, 0, 2048, 2048), (1, 2048, 4096, 2048)]
    assert cut["A_log"] == [(0, 0, 16, 0), (1, 16, 32, 0)]
    assert cut["g_a_proj.weight"] == cut["o_norm.weight"][:0] + [(0, 0, 128, 0), (1, 0, 128, 0)]
    assert cut["o_proj.weight"] == [(0, 0, 2048, 0), (1, 2048, 4096, 0)]
    local = {p.name.removeprefix(f"{L}"): p.local_shapes[0] for p in m.params}
    assert local["self_attn.in_proj_qkvgfab.weight"] == [6288, 2304]
    assert local["self_attn.conv1d.weight"] == [6144, 1, 4]
    assert local["self_attn.dt_bias"] == [2048]
    q_mla = next(p for p in m.params if p.name == f"{L}self_attn.q_proj.weight")
    assert q_mla.layers == MLA and q_mla.local_shapes == [[3072, 2304]] * 2  # 16 heads of 192
    assert local["block_sparse_moe.experts.*.gate_up_proj.weight"] == [1024, 2304]


def test_kimimoe_pads_the_experts_past_tp4(spec):
    """1024 / tp rows of each expert, padded to 256 when fewer (tp 8: 128 rows then 128 of zeros in w1 and in
    w3, and in w2's columns): every GPU holds twice the experts' share; with expert parallelism each expert is
    whole and unpadded."""
    four, eight = shard_map(spec, 4), shard_map(spec, 8)
    experts = {p.name.rsplit(".", 2)[-2]: p for p in eight.params if "experts.*" in p.name}
    gate_up = experts["gate_up_proj"]
    assert gate_up.local_shapes[0] == [512, 2304] and gate_up.padding == [256] * 8
    assert experts["w2"].local_shapes[0] == [2304, 256] and experts["w2"].padding == [128] * 8
    assert all(p.padding == [0] * 4 for p in four.params if "experts.*" in p.name)
    for m in (four, eight):  # 256 rows of w1, w3 and w2 a GPU at tp 4 (no padding) and at tp 8 (padded)
        assert m.ranks[0].weight_bytes_by_family["experts"] == 26 * 256 * 3 * 256 * 2304 * 2
    gpus = deploy(spec, Layout(8, ep=True)).gpus
    assert [len(g.experts) for g in gpus] == [32] * 8
    assert gpus[0].weight_bytes < eight.ranks[0].weight_bytes


def test_caches_and_states_by_hand(spec):
    """MLA caches the 512 + 64 latent in each of its 7 layers; each of the 20 KDA layers keeps a conv state
    [3 x 4096 / tp, 3] in bf16 and a recurrent state [32 / tp, 128, 128] in float32 (kda_state_dtype)."""
    for tp in (1, 4):
        rank = shard_map(spec, tp).ranks[0]
        assert rank.kv_cache_bytes_per_token == 7 * 576 * 2
        assert rank.state_bytes_per_sequence == 20 * (3 * 4096 // tp * 3 * 2 + 32 // tp * 128 * 128 * 4)


def test_valid_tp_and_collectives(spec):
    """32 MLA heads and 32 KDA heads: tp 1, 2, 4, 8, 16, 32; one all-reduce after every mixer and every
    MLP."""
    assert [tp for tp in range(1, 65) if split_error(spec, tp)[0] is None] == [1, 2, 4, 8, 16, 32]
    other = load_spec({**presets()[KIMI], "linear_attn_config": {**presets()[KIMI]["linear_attn_config"],
                                                                   "num_heads": 24}})
    error = split_error(other, 16)[0]
    assert error.quantity == "linear_attn_config.num_heads" and one_line(error)
    reduces = [(c.count, c.bytes_per_token) for c in collectives(shard_map(spec, 4)) if c.op == "all-reduce"]
    assert reduces == [(27, 2304 * 2), (27, 2304 * 2), (1, 2304 * 2)]


def test_vllms_own_config_class_is_read_not_transformers(spec):
    """vLLM 0.33 reads kimi_linear with its KimiLinearConfig: no num_shared_experts is none (transformers'
    class says 1), no num_experts is a dense model (transformers' says 256)."""
    cfg = presets()[KIMI]
    no_shared = load_spec({k: v for k, v in cfg.items() if k != "num_shared_experts"})
    assert no_shared.shared_expert_intermediate_size == 0 and spec.shared_expert_intermediate_size == 1024
    dense = load_spec({k: v for k, v in cfg.items() if k not in ("num_experts", "num_experts_per_token")})
    assert not dense.is_moe and {layer.ffn.kind for layer in dense.layers} == {"dense"}


@pytest.mark.parametrize("change, words", [
    ({"linear_attn_config": {"kda_layers": [1], "full_attn_layers": [2], "head_dim": 128, "num_heads": 32,
                             "short_conv_kernel_size": 4, "use_full_rank_gate": True}}, "use_full_rank_gate"),
    ({"attn_res_block_size": 6}, "attention residuals"), ({"routed_expert_hidden_size": 1024}, "latent MoE"),
    ({"mla_use_output_gate": True}, "output gate"), ({"mla_use_nope": False}, "NoPE"),
    ({"hidden_act": "gelu"}, "silu or situ"),
    ({"linear_attn_config": {"kda_layers": [1]}}, "full_attn_layers"),
    ({"quantization_config": {"quant_method": "compressed-tensors"}}, "quantized")])
def test_what_is_not_modelled_is_refused_in_one_line(change, words):
    with pytest.raises(ConfigError, match=words) as e:
        load_spec({**presets()[KIMI], **change})
    assert one_line(e.value)


def test_layouts_vllm_runs_otherwise_are_refused(spec):
    """Expert parallelism with tp > 1 and dp > 1 turns on Kimi's sequence parallelism (dense MLP and shared
    experts whole); dp without EP cuts padded experts over tp x dp: both refused, named; the rest deploys."""
    for layout, words in ((Layout(2, dp=2, ep=True), "sequence-parallel"), (Layout(8, dp=2), "pads")):
        with pytest.raises(LayoutError, match=words) as e:
            deploy(spec, layout)
        assert one_line(e.value)
    assert deploy(spec, Layout(2, dp=2)).gpus and deploy(spec, Layout(1, dp=4, ep=True)).gpus


def test_names_and_shapes_what_transformers_saves(tmp_path):
    """A tiny KimiLinearForCausalLM (three KDA layers, one MLA, a dense first layer) as transformers writes
    it: the map names exactly its tensors, with their shapes (the dense layer's MLP under the release's
    name)."""
    cfg = dict(model_type="kimi_linear", architectures=["KimiLinearForCausalLM"], vocab_size=64,
               pad_token_id=0, bos_token_id=1, eos_token_id=2, hidden_size=32, intermediate_size=48,
               moe_intermediate_size=16,
               num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=16,
               q_lora_rank=None, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=8, num_experts=4,
               num_experts_per_token=2, num_shared_experts=1, first_k_dense_replace=1, mla_use_nope=True,
               linear_attn_config=dict(head_dim=8, num_heads=4, short_conv_kernel_size=4,
                                       kda_layers=[1, 2, 3], full_attn_layers=[4]))
    config = transformers.AutoConfig.for_model(**{k: v for k, v in cfg.items() if k != "architectures"})
    written = written_shapes(transformers.KimiLinearForCausalLM(config), tmp_path)
    # transformers 5's writer renames every layer's mlp. to block_sparse_moe., the dense layer's too; the
    # release stores it as mlp. (the report's list above), which is what vLLM's load_weights finds
    dense = {f"model.layers.0.mlp.{n}_proj.weight" for n in ("gate", "up", "down")}
    written = {n.replace("block_sparse_moe.", "mlp.") if n.replace("block_sparse_moe.", "mlp.") in dense
               else n: s for n, s in written.items()}
    spec = load_spec(cfg)
    assert {t.name: tuple(t.shape) for t in tensors(build_plan(spec))} == written
    assert shard_map(spec, 2, tensor_names=set(written), checkpoint_source="tiny").checkpoint["verified"]

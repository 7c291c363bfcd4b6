"""Qwen2-MoE in the live model: routed experts (softmax top-k), the shared expert scaled by
sigmoid(shared_expert_gate(x)) and summed with them before the block's one all_reduce, qkv biases, dense
mlp_only_layers; transformers parity at tp=1, each part mattering, TP parity, random weights, per-rank
reads."""
import pytest
import torch

from tpviz.live import LiveForCausalLM, load_weights, resolve_model, verify
from tpviz.live.model.moe import SparseMoeBlock
from tpviz.live.load.random_weights import checkpoint_shapes
from tpviz.config.normalize import normalize
from tests.live.checks import random_round_trip, saved_shapes, tp1_logits, tp1_matches

IDS = torch.randint(0, 999, (2, 12), generator=torch.Generator().manual_seed(7))
# 4 experts top-2 of 48, a shared expert of 80, qkv biases; layer 1 is a dense mlp_only layer (intermediate
# 96)
CONFIG = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
              intermediate_size=96, vocab_size=999,
              num_hidden_layers=3, rms_norm_eps=1e-6, rope_theta=1e6, num_experts=4, num_experts_per_tok=2,
              moe_intermediate_size=48, shared_expert_intermediate_size=80, mlp_only_layers=[1],
              norm_topk_prob=False, pad_token_id=None, bos_token_id=None, eos_token_id=None)


def make_qwen2_moe(folder, seed: int = 0, **overrides):
    """Save a tiny transformers Qwen2-MoE: norms around 1, biases != 0, weights N(0, 0.05), and a
    shared-expert gate large enough that sigmoid(gate(x)) is far from 1/2."""
    import transformers
    config = transformers.Qwen2MoeConfig(**{**CONFIG, **overrides})
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager").float().eval()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen)
            p.copy_(1 + 0.1 * noise if "norm" in name else noise * (0.1 if name.endswith("bias") else
                                                                    0.3
                                                                    if "shared_expert_gate" in name
                                                                    else 0.05))
    model.save_pretrained(folder)
    return model


@pytest.fixture(scope="module")
def tiny_q2(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny-qwen2-moe") / "qwen2_moe"
    return folder, make_qwen2_moe(folder, seed=40)






def test_tp1_matches_transformers_fp32(tiny_q2):
    folder, hf_model = tiny_q2
    with torch.no_grad():
        prep, report = tp1_matches(folder, hf_model(IDS).logits, IDS)
    # random weights write exactly this layout
    assert checkpoint_shapes(prep.source.cfg) == saved_shapes(folder)
    shapes = report["param_shapes"]
    assert prep.source.cfg.spec.moe_layers == [0, 2]  # mlp_only_layers=[1] keeps a dense MLP there
    assert shapes["model.layers.1.mlp.gate_up_proj.weight"] == [192, 64]
    assert shapes["model.layers.0.mlp.shared_expert.gate_up_proj.weight"] == [160, 64]
    assert shapes["model.layers.0.mlp.shared_expert_gate.weight"] == [1, 64]
    assert shapes["model.layers.0.self_attn.qkv_proj.bias"] == [128]


def test_decoder_sparse_step_and_mlp_only_layers_pick_the_moe_layers():
    raw = {"model_type": "qwen2_moe", **CONFIG, "num_hidden_layers": 6, "decoder_sparse_step": 2,
           "mlp_only_layers": [3]}
    # transformers: (i + 1) % step == 0 and i not in mlp_only_layers
    assert normalize(raw).moe_layers == [1, 5]


def _edit(part: str):
    def edit(model):
        for m in model.modules():
            if isinstance(m, SparseMoeBlock):
                if part == "gate":  # sigmoid(0) = 1/2 for every token instead of the learned gate
                    m.shared_expert_gate.weight.zero_()
                else:
                    m.shared_expert.down_proj.weight.zero_()
    return edit


@pytest.mark.parametrize("part", ["gate", "shared"])
def test_the_shared_expert_and_its_gate_matter(tiny_q2, part):
    folder, _ = tiny_q2
    assert (tp1_logits(folder, IDS, edit=_edit(part)) - tp1_logits(folder, IDS)).abs().max() > 1e-3


def test_random_weights_round_trip_through_transformers(tiny_q2):
    folder, _ = tiny_q2
    # a config alone: seeded random weights
    source, _ = random_round_trip(folder / "config.json", IDS, seed=1)
    assert saved_shapes(source.checkpoint) == saved_shapes(folder)


@pytest.mark.parametrize("tp", [2, 4])
def test_ranks_read_their_slices_of_the_shared_expert(tiny_q2, tp):
    folder, _ = tiny_q2
    cfg, total = resolve_model(folder).cfg, (folder / "model.safetensors").stat().st_size
    for rank in range(tp):
        model = LiveForCausalLM(cfg, tp, rank)
        assert load_weights(model, folder).read < total / tp * 1.15  # only the routers and gates are whole
        params = dict(model.named_parameters())
        assert list(params["model.layers.0.mlp.shared_expert.down_proj.weight"].shape) == [64, 80 // tp]
        assert list(params["model.layers.0.mlp.shared_expert_gate.weight"].shape) == [1, 64]


@pytest.mark.slow
def test_tp2_matches_tp1_with_one_allreduce_per_moe_block(tiny_q2):
    result, _ = verify(tiny_q2[0], 2, device="cpu", input_ids=IDS, timeout=120)
    assert result.passed, result.summary()
    assert result.max_abs_diff < 1e-4 and result.argmax_agreement == 1.0
    # embedding, then o_proj + (MoE block with its shared expert, or down_proj) per layer
    for r in result.ranks:
        assert r.collectives["all_reduce"]["count"] == 1 + 2 * 3
        assert 0 < r.bytes_read < 0.6 * r.checkpoint_bytes

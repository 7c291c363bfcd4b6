"""MoE (Mixtral, Qwen3-MoE) in the live model: transformers parity, TP parity, one all-reduce per block,
injections."""
import pytest
import torch

from tpviz.live import LiveForCausalLM, load_weights, resolve_model, verify
from tpviz.live.check.inject import apply_injections, describe_injections
from tpviz.live.model.moe import SparseMoeBlock
from tests.live.checks import loading_map

from tests.live.conftest import MOE_FAMILIES
from tests.live.checks import random_round_trip, saved_shapes, tp1_logits, tp1_matches

IDS = torch.randint(0, 999, (2, 12), generator=torch.Generator().manual_seed(7))
INTER = {"mixtral": 96, "qwen3_moe": 48}  # each family's expert intermediate size in conftest
DOWN = {"mixtral": "block_sparse_moe.experts.0.w2", "qwen3_moe": "mlp.experts.0.down_proj"}






@pytest.mark.parametrize("family", list(MOE_FAMILIES))
def test_tp1_matches_transformers_fp32(tiny_moe, family):
    folder, hf_model = tiny_moe[family]
    with torch.no_grad():
        _, report = tp1_matches(folder, hf_model(IDS).logits, IDS)
    shapes, block = report["param_shapes"], "block_sparse_moe" if family == "mixtral" else "mlp"
    assert shapes[f"model.layers.0.{block}.gate.weight"] == [4, 64]  # the router
    assert shapes[f"model.layers.0.{block}.experts.3.gate_up_proj.weight"] == [2 * INTER[family], 64]
    # Qwen3-MoE's mlp_only layer 1 keeps a dense MLP of intermediate_size; Mixtral's layer 1 has experts
    dense = "model.layers.1.mlp.gate_up_proj.weight"
    assert (shapes.get(dense) == [192, 64]) == (family == "qwen3_moe")


def test_qwen3_moe_norm_topk_prob_is_read_and_matters(tiny_moe):
    folder, hf_model = tiny_moe["qwen3_moe"]
    assert resolve_model(folder).cfg.norm_topk_prob is True
    router = hf_model.model.layers[0].mlp.gate
    outs = []
    try:
        for norm in (True, False):
            router.norm_topk_prob = norm
            with torch.no_grad():
                expected = hf_model(IDS).logits
            outs.append(tp1_logits(folder, IDS, lambda c: c.update({"norm_topk_prob": norm})))
            assert (outs[-1] - expected).abs().max() < 1e-4
    finally:
        router.norm_topk_prob = True
    assert (outs[0] - outs[1]).abs().max() > 1e-2  # the flag really changes the routing weights


def test_expert_names_map_onto_merged_layers(tiny_moe):
    """The plan's loading map (vLLM's expert_params_mapping as data): Mixtral's w1/w3 and Qwen3-MoE's gate/up
    load into one merged layer per expert."""
    p, mixtral, qwen = "model.layers.0.block_sparse_moe.experts.3.", *(loading_map(tiny_moe[f][0], 2) for f in
                                                                        ("mixtral", "qwen3_moe"))
    assert mixtral.target(p + "w1.weight") == (p + "gate_up_proj.weight", 0)
    assert mixtral.target(p + "w3.weight") == (p + "gate_up_proj.weight", 1)
    assert mixtral.target(p + "w2.weight") == (p + "w2.weight", None)
    assert qwen.target("model.layers.0.mlp.experts.1.up_proj.weight") == (
        "model.layers.0.mlp.experts.1.gate_up_proj.weight", 1)
    assert mixtral.target("model.layers.0.block_sparse_moe.gate.weight")[1] is None  # router: replicated
    assert qwen.target("model.layers.2.mlp.experts.0.gate_proj.weight") is None  # past its 2 layers


@pytest.mark.parametrize("family", list(MOE_FAMILIES))
def test_random_weights_use_the_checkpoint_layout(tiny_moe, family):
    folder, _ = tiny_moe[family]
    # a config alone: seeded random weights
    source, _ = random_round_trip(folder / "config.json", IDS, seed=1)
    assert saved_shapes(source.checkpoint) == saved_shapes(folder)


@pytest.mark.parametrize("tp", [2, 4])
def test_ranks_read_only_their_expert_slices(tiny_moe, tp):
    folder, _ = tiny_moe["mixtral"]
    cfg, total = resolve_model(folder).cfg, (folder / "model.safetensors").stat().st_size
    for rank in range(tp):
        model = LiveForCausalLM(cfg, tp, rank)
        assert load_weights(model, folder).read < total / tp * 1.1
        w2 = dict(model.named_parameters())["model.layers.1.block_sparse_moe.experts.2.w2.weight"]
        assert list(w2.shape) == [64, 96 // tp]


def test_injections_describe_the_moe_block(tiny_moe):
    cfg = resolve_model(tiny_moe["qwen3_moe"][0]).cfg
    bias, skip = describe_injections(["bias-all-ranks", "skip-allreduce"], cfg, 2)
    assert not bias.has_effect and "the experts are bias-free" in bias.reason
    assert skip.has_effect and "o_proj, down_proj and MoE-block outputs" in skip.reason
    mixtral = resolve_model(tiny_moe["mixtral"][0]).cfg  # no dense layer: no down_proj to name
    assert "o_proj and MoE-block outputs" in describe_injections(["skip-allreduce"], mixtral, 2)[0].reason
    model = LiveForCausalLM(mixtral, 2, 0)
    apply_injections(model, ["skip-allreduce"])
    blocks = [m for m in model.modules() if isinstance(m, SparseMoeBlock)]
    assert len(blocks) == 2 and not any(b.reduce_results for b in blocks)


@pytest.mark.slow
@pytest.mark.parametrize("family", list(MOE_FAMILIES))
def test_tp2_matches_tp1_with_one_allreduce_per_moe_block(tiny_moe, family):
    result, _ = verify(tiny_moe[family][0], 2, device="cpu", seq_len=12, timeout=120)
    assert result.passed, result.summary()
    assert result.max_abs_diff < 1e-4 and result.argmax_agreement == 1.0
    for r in result.ranks:
        # embedding, then o_proj + (MoE block or dense down_proj) per layer: the experts add no collective
        assert r.collectives["all_reduce"]["count"] == 1 + 2 * 2
        assert r.param_shapes[f"model.layers.0.{DOWN[family]}.weight"] == [64, INTER[family] // 2]
        assert 0 < r.bytes_read < 0.6 * r.checkpoint_bytes


@pytest.mark.slow
def test_skip_allreduce_also_skips_the_moe_allreduce(tiny_moe):
    result, _ = verify(tiny_moe["mixtral"][0], 2, device="cpu", seq_len=12,
                       inject=["skip-allreduce"], timeout=120)
    assert not result.passed and result.diverges_at == "layer 0"
    assert result.max_abs_diff > 100 * result.tolerance and result.injections[0].has_effect
    # only the embedding's is left
    assert all(r.collectives["all_reduce"]["count"] == 1 for r in result.ranks)


@pytest.mark.parametrize("family", list(MOE_FAMILIES))
def test_moe_block_is_bitwise_transformers_in_bf16(tiny_moe, family):
    import copy
    folder, hf_model = tiny_moe[family]
    model = LiveForCausalLM(resolve_model(folder).cfg).to(torch.bfloat16)
    load_weights(model, folder)
    block = "block_sparse_moe" if family == "mixtral" else "mlp"
    ours = model.model.layers[0].get_submodule(block)
    # transformers 5 renames Mixtral's
    theirs = copy.deepcopy(hf_model.model.layers[0].mlp).to(torch.bfloat16)
    # we follow the modeling code's eager experts (index_add_ per expert in bf16); transformers 5 defaults to
    # grouped_mm, which sums each token's top-k at once and so differs by bf16 rounding only
    theirs.experts.config._experts_implementation = "eager"
    x = torch.randn(2, 12, 64, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
    with torch.no_grad():
        # same routing dtypes and op order (Mixtral keeps fp32 weights)
        assert torch.equal(ours(x), theirs(x))


@pytest.mark.parametrize("preset, block", [("mistralai/Mixtral-8x7B-v0.1", "block_sparse_moe"),
                                           ("Qwen/Qwen3-30B-A3B", "mlp")])
def test_moe_presets_build_at_tp8_without_weights(preset, block):
    from tpviz.live.load.source import check_split, live_config
    from tpviz.config.sources import resolve_config
    from tpviz.config.normalize import normalize
    raw, name = resolve_config(preset)
    cfg = live_config(normalize(raw, name), layers=2)  # shrinking trims the MoE layer list too
    assert cfg.norm_topk_prob and cfg.spec.moe_layers == [0, 1]
    check_split(cfg, 8)  # meta tensors: no weights are made
    with torch.device("meta"):
        model = LiveForCausalLM(cfg, 8, 7)
    assert isinstance(model.model.layers[1].get_submodule(block), SparseMoeBlock)

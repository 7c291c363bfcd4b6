"""Routing flips in low precision: a near tie that float noise flips is named (layer, token, margin vs noise)
and called noise, never a pass; a real TP bug in an MoE model still fails in bf16 and is not explained away;
the fp32 reference follows the bf16 run's experts, so the noise floor is rounding, not an expert swap."""
import pytest
from dataclasses import replace

import torch

from tpviz.live import prepare, verify
from tpviz.live.check.verify import compare, reference
from tpviz.live.check.results import LayerDiff, RoutingFlip
from tpviz.live.check.routing import decide_before_flips, explain, split
from tpviz.live.run.worker import run_model
from tests.live.model.test_gptoss import IDS, make_gpt_oss


@pytest.fixture(scope="module")
def near_tie(tmp_path_factory):
    """A 2-layer gpt-oss routing each token to ONE of experts 0 and 1, whose router rows differ by ~3e-4 (bf16
    logits round them to a tie or a one-ulp gap); experts 2 and 3 are never candidates (bias -5)."""
    folder = tmp_path_factory.mktemp("near-tie") / "gpt-oss"
    model = make_gpt_oss(folder, seed=50, num_hidden_layers=2, num_experts_per_tok=1)
    gen = torch.Generator().manual_seed(51)
    with torch.no_grad():
        for layer in model.model.layers:
            router = layer.mlp.router
            router.weight[1] = router.weight[0] + 3e-4 * torch.randn(router.weight.shape[1], generator=gen)
            router.weight[2:] = 0
            router.bias[:2], router.bias[2:] = 0.0, -5.0
    model.save_pretrained(folder)
    return folder


@pytest.mark.slow
def test_near_tie_flip_is_named_and_called_noise(near_tie):
    result, _ = verify(near_tie, 2, device="cpu", dtype="bfloat16", input_ids=IDS, timeout=120)
    flip = result.routing
    assert flip is not None and flip.noise_explained, flip
    assert result.max_abs_diff > result.tolerance  # over every position: past the flip the runs differ
    # the verdict: the positions before each row's first flip, which every layer routes alike
    assert (flip.prefix[flip.batch] <= flip.position and len(flip.prefix) == IDS.shape[0]
            and min(flip.prefix) > 0)
    assert result.passed == (flip.prefix_gap <= result.tolerance) and result.passed, flip.explanation
    assert "The verdict compares the positions before each row's first flip" in flip.explanation
    assert (flip.margin <= 2 * flip.noise and flip.router_gap <= flip.router_limit
            and flip.ref_experts != flip.tp_experts)
    assert (f"routing flip at a near tie in layer {flip.layer} (token {flip.position} of "
            f"batch row {flip.batch}") \
        in flip.explanation and "not a TP bug" in flip.explanation
    text = result.summary()
    assert f"routing flip in layer {flip.layer} (float noise at a near tie)" in text.splitlines()[0]
    assert text.startswith(f"PASS: tp=2 vs tp=1 bfloat16 max|Δlogit| {flip.prefix_gap:.3g} over "
                           "the positions before the first routing flip (all positions "
                           f"{result.max_abs_diff:.3g}) <= tolerance")
    assert f"  routing: {flip.explanation}" in text and "<-- routing flip" in text


@pytest.mark.slow
@pytest.mark.parametrize("inject", ["skip-allreduce", "bias-all-ranks"])
def test_injected_bug_in_bf16_moe_is_not_explained_away(near_tie, inject):
    """Even among near ties, a real bug fails (the floor is rounding, not a swap) and its flips are called
    real."""
    result, _ = verify(near_tie, 2, device="cpu", dtype="bfloat16", input_ids=IDS,
                       inject=[inject], timeout=120)
    assert not result.passed and result.max_abs_diff > 10 * result.noise_floor
    assert result.diverges_at == "layer 0" and not result.routing.noise_explained
    assert ("a real mismatch" in result.routing.explanation
            and "not a TP bug" not in result.routing.explanation)


@pytest.mark.slow
def test_injected_bug_in_bf16_mixtral_fails(tiny_moe):
    result, _ = verify(tiny_moe["mixtral"][0], 2, device="cpu", dtype="bfloat16", seq_len=16,
                       inject=["skip-allreduce"], timeout=120)
    assert not result.passed and result.max_abs_diff > 10 * result.noise_floor
    assert result.routing is None or not result.routing.noise_explained


def test_fp32_reference_follows_the_bf16_experts(near_tie):
    """Left to route alone, the fp32 twin swaps experts at the ties and the 'floor' is a swap; following the
    bf16 run's choice it is rounding only, and the block still records its own choice."""
    job = prepare(near_tie, 1, device="cpu", input_ids=IDS, dtype="bfloat16").job
    ref = reference(job, torch.device("cpu"))
    alone, hidden_alone, _ = run_model(replace(job, dtype="float32"), 0, 1, torch.device("cpu"))
    followed = float((ref["logits"] - ref["logits32"]).abs().max())
    assert followed < float((ref["logits"] - alone).abs().max()) / 10
    own, bf16 = split(ref["hidden32"])[1], split(ref["hidden"])[1]
    assert torch.equal(own[0]["ids"], split(hidden_alone)[1][0]["ids"])  # same input: the same own choice
    assert any(not torch.equal(own[L]["ids"], bf16[L]["ids"]) for L in bf16)  # which it did not compute with
    assert compare(ref["logits"], ref["hidden"], ref, "bfloat16")["routing"] is None  # tp=1 against itself


def _records(scores: list[list[float]], k: int = 1) -> dict:
    s = torch.tensor(scores)
    return {0: {"scores": s, "ids": s.topk(k, -1).indices}}


def _explain(tp_scores, ref_scores, ref32_scores, tp_gap: float = 0.0):
    """One MoE layer, 2 tokens; the layer's output differs by tp_gap on every token (floor 1: tolerance 4)."""
    hidden = {"layer 0": torch.zeros(1, 2, 3)}
    layers = [LayerDiff("embed", 0.0, 0.0, 1.0, 0.25), LayerDiff("layer 0", 0.0, 0.0, 4.0, 1.0)]
    limit = lambda floor, scale: 4.0 * floor  # noqa: E731
    return explain(_records(tp_scores), _records(ref_scores), _records(ref32_scores), layers,
                   {"layer 0": hidden["layer 0"] + tp_gap}, hidden,
                   {"layer 0": hidden["layer 0"] + 1.0}, 1e-3, limit)


def test_explain_tells_a_near_tie_from_a_clear_margin():
    same = [[1.0, 0.0], [2.0, 0.0]]
    assert _explain(same, same, same) is None  # routed alike: nothing to explain
    tie = _explain([[1.0, 0.0], [0.99, 1.0]], [[1.0, 0.0], [1.0, 0.99]], [[1.0, 0.0], [0.99, 1.0]])
    assert tie.noise_explained and (tie.layer, tie.batch, tie.position) == (0, 0, 1)
    assert tie.ref_experts == [0] and tie.tp_experts == [1] and tie.margin == pytest.approx(0.01)
    assert "routing flip at a near tie in layer 0" in tie.explanation
    # a flip with a clear margin where the router scores agree within their tolerance (token 0 sets a wide
    # floor)
    clear = _explain([[1.0, 0.0], [0.5, 1.1]], [[1.0, 0.0], [1.0, 0.4]], [[1.5, 0.0], [1.01, 0.4]])
    assert not clear.noise_explained and "clear margin" in clear.explanation
    # a near tie, but the tokens routed alike differ beyond the layer's tolerance: a real mismatch in the
    # layer
    bad = _explain([[1.0, 0.0], [0.99, 1.0]], [[1.0, 0.0], [1.0, 0.99]],
                   [[1.0, 0.0], [0.99, 1.0]], tp_gap=9.0)
    assert not bad.noise_explained and "tokens routed alike differ too" in bad.explanation


def test_recording_leaves_the_blocks_as_they_were(tmp_path):
    """DeepSeek's blocks keep their routing config through a recorded pass and route again in the steps after
    it."""
    from tests.live.model.test_deepseek import make_deepseek
    make_deepseek("deepseek_v3", tmp_path, seed=3)
    job = prepare(tmp_path, 1, device="cpu", input_ids=[[5, 9, 2, 7]], generate=2).job
    _, hidden, report = run_model(job, 0, 1, torch.device("cpu"))
    routes = split(hidden)[1]
    assert sorted(routes) == [1, 2] and {"scores", "ids", "groups", "group_ids"} <= set(routes[1])
    assert report["generation"]["gen.tokens"].numel() == 2


@pytest.mark.slow
def test_page_shows_the_routing_flip_beside_the_verdict(near_tie, monkeypatch):
    import json

    from tests.live.test_page import _page
    monkeypatch.setenv("TPVIZ_LOCAL_ROOT", "/")
    at = _page(near_tie)
    at.number_input(key="live_tp").set_value(2)
    at.selectbox(key="live_dtype").set_value("bfloat16")
    at.text_input(key="live_ids").set_value(json.dumps(IDS.tolist()))
    at.button(key="live_run").click().run()
    assert not at.exception and not at.error
    assert (at.success[0].value.startswith("PASS: tp=2 vs tp=1 bfloat16")
            and "before the first routing flip" in \
        at.success[0].value)
    note = next(i.value for i in at.info if i.value.startswith("Routing: "))
    assert ("routing flip at a near tie in layer" in note
            and "The verdict compares the positions before" in note)


def _noise_flip() -> RoutingFlip:
    return RoutingFlip(layer=0, batch=0, position=2, decided_by="experts", ref_experts=[0], tp_experts=[1],
                       margin=0.0, noise=1e-3, tokens=1, later_layers=[], router_gap=0.0, router_limit=1.0,
                       alike_gap=0.0, alike_limit=1.0, noise_explained=True,
                       explanation="routing flip at a near tie")


def test_the_verdict_leaves_out_rows_that_flip_at_their_first_position():
    """Rows of 3 positions: row 0 flips at position 2, row 1 at position 0 (left out), row 2 never; the
    verdict holds positions 0-1 of row 0 and all of row 2 to the tolerance, and fails when they differ."""
    ref_ids = torch.zeros(9, 1, dtype=torch.int64)
    tp_ids = ref_ids.clone()
    tp_ids[2] = tp_ids[3] = 1  # row 0 position 2, row 1 position 0
    tp, ref = {0: {"ids": tp_ids}}, {0: {"ids": ref_ids}}
    ref_logits = torch.zeros(3, 3, 5)
    tp_logits = ref_logits.clone()
    tp_logits[0, 2] = tp_logits[1] = 5.0  # only the flipped positions and what follows them differ
    flip = _noise_flip()
    assert decide_before_flips(flip, tp, ref, tp_logits, ref_logits, limit=0.01)
    assert flip.prefix == [2, 0, 3] and flip.prefix_gap == 0.0
    assert "(row 0: 2, row 2: 3; left out, flipping at the first position: row 1)" in flip.explanation
    tp_logits[2, 1] = 0.5  # a difference where both runs route alike: a real mismatch
    assert not decide_before_flips(_noise_flip(), tp, ref, tp_logits, ref_logits, limit=0.01)
    tp_ids[0] = tp_ids[6] = 1  # every row flips at its first position: nothing to decide on
    flip = _noise_flip()
    assert (not decide_before_flips(flip, tp, ref, tp_logits, ref_logits, limit=0.01)
            and flip.prefix_gap is None)
    assert flip.explanation.endswith("Every row flips at its first position, so no position is "
                                     "routed alike in every layer: give other ids, or run in float32")

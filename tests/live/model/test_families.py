"""Phi-3, OLMo-2 and OLMo-3 in the live model: transformers parity at tp=1, TP parity, OLMo's all-gathered q/k
norms (and that a per-rank norm is wrong), Phi-3's fused tensors read per rank, random weights, the
explorer."""
import pytest
import torch

import tpviz
from tpviz.trace.collectives import norm_collectives
from tpviz.errors import TPSizeError
from tpviz.live import LiveForCausalLM, load_weights, prepare, resolve_model, verify
from tpviz.live.check.inject import describe_injections
from tpviz.live.load.random_weights import checkpoint_shapes

from tests.live.conftest import EXTRA_FAMILIES
from tests.live.checks import random_round_trip, saved_shapes, tp1_logits, tp1_matches

IDS = torch.randint(0, 999, (2, 12), generator=torch.Generator().manual_seed(7))  # longer than every window






@pytest.mark.parametrize("family", list(EXTRA_FAMILIES))
def test_tp1_matches_transformers_fp32(tiny_extra, family):
    folder, hf_model = tiny_extra[family]
    with torch.no_grad():
        prep, report = tp1_matches(folder, hf_model(IDS).logits, IDS)
    # random weights write exactly this layout: the same names (fused for Phi-3, OLMo's norms) and shapes
    assert checkpoint_shapes(prep.source.cfg) == saved_shapes(folder)
    shapes = report["param_shapes"]
    if family == "phi3":
        assert prep.source.cfg.sliding_window == 6
    else:  # OLMo: no pre-norms; full-width q/k norms; the post-feedforward norm
        assert "model.layers.0.input_layernorm.weight" not in shapes
        assert shapes["model.layers.0.self_attn.q_norm.weight"] == [64]
        kv = EXTRA_FAMILIES[family]["num_key_value_heads"]
        assert shapes["model.layers.0.self_attn.k_norm.weight"] == [kv * 16]
        assert shapes["model.layers.0.post_feedforward_layernorm.weight"] == [64]


def _no_window(cfg: dict) -> None:
    cfg["sliding_window"] = None
    for layer in cfg["spec"]["layers"]:
        layer["mixer"]["window"] = 0


@pytest.mark.parametrize("family, patch", [
    ("phi3", _no_window),  # Phi-3's model-wide window (6 < 12 tokens)
    ("olmo3", _no_window),  # OLMo-3's sliding layers (window 5)
    ("olmo3", lambda cfg: cfg.update(local_rope=None)),  # its sliding layers' own rope_theta (10000, not 5e5)
], ids=["phi3-window", "olmo3-window", "olmo3-sliding-rope"])
def test_family_details_matter(tiny_extra, family, patch):
    """Each family detail changes the logits: the parity above would catch it missing."""
    folder, hf_model = tiny_extra[family]
    with torch.no_grad():
        expected = hf_model(IDS).logits
    assert (tp1_logits(folder, IDS, patch) - expected).abs().max() > 1e-2


@pytest.mark.slow
@pytest.mark.parametrize("family, tp", [("phi3", 4), ("olmo2", 2), ("olmo3", 4)])
def test_tp_matches_tp1(tiny_extra, family, tp):
    """Phi-3 at tp=4 replicates its 2 KV heads out of the fused qkv; OLMo all-gathers q and k in every
    layer."""
    folder, _ = tiny_extra[family]
    result, _ = verify(folder, tp, device="cpu", input_ids=IDS, timeout=120)
    assert result.passed, (result.max_abs_diff, result.diverges_at)
    layers, kv = (EXTRA_FAMILIES[family].get("num_hidden_layers", 2),
                  EXTRA_FAMILIES[family]["num_key_value_heads"])
    gathers = result.ranks[0].collectives.get("all_gather")
    if family == "phi3":
        assert gathers is None
    # one all-gather of q and one of k per layer, each rank sending its [2, 12] tokens of its heads (fp32)
    else:
        assert gathers == {"count": 2 * layers, "bytes": layers * 2 * 12 * (64 + kv * 16) // tp * 4}
        # the explorer's collectives table counts what the ranks issued, each rank's slice being 1/tp of the
        # whole
        spec = tpviz.load_spec(folder)
        table = norm_collectives(spec, tp)
        assert sum(c.count for c in table) == gathers["count"]
        values = sum(c.count * c.bytes_per_token // spec.dtype_bytes // tp for c in table)
        assert values * 2 * 12 * 4 == gathers["bytes"]  # [2, 12] tokens in fp32


@pytest.mark.slow
def test_olmo2_per_rank_qk_norm_is_wrong(tiny_extra):
    """Normalizing each rank's heads alone (no all-gather) gives another answer: the check catches it."""
    folder, _ = tiny_extra["olmo2"]
    result, _ = verify(folder, 2, device="cpu", input_ids=IDS, inject=["local-qk-norm"], timeout=120)
    assert not result.passed and result.verdict == "MISMATCH" and result.diverges_at == "layer 0"
    assert result.max_abs_diff > 10 * result.tolerance
    assert "all_gather" not in result.ranks[0].collectives
    assert [i.has_effect for i in result.injections] == [True]
    phi3 = describe_injections(["local-qk-norm"], resolve_model(tiny_extra["phi3"][0]).cfg, 2)[0]
    assert not phi3.has_effect and "no q/k norm over the whole projection" in phi3.reason


def test_olmo_refuses_replicated_kv_heads(tiny_extra):
    """tp=4 over 2 KV heads replicates them: the all-gathered k would not be k, and vLLM 0.33 refuses it
    too."""
    folder, _ = tiny_extra["olmo2"]
    with pytest.raises(TPSizeError, match=r"num_key_value_heads=2 is fewer than tp_size=4: k_norm .*"
                                          r"Valid tp sizes for this model: 1, 2\.$"):
        prepare(folder, 4, device="cpu")
    with pytest.raises(TPSizeError, match="k_norm spans all KV heads"):  # the model's own guard
        LiveForCausalLM(resolve_model(folder).cfg, 4, 0)


def test_phi3_fused_tensors_are_read_per_rank(tiny_extra):
    from safetensors.torch import load_file
    folder, _ = tiny_extra["phi3"]
    source, disk = resolve_model(folder), load_file(str(folder / "model.safetensors"))
    total = sum(t.numel() * t.element_size() for t in disk.values())
    qkv, gate_up = (disk["model.layers.1.self_attn.qkv_proj.weight"],
                    disk["model.layers.1.mlp.gate_up_proj.weight"])
    for rank in range(2):
        model = LiveForCausalLM(source.cfg, 2, rank)
        read = load_weights(model, folder).read
        assert read < total / 2 * 1.15, (read, total)
        # q rows 0:64 (2 heads a rank), k 64:96 and v 96:128 (1 KV head a rank); gate 0:96, up 96:192
        q, k, v = (qkv[a + rank * n: a + (rank + 1) * n] for a, n in ((0, 32), (64, 16), (96, 16)))
        assert torch.equal(model.model.layers[1].self_attn.qkv_proj.weight, torch.cat([q, k, v]))
        gate, up = (gate_up[a + rank * 48: a + (rank + 1) * 48] for a in (0, 96))
        assert torch.equal(model.model.layers[1].mlp.gate_up_proj.weight, torch.cat([gate, up]))


@pytest.mark.slow
@pytest.mark.parametrize("family", list(EXTRA_FAMILIES))
def test_random_weights_run_and_load_in_transformers(tiny_extra, family):
    config = tiny_extra[family][0] / "config.json"
    result, _ = verify(config, 2, device="cpu", input_ids=IDS, timeout=120)
    assert result.random_weights and result.passed, result.max_abs_diff
    random_round_trip(config, IDS)  # the random folder is a checkpoint like any other


@pytest.mark.parametrize("family", list(EXTRA_FAMILIES))
def test_explorer_maps_the_checkpoint(tiny_extra, family):
    """The shard map names every tensor with its shape (fp32 bytes equal only when the shapes do)."""
    folder, _ = tiny_extra[family]
    m = tpviz.shard_map(str(folder), 2, dtype="float32")
    assert m.checkpoint["verified"] and m.checkpoint["bytes"]["count"] == 0, m.checkpoint
    assert not any("not one tpviz knows" in n for n in resolve_model(folder).cfg.notes)  # a known layout

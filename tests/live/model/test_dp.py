"""SGLang layouts run live over gloo: attention-DP groups run their own rows with their own attn_tp split, the
MoE gathers every group's tokens for the experts its EP rank holds (each cut moe_tp ways) and hands each group
its rows back; checked against transformers and tp=1, with a bug only this path can have."""
import pytest
import torch

from tpviz.errors import TpvizError
from tpviz.cli.verify import main
from tpviz.live import verify
from tpviz.live.model.config import Stage
from tpviz.live.load.source import resolve_model
from tpviz.rules import Layout
from tests.live.conftest import make_tiny
from tests.live.model.test_deepseek import make_deepseek

IDS = torch.randint(0, 999, (5, 9), generator=torch.Generator().manual_seed(5))  # uneven over 2 and 4


@pytest.fixture(scope="module")
def qmoe(tmp_path_factory):
    """Qwen3-MoE, 3 layers (layer 1 dense), 4 experts top-2, 4 heads over 2 KV heads."""
    folder = tmp_path_factory.mktemp("sglang-moe")
    return folder, make_tiny("qwen3_moe", folder, seed=7, num_hidden_layers=3, num_key_value_heads=2)


def _sglang(folder, tp, **carve):
    return verify(folder, tp, device="cpu", input_ids=IDS, rules="sglang", carve=carve, timeout=180)


def test_stage_groups_follow_sglang_numbering(qmoe):
    """tp 4, attn-dp 2, ep 2: attention groups {0,1} {2,3}; EP index outer, moe_tp inner."""
    spec = resolve_model(qmoe[0]).cfg.spec
    layout = Layout(4, attn_dp=2, ep_size=2)
    stages = [Stage.of(spec, 4, r, rules="sglang", layout=layout) for r in range(4)]
    assert [s.cuts.dp_index for s in stages] == [0, 0, 1, 1]
    assert [s.cuts.of("attention") for s in stages] == [(2, 0), (2, 1), (2, 0), (2, 1)]
    assert [s.experts for s in stages] == [(0, 1), (0, 1), (2, 3), (2, 3)]
    assert [s.cuts.of("experts") for s in stages] == [(2, 0), (2, 1), (2, 0), (2, 1)]
    assert stages[3].elsewhere("model.layers.0.mlp.experts.1.down_proj.weight")
    assert not stages[3].elsewhere("model.layers.0.mlp.experts.2.down_proj.weight")


@pytest.mark.slow
def test_attention_dp_and_partial_ep_match_transformers(qmoe):
    folder, hf = qmoe
    result, logits = _sglang(folder, 4, attn_dp=2, ep_size=2)
    assert result.passed, result.summary()
    with torch.no_grad():
        want = hf(IDS).logits
    assert (logits - want).abs().max() < 1e-4  # an independent implementation, every row
    assert result.layout == "tp=4 × attn-dp=2 × ep=2" and result.carved == {"attn_dp": 2, "ep_size": 2}
    for r in result.ranks:
        assert r.experts == ([0, 1] if r.rank < 2 else [2, 3])
        # experts cut moe_tp = 2 ways, attention over attn_tp = 2: 2 of 4 q heads, 1 of 2 KV heads
        assert r.param_shapes[f"model.layers.0.mlp.experts.{r.experts[0]}.down_proj.weight"] == [64, 24]
        assert r.param_shapes["model.layers.0.self_attn.qkv_proj.weight"] == [64, 64]
        assert r.param_shapes["model.layers.1.mlp.down_proj.weight"] == [64, 24]  # dense: the whole tp
        assert r.groups["attention"] == [2, r.rank % 2] and r.params_checked_against_map > 0
        # per layer: o_proj reduced in the attention group, the FFN gathered and reduced over the stage;
        # the embedding is cut over the attention group, the lm_head over the whole tp (gathered rows)
        assert r.collectives["all_reduce"]["count"] == 1 + 3 + 3
        assert r.collectives["all_gather"]["count"] == 3 + 1
    assert "attn-DP group" in result.summary()


@pytest.mark.slow
def test_a_token_combined_on_the_wrong_dp_rank_is_caught(qmoe):
    result, _ = verify(qmoe[0], 4, device="cpu", input_ids=IDS, rules="sglang",
                       carve={"attn_dp": 2, "ep_size": 2}, inject=["wrong-dp-rows"], timeout=180)
    assert not result.passed and result.diverges_at == "layer 0"
    assert result.injections[0].has_effect
    plain = verify(qmoe[0], 2, device="cpu", input_ids=IDS, rules="sglang", inject=["wrong-dp-rows"],
                   timeout=180)[0]
    assert plain.passed and not plain.injections[0].has_effect  # no attention DP: nothing to mix up


@pytest.mark.slow
def test_dp_lm_head_whole_attention_and_pipeline_stages(qmoe):
    """attn-dp 4 (attention whole on each GPU, its own row) with the lm_head cut over that group of one."""
    result, _ = _sglang(qmoe[0], 4, attn_dp=4, ep_size=4, dp_lm_head=True)
    assert result.passed, result.summary()
    for r in result.ranks:
        assert r.param_shapes["model.layers.0.self_attn.qkv_proj.weight"] == [128, 64]  # whole
        assert r.param_shapes["lm_head.weight"] == [1024, 64]  # 999 padded to 64, one group of one
        assert r.experts == [r.rank]
        assert r.param_shapes[f"model.layers.2.mlp.experts.{r.rank}.down_proj.weight"] == [64, 48]
    staged, _ = verify(qmoe[0], 2, device="cpu", input_ids=IDS, pp=2, rules="sglang",
                       carve={"attn_dp": 2, "ep_size": 2}, timeout=180)
    assert staged.passed, staged.summary()
    assert [r.layers for r in staged.ranks] == [[0], [0], [1, 2], [1, 2]]  # SGLang: the remainder goes last


@pytest.fixture(scope="module")
def ds3(tmp_path_factory):
    folder = tmp_path_factory.mktemp("sglang-ds3")
    make_deepseek("deepseek_v3", folder, seed=31)
    return folder


@pytest.mark.slow
def test_deepseek_attention_dp_whole_experts_and_replicated_dense(ds3):
    result, _ = _sglang(ds3, 4, attn_dp=4, ep_size=4, dense_tp1=True)
    assert result.passed, result.summary()
    for r in result.ranks:  # MLA whole on every GPU, 2 of 8 experts whole, the dense layer 0 whole
        assert r.param_shapes["model.layers.0.self_attn.q_b_proj.weight"] == [96, 32]
        assert r.experts == [2 * r.rank, 2 * r.rank + 1]
        assert r.param_shapes["model.layers.0.mlp.down_proj.weight"] == [64, 96]
        assert r.param_shapes["model.layers.1.mlp.shared_experts.down_proj.weight"] == [64, 8]  # the whole tp


def test_sglang_layouts_refused_in_one_line(qmoe, capsys):
    folder = str(qmoe[0])
    cases = [(["--tp", "4", "--attn-dp-size", "3"], "does not divide --tp 4"),
             (["--tp", "4", "--attn-dp-size", "2", "--batch", "1"], "give at least 2 (--batch 2"),
             (["--tp", "4", "--attn-dp-size", "2", "--prompt", "1 2", "--generate", "2"], "--generate"),
             (["--tp", "4", "--ep", "3"], "does not divide --tp 4"),
             (["--tp", "2", "--attn-dp-size", "2", "--rules", "vllm"], "add --rules sglang")]
    for flags, words in cases:
        rules = [] if "--rules" in flags else ["--rules", "sglang"]
        assert main([folder, *flags, *rules, "--device", "cpu"]) == 2
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and words in err, err
    with pytest.raises(TpvizError, match="unknown layout field"):
        verify(folder, 2, rules="sglang", carve={"attn_tp": 2})


def test_llama_attention_dp_is_refused_not_guessed(tmp_path):
    folder = tmp_path / "llama"
    make_tiny("llama", folder)
    with pytest.raises(TpvizError, match="cuts attention over the whole --tp"):
        verify(folder, 2, device="cpu", rules="sglang", carve={"attn_dp": 2})

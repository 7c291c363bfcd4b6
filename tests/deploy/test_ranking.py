"""Pipeline partitions, expert placement, deployments and the layout ranking, against hand-computed answers
(vLLM 0.33's rules: distributed/utils.py get_pp_indices, fused_moe/expert_map_manager.py
determine_expert_map)."""
import pytest

from tpviz import shard_map
from tpviz.cli.main import main
from tpviz.deploy.deployment import deploy
from tpviz.deploy.parallel import stage_layers
from tpviz.deploy.ranking import plan_notes, rank_layouts as plan
from tpviz.deploy.sizing import Sizer
from tpviz.deploy.traffic import comm_per_token
from tpviz.errors import LayoutError
from tpviz.rules import Layout, ruleset

from tpviz.config.sources import load_spec

VLLM = ruleset("vllm")


@pytest.mark.parametrize("layers, pp, parts", [
    (32, 4, [8, 8, 8, 8]),
    # remainder 1: the stage before the last
    (61, 4, [15, 16, 15, 15]) if False else (61, 4, [15, 15, 16, 15]),
    (62, 4, [15, 16, 16, 15]),  # remainder 2: the two stages before the last
    (94, 8, [11, 12, 12, 12, 12, 12, 12, 11]),  # remainder 6
    (5, 5, [1, 1, 1, 1, 1]),
])
def test_pp_partition_by_hand(layers, pp, parts):
    assert VLLM.pp_partition(layers, pp, override="") == parts and sum(parts) == layers


def test_pp_override_and_bad_input(monkeypatch):
    assert VLLM.pp_partition(61, 2, override="30,31") == [30, 31]
    monkeypatch.setenv("VLLM_PP_LAYER_PARTITION", "20,41")
    assert stage_layers(61, 2, VLLM)[1] == list(range(20, 61))
    for bad, word in (("30,30", "gives 60 layers"), ("61", "1 stages"), ("a,b", "comma-separated")):
        with pytest.raises(LayoutError) as e:
            VLLM.pp_partition(61, 2, override=bad)
        assert word in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(LayoutError, match="more pipeline stages than the model's 2 layers"):
        VLLM.pp_partition(2, 3, override="")


def test_expert_placement_linear_and_round_robin_uneven():
    # the first ranks take one more
    assert VLLM.expert_placement(10, 4) == [[0, 1, 2], [3, 4, 5], [6, 7], [8, 9]]
    assert VLLM.expert_placement(10, 4, "round_robin") == [[0, 4, 8], [1, 5, 9], [2, 6], [3, 7]]
    assert VLLM.expert_placement(256, 16)[15] == list(range(240, 256))
    with pytest.raises(LayoutError, match="placement"):
        VLLM.expert_placement(8, 2, "random")


def test_layouts_multiply_to_n():
    all8 = VLLM.candidates(8, moe=True)
    assert all(x.gpus == 8 for x in all8) and Layout(8, 1, 1, True) in all8 and Layout(1, 1, 8) in all8
    assert Layout(1, 8, 1, True) not in all8  # tp x dp = 1: nothing to spread experts over


def verdicts(model: str, gpus: int, gib: float, rules: str) -> dict:
    return {r.layout: r for r in plan(load_spec(model), gpus, gib, rules)}


@pytest.mark.parametrize("gpus", [8, 16])
def test_ranking_qwen3_235b_fp8(gpus):
    old, new = verdicts("Qwen/Qwen3-235B-A22B-FP8", gpus, 141, "vllm-0.28"), verdicts(
        "Qwen/Qwen3-235B-A22B-FP8", gpus, 141, "vllm")
    tp8 = Layout(8, gpus // 8, 1)  # TP 8 (x PP 2 on 16 GPUs): each expert cut 8 ways, 1536 / 8 = 192
    assert "= 192 is not divisible by weight quantization block_n = 128" in old[tp8].problem  # the reports
    assert old[Layout(8, gpus // 8, 1, True)].problem is None  # TP 8 + EP works
    assert old[Layout(4, 2 * gpus // 8, 1)].problem is None  # TP 4 x PP 2 (x 2) works
    assert new[tp8].problem is None and new[tp8].warnings  # 0.33: valid through the 64x64 fallback
    if gpus == 16:  # without EP, vLLM cuts experts over tp x dp: TP 4 x PP 2 x DP 2 is 8 ways again
        assert "= 192 is not divisible" in old[Layout(4, 2, 2)].problem


@pytest.mark.parametrize("gpus", [8, 16])
def test_ranking_deepseek_v3(gpus):
    for rules in ("vllm", "vllm-0.28"):
        v = verdicts("deepseek-ai/DeepSeek-V3", gpus, 141, rules)
        assert v[Layout(8, gpus // 8, 1)].problem is None and v[Layout(8, 1, gpus // 8, True)].problem is None
    rows = plan(load_spec("deepseek-ai/DeepSeek-V3"), 32, 141, "vllm")
    for ep in (False, True):  # its dense layers and shared experts stay TP-split, EP or not
        tp32 = next(r for r in rows if r.layout == Layout(32, 1, 1, ep))
        assert "down_proj" in tp32.problem and "= 576 is not divisible" in tp32.problem


def test_ranking_bytes_match_the_map_and_stages_sum_up():
    p = Sizer(load_spec("deepseek-ai/DeepSeek-V3"), "vllm")
    one = p.row(Layout(8), 141 * 2**30, 0.9, 8192)
    assert one.weights == max(r.weight_bytes for r in shard_map("deepseek-ai/DeepSeek-V3", 8).ranks)
    two = p.row(Layout(8, 2), 141 * 2**30, 0.9, 8192)  # the same layers split over two stages
    assert sum(two.stage_weights) == one.weights > max(two.stage_weights)  # untied: every tensor on one stage
    ep = p.row(Layout(8, 1, 1, True), 141 * 2**30, 0.9, 8192)
    assert ep.weights == one.weights  # 256 experts / 8 whole = 32 each, the same bytes as 1/8 of each


def test_ranking_bad_input():
    with pytest.raises(LayoutError, match="gpus=0"):
        plan(load_spec("Qwen/Qwen3-8B"), 0, 80)
    dense = Sizer(load_spec("Qwen/Qwen3-8B"), "vllm").row(Layout(2, 1, 1, True), 80 * 2**30, 0.9, 8192)
    assert "needs a MoE model" in dense.problem
    tiny = Sizer(load_spec("Qwen/Qwen3-0.6B"), "vllm").row(Layout(1, 64), 80 * 2**30, 0.9, 8192)
    assert "more pipeline stages than the model's 28 layers" in tiny.problem


def test_nano_vllm_runs_tensor_parallelism_alone(capsys):
    """nano-vllm's Config has tensor_parallel_size alone: its plan is TP N alone, said once in its notes (not
    one rejection per pp / dp / ep layout), and a pp / dp / ep layout under its rules is one line, not a
    device grid it cannot run."""
    spec = load_spec("Qwen/Qwen3-8B")
    rows = plan(spec, 4, 24, rules="nano-vllm")
    assert [(r.layout, r.problem) for r in rows] == [(Layout(4), None)]
    assert plan_notes(spec, "nano-vllm",
                      True)[0].startswith("nano-vllm runs tensor parallelism alone, so its plan")
    assert not any("tensor parallelism alone" in n for n in plan_notes(spec, "vllm", True))
    # TP 3: its own rule, still one row
    assert plan(load_spec("Qwen/Qwen3-0.6B"), 3, 24, rules="nano-vllm")[0].problem
    for layout in (Layout(2, 2), Layout(2, 1, 2), Layout(4, 1, 1, True)):
        with pytest.raises(LayoutError, match="^nano-vllm runs tensor parallelism alone"):
            deploy(load_spec("Qwen/Qwen3-30B-A3B"), layout, "nano-vllm")
    assert main(["map", "Qwen/Qwen3-30B-A3B", "--tp", "4", "--pp", "2", "--rules", "nano-vllm"]) == 2
    assert capsys.readouterr().err.startswith("error: nano-vllm runs tensor parallelism alone")


def test_plan_cli(capsys):
    assert main(["plan", "Qwen/Qwen3-235B-A22B-FP8", "--gpus", "8", "--gpu-mem", "80",
                 "--rules", "vllm-0.28"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("Qwen/Qwen3-235B-A22B-FP8 on 8 × 80 GiB (vLLM 0.28 rules")
    assert any(x.startswith("TP 8 × PP 1 × DP 1 ") and "rejected" in x for x in out)
    assert main(["plan", "Qwen/Qwen3-8B", "--gpus", "0", "--gpu-mem", "80"]) == 2


def test_deployment_ranks_stages_and_experts():
    from tpviz.render.plots.deployment import device_grid, expert_figure
    lay = deploy(load_spec("Qwen/Qwen3-30B-A3B"), Layout(2, 2, 2, True), "vllm", "round_robin")
    assert [g.rank for g in lay.gpus] == list(range(8))
    g5 = lay.gpus[5]  # rank 5 = (dp 1 * pp 2 + stage 0) * tp 2 + tp 1
    assert (g5.dp, g5.pp, g5.tp) == (1, 0, 1) and g5.layers == [0, 24]
    assert g5.experts == list(range(3, 128, 4))  # EP rank dp * tp + tp = 3 of 4, round-robin
    assert lay.stages == [[0, 24], [24, 48]] and lay.comm_bytes_per_token["pp_send_recv"] == 2048 * 2
    heat = device_grid(lay).data[0]
    assert len(heat.z) == 2 and expert_figure(lay) is not None
    # colour from 0 GiB: the stages, a final norm apart, must not look light and dark
    assert heat.zmin == 0 and heat.zmax == max(g.weight_bytes for g in lay.gpus) / 2**30
    with pytest.raises(LayoutError, match="needs a MoE model"):
        deploy(load_spec("Qwen/Qwen3-8B"), Layout(2, 1, 1, True))


def test_map_cli_with_a_layout(capsys, tmp_path):
    import json
    out = tmp_path / "m.json"
    assert main(["map", "deepseek-ai/DeepSeek-V3", "--tp", "4", "--pp", "2", "--ep", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "GPU   7 (stage 1, replica 0, tp rank 3): layers 31–60, experts 192–255" in text
    d = json.loads(out.read_text())
    assert d["schema"] == "tpviz.shardmap/4" and d["layout"]["stages"] == [[0, 31], [31, 61]]
    assert main(["map", "Qwen/Qwen3-8B", "--tp", "2", "--ep"]) == 2  # EP on a dense model: one line
    assert capsys.readouterr().err.count("\n") == 1


def test_communication_is_the_busiest_gpus_over_its_own_stage():
    """Llama-3.1-8B (32 layers, hidden 4096 in bf16 = 8 KiB per token): at tp 2 every layer all-reduces twice,
    a ring share of 2 x (2-1)/2 = 1 x 8 KiB each; with pp 2 a GPU runs 16 layers, and a hand-off sends the
    hidden state and residual, each tp GPU its half (8 KiB), which the next stage's GPUs all-gather (8 KiB
    each). The first stage all-reduces the embedding, the last all-gathers the logits (128,256 padded to
    128,256)."""
    spec, kib = load_spec("meta-llama/Llama-3.1-8B"), 1024
    c = comm_per_token(spec, Layout(2))
    assert c["tp_all_reduce"] == 32 * 2 * 8 * kib and c["embed_all_reduce"] == 8 * kib
    assert c["logits_gather"] == 128256 * 2 / 2 and c["norm_collectives"] == 0
    # to GPU 0: the same half
    assert comm_per_token(spec, Layout(2), "nano-vllm")["logits_gather"] == 128256 * 2 / 2
    assert comm_per_token(spec, Layout(4), "nano-vllm")["logits_gather"] == 128256 * 2 / 4
    assert comm_per_token(spec, Layout(4))["logits_gather"] == 128256 * 2 * 3 / 4
    # stage 1's logits outweigh stage 0's embedding
    first, last = comm_per_token(spec, Layout(2, 2)), 128256 * 2 / 2
    assert first["tp_all_reduce"] == 16 * 2 * 8 * kib and first["pp_send_recv"] == 8 * kib
    assert first["logits_gather"] == last and first["embed_all_reduce"] == 0
    # stages of 11, 11, 10 layers: the last one's logits make it the busiest
    c = comm_per_token(spec, Layout(4, 3))
    assert c["tp_all_reduce"] == 10 * 2 * 1.5 * 8 * kib and c["pp_send_recv"] == 2 * 8 * kib * 3 / 4
    assert sum(c.values()) == 10 * 2 * 1.5 * 8 * kib + 2 * 8 * kib * 3 / 4 + 128256 * 2 * 3 / 4
    # one GPU per stage: only the hand-offs, a whole hidden state and residual
    c = comm_per_token(spec, Layout(1, 4))
    assert sum(c.values()) == c["pp_send_recv"] == 2 * 8 * kib


def test_olmo_communication_counts_the_q_and_k_all_gathers():
    """OLMo-2 all-gathers q and k in each of its 32 layers: at tp 4 each GPU sends 3/4 of both, per token."""
    from tests.trace.test_collectives import olmo2_config
    spec = load_spec(olmo2_config(), "olmo2-7b")
    assert comm_per_token(spec, Layout(4))["norm_collectives"] == 32 * (4096 + 4096) * 2 * 3 / 4
    assert comm_per_token(spec, Layout(4, 2))["norm_collectives"] == 16 * (4096 + 4096) * 2 * 3 / 4


def test_map_cli_draws_a_layout_only_ep_makes_work(capsys):
    """plan accepts Qwen3-30B-A3B-FP8 at TP 16 + EP (experts whole); map --ep shows its GPUs instead of
    refusing with advice to use the flag already given, and names what it cannot draw."""
    assert main(["map", "Qwen/Qwen3-30B-A3B-FP8", "--tp", "16", "--ep"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("TP 16 × PP 1 × DP 1 + EP: without EP, ")
    assert "weight = 48 is not divisible" in out
    assert "GPU   1 (stage 0, replica 0, tp rank 1): layers 0–47, experts 8–15" in out
    assert main(["map", "Qwen/Qwen3-30B-A3B-FP8", "--tp", "16", "--ep", "--json", "x.json"]) == 2
    assert "only the EP layout exists" in capsys.readouterr().err
    # no expert-split fallback warning
    assert main(["map", "Qwen/Qwen3-235B-A22B-FP8", "--tp", "8", "--ep"]) == 0
    assert "Triton MoE kernel" not in capsys.readouterr().out
    # without EP the experts are cut: it is
    assert main(["map", "Qwen/Qwen3-235B-A22B-FP8", "--tp", "8"]) == 0
    assert "Triton MoE kernel" in capsys.readouterr().out


def test_a_refused_tp_with_a_layout_still_lists_the_valid_sizes(capsys):
    assert main(["map", "Qwen/Qwen3-8B", "--tp", "3", "--pp", "2"]) == 2
    assert (capsys.readouterr().err
            == ("error: num_attention_heads=32 is not divisible by tp_size=3. Valid tp sizes "
                                       "under vLLM 0.33 rules: 1, 2, 4, 8, 16, 32.\n"))


def test_a_deployment_counts_windowed_layers_cache_apart():
    """Gemma-2-9B at TP 2 x PP 2: stage 0 holds layers 0-20, 11 sliding (even) and 10 full; each caches 4 KV
    heads of 256 per GPU per token (4 KiB in bf16)."""
    gpu = deploy(load_spec("google/gemma-2-9b-it"), Layout(2, 2)).gpus[0]
    assert (gpu.kv_cache_bytes_per_token, gpu.kv_windowed_bytes_per_token) == (10 * 4096, 11 * 4096)

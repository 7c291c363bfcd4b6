"""The speed bound against hand-computed terms (every byte and FLOP counted here from the config's numbers,
not read off tpviz), the topology, the EP all-to-all, the goal's ranking, and the command line."""
import json

import pytest

from tpviz.cli.main import main
from tpviz.config.sources import load_spec
from tpviz.deploy.hardware import HardwareError, Topology, catalog, gpu_type
from tpviz.deploy.perf import Speed, Workload, WorkloadError
from tpviz.deploy.ranking import rank_layouts
from tpviz.deploy.sizing import Sizer
from tpviz.deploy.traffic import stage_traffic
from tpviz.rules import Layout

US = 1e-6
H100, H200 = gpu_type("h100"), gpu_type("h200")


def bound(model, layout, gpu, work, gpus_per_node=8):
    spec = load_spec(model)
    sizer = Sizer(spec)
    row = sizer.row(layout, gpu.mem_gib * 2**30, 0.9, work.context)
    return Speed(sizer, Topology(gpu, gpus_per_node), work).perf(row)


def test_llama_70b_tp4_h100_by_hand():
    """Llama-3.1-70B (bf16) at TP 4 on H100, one sequence of 1024 + 1024 tokens."""
    p = bound("meta-llama/Llama-3.1-70B", Layout(4), H100, Workload(1024, 1024, 1))
    h, layers, inter, vocab, tp = 8192, 80, 28672, 128256, 4
    qkv, o, gate_up, down = (64 + 2 * 8) * 128 * h // tp, h * h // tp, 2 * inter * h // tp, inter * h // tp
    matmul = (qkv + o + gate_up + down) * layers + vocab * h // tp  # the lm_head; the embedding is not read
    weights = (matmul + 2 * h * layers + h) * 2  # + the norms, bf16
    context = 1024 + 1025 / 2  # a decode step's mean context over the output
    kv = 2 * (8 // tp) * 128 * 2 * layers * context  # K and V of 2 KV heads per GPU
    attention = 64 // tp * 2 * 128 * layers * context  # q.k and p.v per head per cached token
    ring = 2 * (tp - 1) / tp * h * 2
    assert p.terms["weights"] == pytest.approx(weights / 3.35e12 * 1e3, rel=1e-9)
    assert p.terms["kv"] == pytest.approx(kv / 3.35e12 * 1e3, rel=1e-9)
    assert p.terms["compute"] == pytest.approx(2 * (matmul + attention) / 989e12 * 1e3, rel=1e-9)
    assert p.terms["tp_all_reduce"] == pytest.approx((2 * layers * ring / 450e9 + 2 * layers * 2 * US) * 1e3)
    assert p.terms["embed_all_reduce"] == pytest.approx((ring / 450e9 + 2 * US) * 1e3)
    assert p.terms["logits_gather"] == pytest.approx((vocab * 2 * 3 / 4 / 450e9 + 2 * US) * 1e3)
    assert p.tpot_ms == pytest.approx(sum(p.terms.values()) - p.terms["compute"])  # memory-bound
    assert p.bottleneck[0] == "weights" and p.bottleneck_label.startswith("weights read, 9")
    assert p.batch == 1 and p.out_tok_s_per_gpu < 1e3 / p.tpot_ms / 4


def test_deepseek_v3_tp8_ep_h200_by_hand():
    """DeepSeek-V3 (FP8, 128 x 128 blocks, fp32 scales) at TP 8 + EP on H200, 16 sequences of 1024 + 1024."""
    b, tp, h = 16, 8, 7168
    p = bound("deepseek-ai/DeepSeek-V3", Layout(8, ep=True), H200, Workload(1024, 1024, b))
    blocks = lambda rows, cols: -(-rows // 128) * -(-cols // 128) * 4  # noqa: E731 - fp32 block scales
    fp8 = lambda rows, cols: (rows * cols, rows * cols + blocks(rows, cols))  # noqa: E731 (MACs, bytes)
    attn = [fp8(1536 + 576, h),  # fused_qkv_a_proj, whole on every GPU
            fp8(128 * 192 // tp, 1536), fp8(128 * 256 // tp, 512), fp8(h, 128 * 128 // tp)]
    dense = [fp8(2 * 18432 // tp, h), fp8(h, 18432 // tp)]
    shared = [fp8(2 * 2048 // tp, h), fp8(h, 2048 // tp)]
    norms = (1536 + 512 + 2 * h) * 2
    router = (256 * h, 256 * h * 2 + 256 * 4)  # bf16 gate and its float32 score bias
    head = (129280 // tp * h, 129280 // tp * h * 2 + h * 2)  # the lm_head and the final norm
    macs = (61 * sum(m for m, _ in attn) + 3 * sum(m for m, _ in dense) + 58 * (sum(m for m, _ in shared)
            + router[0]) + head[0])
    weights = (61 * (sum(x for _, x in attn) + norms) + 3 * sum(x for _, x in dense)
               + 58 * (sum(x for _, x in shared) + router[1]) + head[1])
    expert = fp8(2 * 2048, h)[1] + fp8(h, 2048)[1]  # one whole routed expert
    touched = 1 - (1 - 8 / 256) ** b
    context = 1024 + 1025 / 2
    hbm = 4.8e12
    assert p.terms["weights"] == pytest.approx(weights / hbm * 1e3, rel=1e-9)
    assert p.terms["experts"] == pytest.approx(256 // tp * expert * 58 * touched / hbm * 1e3, rel=1e-9)
    assert p.terms["kv"] == pytest.approx((512 + 64) * 2 * 61 * context * b / hbm * 1e3, rel=1e-9)
    expert_macs = b * 8 * (32 / 256) * (2 * 2048 * h + h * 2048) * 58
    attention = b * 128 // tp * (2 * 512 + 64) * 61 * context  # absorbed MLA over the latent
    assert p.terms["compute"] == pytest.approx((2 * (macs * b + expert_macs) / 1979e12
                                                + 2 * attention / 989e12) * 1e3, rel=1e-9)
    ring = 2 * 7 / 8 * h * 2 * b
    assert p.terms["tp_all_reduce"] == pytest.approx((64 * ring / 450e9 + 64 * 2 * US) * 1e3)
    assert p.terms["moe_all_reduce"] == pytest.approx((58 * ring / 450e9 + 58 * 2 * US) * 1e3)
    assert "moe_dispatch_combine" not in p.terms  # one replica: no dispatch
    assert p.bottleneck[0] == "experts" and not p.crosses


def test_cross_node_tp_is_marked_and_costed_at_the_scale_out_network():
    work = Workload(1024, 1024, 1)
    inside, across = (bound("meta-llama/Llama-3.1-70B", Layout(tp), H100, work) for tp in (8, 16))
    assert inside.crosses == [] and across.crosses == ["tp"]
    ring = 2 * 15 / 16 * 8192 * 2
    assert across.terms["tp_all_reduce"] == pytest.approx((160 * ring / 50e9 + 160 * 5 * US) * 1e3)
    # an HGX board's NVLink joins 8 GPUs however many a node has; an NVL72 rack joins 72 across its trays
    assert bound("meta-llama/Llama-3.1-70B", Layout(16), H100, work, gpus_per_node=16).crosses == ["tp"]
    gb = bound("meta-llama/Llama-3.1-70B", Layout(16), gpu_type("gb200"), work, gpus_per_node=4)
    assert gb.crosses == [] and Topology(gpu_type("gb200"), 4).scale_up == 72
    # PP across nodes: the hand-off crosses, not the TP groups
    assert bound("meta-llama/Llama-3.1-70B", Layout(8, 2), H100, work).crosses == ["pp"]


def test_ep_all_to_all_bytes_with_dp():
    spec = load_spec("deepseek-ai/DeepSeek-V3")
    [stage] = stage_traffic(spec, Layout(8, dp=2, ep=True))
    kinds = {t.kind: t for t in stage}
    h = 7168 * 2
    assert kinds["moe_dispatch_combine"].sent == 2 * (2 - 1) * h * 58  # all-gather + reduce-scatter
    assert kinds["moe_dispatch_combine"].count == 2 * 58 and kinds["moe_dispatch_combine"].group == "ep"
    [deepep] = stage_traffic(spec, Layout(8, dp=2, ep=True), all2all="deepep")
    sent = {t.kind: t.sent for t in deepep}["moe_dispatch_combine"]
    assert sent == pytest.approx(2 * 8 * h * 15 / 16 * 58)  # top-8 each way, 15 of 16 GPUs elsewhere
    assert "moe_dispatch_combine" not in {t.kind for t in stage_traffic(spec, Layout(8, ep=True))[0]}
    # replicas on two nodes: the EP group spans them
    p = bound("deepseek-ai/DeepSeek-V3", Layout(8, dp=2, ep=True), H200, Workload(1024, 1024, 64))
    assert "ep" in p.crosses and p.terms["moe_dispatch_combine"] > 0


def test_pipeline_stages_add_up_for_one_token():
    p = bound("meta-llama/Llama-3.1-70B", Layout(4, 2), H100, Workload(1024, 1024, 1))
    assert len(p.stage_terms) == 2
    steps = [max(t["weights"] + t["kv"], t["compute"]) + sum(v for k, v in t.items()
                                                                if k not in ("weights", "kv", "compute"))
             for t in p.stage_terms]
    assert p.tpot_ms == pytest.approx(sum(steps))
    flat = bound("meta-llama/Llama-3.1-70B", Layout(4), H100, Workload(1024, 1024, 1))
    assert p.tpot_ms > flat.tpot_ms  # a token walks both stages: PP never lowers TPOT


def test_the_ranking_follows_the_goal():
    """Llama-3.1-8B on 8 H100: the most tokens per GPU come from replicas (TP 2 x DP 4: TP 2 holds more KV
    per GPU than TP 1, so a larger batch), the lowest TPOT for one request from TP 8."""
    spec = load_spec("meta-llama/Llama-3.1-8B")
    firsts = []
    for goal, concurrency in (("throughput", None), ("latency", 1)):
        rows = rank_layouts(spec, 8, H100.mem_gib, topology=Topology(H100),
                            workload=Workload(1024, 1024, concurrency, goal))
        perfs = [r.perf for r in rows if r.perf]
        key = (lambda p: -p.out_tok_s_per_gpu) if goal == "throughput" else (lambda p: p.tpot_ms)
        assert perfs == sorted(perfs, key=key) and len(perfs) == 10  # every tp x pp x dp of 8
        firsts.append(rows[0].layout.label)
    assert firsts == ["TP 2 × PP 1 × DP 4", "TP 8 × PP 1 × DP 1"]


def test_a_tpot_limit_picks_the_largest_batch_within_it():
    spec = load_spec("meta-llama/Llama-3.1-8B")
    free = rank_layouts(spec, 1, H100.mem_gib, topology=Topology(H100), workload=Workload(128, 128))[0].perf
    limited = rank_layouts(spec, 1, H100.mem_gib, topology=Topology(H100),
                           workload=Workload(128, 128, tpot_ms=10))[0].perf
    assert limited.tpot_ms <= 10 < free.tpot_ms and limited.batch < free.batch and limited.meets
    # vLLM 0.33's default cap on an 80 GiB GPU: 1024 sequences per replica
    assert free.batch == 1024
    strict = rank_layouts(spec, 1, H100.mem_gib, topology=Topology(H100),
                          workload=Workload(128, 128, tpot_ms=0.5))[0].perf
    assert not strict.meets and strict.batch == 1


def test_catalog_and_custom_gpus():
    assert len(catalog()) >= 17
    assert all(g.source and g.hbm_gb_s and g.tflops["bf16"] for g in catalog().values())
    for name in ("a100-40", "a100-80", "h100", "h100-pcie", "h200", "h20", "b200", "b300", "gb200", "gb300",
                 "rtx-pro-6000", "l40s", "rtx-4090", "rtx-5090", "mi300x", "mi325x", "mi355x"):
        assert gpu_type(name.upper()).name == name
    g = gpu_type("custom:mem=80,hbm=3350,bf16=989,fp8=1979")
    assert g.peak("fp8") == 1979e12 and g.peak("fp4") == 989e12 and g.mem_gib == 80
    for bad, word in (("h300", "unknown GPU"), ("custom:mem=80", "needs hbm, bf16"),
                      ("custom:mem=80,hbm=x,bf16=1", "not a number"), ("custom:speed=1", "unknown key")):
        with pytest.raises(HardwareError, match=word):
            gpu_type(bad)
    with pytest.raises(HardwareError, match="gpus per node"):
        Topology(H100, 0)


@pytest.mark.parametrize("kwargs, word", [({"input_len": 0}, "input len"),
                                          ({"output_len": 1.5}, "output len"),
                                          ({"concurrency": 0}, "concurrency"), ({"goal": "cost"}, "goal"),
                                          ({"tpot_ms": -1}, "TPOT")])
def test_bad_workloads(kwargs, word):
    with pytest.raises(WorkloadError, match=word):
        Workload(**kwargs)


def test_plan_command_ranks_by_speed(capsys):
    assert main(["plan", "meta-llama/Llama-3.1-8B", "--gpus", "8", "--gpu", "h100", "--goal", "latency",
                 "--concurrency", "4", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["schema"] == "tpviz.plan/2" and out["gpu"] == "h100" and out["gpu_mem_gib"] == 79.6
    first = out["layouts"][0]
    assert set(first["perf"]) >= {"tpot_ms", "out_tok_s_per_gpu", "ttft_ms", "batch", "bottleneck", "terms"}
    assert first["launch"].startswith("vllm serve meta-llama/Llama-3.1-8B --tensor-parallel-size 8")
    assert out["workload"] == {"input_len": 1024, "output_len": 1024, "concurrency": 4, "goal": "latency",
                               "tpot_ms": None, "ttft_ms": None}
    assert main(["plan", "meta-llama/Llama-3.1-8B", "--gpus", "2", "--gpu", "b200", "--input-len", "2000",
                 "--output-len", "200"]) == 0
    text = capsys.readouterr().out
    assert "2,000 in + 200 out" in text and "bottleneck" in text and "a bound, not a promise" in text


@pytest.mark.parametrize("args, word", [
    (["--gpu", "h300"], "unknown GPU"), (["--gpu", "h100", "--concurrency", "lots"], "--concurrency"),
    (["--gpu", "h100", "--goal", "latency", "--concurrency", "max"], "--goal latency"),
    (["--gpu", "h100", "--context", "4096", "--input-len", "100"], "not both"),
    ([], "--gpu NAME"), (["--gpu-mem", "80", "--input-len", "100"], "add --gpu"),
    (["--gpu", "h100", "--tpot-ms", "0"], "TPOT limit"),
    (["--gpu", "h100", "--input-len", "200000"], "past this model's max_model_len 131,072")])
def test_plan_command_errors(capsys, args, word):
    assert main(["plan", "meta-llama/Llama-3.1-8B", "--gpus", "2", *args]) == 2
    err = capsys.readouterr().err
    assert word in err and err.count("\n") == 1


def test_sglang_attention_dp_traffic_at_its_least():
    """DeepSeek-V3 under SGLang 0.5.23 at --tp 8 --attn-dp-size 8: attention whole on each GPU (attn_tp 1, no
    all-reduce), every FFN layer gathers the other groups' tokens and scatters their sums back."""
    from tpviz.rules import ruleset
    spec, sglang = load_spec("deepseek-ai/DeepSeek-V3"), ruleset("sglang")
    assert stage_traffic(spec, Layout(8, attn_dp=8), sglang) is None  # no exact comm/token
    [stage] = stage_traffic(spec, Layout(8, attn_dp=8), sglang, least=True)
    kinds = {t.kind: t for t in stage}
    assert set(kinds) == {"dp_gather_scatter"}
    assert kinds["dp_gather_scatter"].sent == pytest.approx(2 * 7 / 8 * 7168 * 2 * 61)  # 58 MoE + 3 dense
    assert kinds["dp_gather_scatter"].count == 2 * 61
    [local] = stage_traffic(spec, Layout(8, attn_dp=8, dense_tp1=True), sglang, least=True)
    assert {t.kind: t.count for t in local} == {"dp_gather_scatter": 2 * 58}  # dense MLPs run locally
    [half] = stage_traffic(spec, Layout(8, attn_dp=2), sglang, least=True)
    assert {t.kind: t.count for t in half} == {"tp_all_reduce": 61, "dp_gather_scatter": 2 * 61}
    assert {t.kind: t.sent for t in half}["tp_all_reduce"] == pytest.approx(2 * 3 / 4 * 7168 * 2 * 61 / 2)
    sizer, gpu = Sizer(spec, sglang), H200
    row = sizer.row(Layout(8, attn_dp=8), gpu.mem_gib * 2**30, 0.9, 2048)
    p = Speed(sizer, Topology(gpu), Workload(1024, 1024, 64)).perf(row)
    flat = Speed(sizer, Topology(gpu), Workload(1024, 1024, 64)).perf(
        sizer.row(Layout(8), gpu.mem_gib * 2**30, 0.9, 2048))
    assert p.terms["kv"] == pytest.approx(flat.terms["kv"] / 8)  # each group caches its own sequences


def test_sglang_attention_tp_groups_inside_a_node_stay_on_nvlink():
    """--tp 16 --attn-dp-size 2 on nodes of 8: each attention group is one node's 8 GPUs, so its all-reduce
    runs at NVLink; the gather of every group's tokens spans both nodes."""
    from tpviz.rules import ruleset
    spec, sglang = load_spec("deepseek-ai/DeepSeek-V3"), ruleset("sglang")
    sizer = Sizer(spec, sglang)
    row = sizer.row(Layout(16, attn_dp=2), H100.mem_gib * 2**30, 0.9, 2048)
    p = Speed(sizer, Topology(H100), Workload(1024, 1024, 64)).perf(row)
    assert p.crosses == ["ep"]  # the gather and scatter, not the attention groups
    ring = 2 * 7 / 8 * 7168 * 2 * 64 / 2  # each group's 32 tokens
    assert p.terms["tp_all_reduce"] == pytest.approx((61 * ring / 450e9 + 61 * 2 * US) * 1e3)


def test_plan_command_ranks_both_engines_by_speed(capsys):
    assert main(["plan", "deepseek-ai/DeepSeek-V3", "--gpus", "8", "--gpu", "h200", "--rules", "vllm+sglang",
                 "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    engines = {row["engine"] for row in out["layouts"]}
    assert engines == {"vLLM 0.33", "SGLang 0.5.23"} and out["engine"] == "vLLM 0.33 + SGLang 0.5.23"
    fitting = [row for row in out["layouts"] if row["perf"]]
    speeds = [row["perf"]["out_tok_s_per_gpu"] for row in fitting]
    assert speeds == sorted(speeds, reverse=True) and {row["engine"] for row in fitting} == engines
    sglang = next(row for row in fitting if row["engine"] == "SGLang 0.5.23")
    assert sglang["launch"].startswith("python -m sglang.launch_server --model-path deepseek-ai/DeepSeek-V3")


def test_each_engine_caps_its_running_sequences():
    """vLLM 0.33: 1024 per replica on an 80 GiB H100, 256 on an A100; SGLang 0.5.23: 4096 per worker (each
    attention-DP rank is one)."""
    from tpviz.rules import ruleset
    vllm = ruleset("vllm")
    assert vllm.running_cap(H100) == 1024 and vllm.running_cap(gpu_type("a100-80")) == 256
    assert ruleset("sglang").running_cap(H100) == 4096
    spec = load_spec("meta-llama/Llama-3.1-8B")
    rows = rank_layouts(spec, 8, H200.mem_gib, "sglang", topology=Topology(H200), workload=Workload(128, 128))
    assert max(r.perf.batch for r in rows if r.perf and r.layout.dp == 1 and not r.layout.carved) <= 4096


def test_the_bound_says_what_it_leaves_out():
    from tpviz.deploy.perf import left_out
    assert left_out(load_spec("meta-llama/Llama-3.1-8B")) == "kernel launches, norms and sampling left out"
    assert "recurrent-state reads" in left_out(load_spec("Qwen/Qwen3-Next-80B-A3B-Thinking"))


def test_no_bound_where_not_one_sequence_fits():
    """Llama-3.1-70B at TP 2 on 80 GiB GPUs: the weights fit, but not one sequence of 128k tokens does."""
    spec = load_spec("meta-llama/Llama-3.1-70B")
    rows = rank_layouts(spec, 2, H100.mem_gib, topology=Topology(H100), workload=Workload(120_000, 8000))
    tp2 = next(r for r in rows if r.layout == Layout(2))
    assert tp2.fits and tp2.max_sequences == 0 and tp2.perf is None

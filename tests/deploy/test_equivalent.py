"""The same deployment in vLLM 0.33 and SGLang 0.5.23: spelled in the other engine's flags and accepted only
when every GPU holds the same bytes, experts and KV cache; compare pairs every layout of N GPUs."""
import json

import pytest

from tpviz import load_spec
from tpviz.cli.main import main
from tpviz.deploy.equivalent import compare, equivalent
from tpviz.rules import Layout

DS, QWEN = "deepseek-ai/DeepSeek-V3", "Qwen/Qwen3-30B-A3B"


@pytest.mark.parametrize("model, layout, rules, launch", [
    (DS, Layout(1, dp=8, ep=True), "vllm",
     "SGLANG_SHARED_EXPERT_TP1=1 python -m sglang.launch_server --model-path deepseek-ai/DeepSeek-V3 "
     "--tp-size 8 --attn-dp-size 8 --ep-size 8 --moe-dense-tp-size 1 --enable-dp-lm-head"),
    (QWEN, Layout(8, ep=True), "vllm", "python -m sglang.launch_server --model-path Qwen/Qwen3-30B-A3B "
                                       "--tp-size 8 --ep-size 8"),
    (QWEN, Layout(2, dp=4, ep=True), "vllm", "python -m sglang.launch_server --model-path Qwen/Qwen3-30B-A3B "
                                             "--tp-size 8 --attn-dp-size 4 --ep-size 8 --enable-dp-lm-head"),
    (QWEN, Layout(8, attn_dp=4, ep_size=8, dp_lm_head=True), "sglang",
     "vllm serve Qwen/Qwen3-30B-A3B --tensor-parallel-size 2 --data-parallel-size 4 "
     "--enable-expert-parallel"),
    ("meta-llama/Llama-3.1-8B", Layout(4, dp=2), "vllm",
     "python -m sglang.launch_server --model-path meta-llama/Llama-3.1-8B --tp-size 4 --dp-size 2"),
])
def test_equivalent_launch_lines(model, layout, rules, launch):
    assert equivalent(load_spec(model), layout, rules).launch == launch


@pytest.mark.parametrize("model, layout, rules, why", [
    (QWEN, Layout(8, ep_size=2), "sglang", "--ep 2 below --tp 8 cuts each expert 4 ways"),  # partial EP
    (QWEN, Layout(4, dp=2), "sglang", "SGLang's --dp-size replicas hold every expert each"),
    (DS, Layout(8, attn_dp=8, ep_size=8), "sglang", "the weights per GPU differ"),  # dense MLPs cut 8 ways
    (DS, Layout(4, pp=4), "vllm", "SGLANG_PP_LAYER_PARTITION=15,15,16,15 gives the same stages"),
    # vLLM's uneven EP: 128 experts over 6 GPUs; SGLang needs equal blocks
    (QWEN, Layout(2, dp=3, ep=True), "vllm", "does not divide the 128 routed experts"),
])
def test_no_equivalent_says_why(model, layout, rules, why):
    e = equivalent(load_spec(model), layout, rules)
    assert e.layout is None and why in e.line and "\n" not in e.line


def test_compare_pairs_every_layout_of_both_engines():
    pairs = compare(load_spec(QWEN), 8, 80.0)
    both = [(a.row.layout, b.row.layout) for a, b in pairs if a and b]
    assert (Layout(8, ep=True), Layout(8, ep_size=8)) in both
    sglang_only = {b.row.layout for a, b in pairs if a is None}
    assert Layout(8, ep_size=2) in sglang_only  # partial EP: no vLLM flags say it
    for a, b in pairs:
        if a and b:  # paired: the same bytes on the fullest GPU, the same KV room
            assert (a.row.weights, a.row.kv_tokens) == (b.row.weights, b.row.kv_tokens)


def test_compare_cli_and_json(capsys):
    assert main(["compare", QWEN, "--gpus", "4", "--gpu-mem", "80"]) == 0
    out = capsys.readouterr().out
    assert "vLLM 0.33" in out.splitlines()[1] and "SGLang 0.5.23" in out.splitlines()[1]
    assert main(["compare", QWEN, "--gpus", "4", "--gpu-mem", "80", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["schema"] == "tpviz.compare/1" and all(p["vllm"] or p["sglang"] for p in d["pairs"])
    assert any(p["sglang"] and p["sglang"]["launch"].startswith("python -m sglang") for p in d["pairs"])


def test_map_prints_the_other_engine(capsys):
    assert main(["map", QWEN, "--tp", "8", "--ep", "2", "--rules", "sglang"]) == 0
    assert capsys.readouterr().out.rstrip().splitlines()[-1].startswith("no vLLM 0.33 equivalent: --ep 2")
    assert main(["map", QWEN, "--tp", "4", "--ep", "3"]) == 2  # vLLM's EP spans tp x dp
    assert "an EP smaller than tp is SGLang's" in capsys.readouterr().err


def test_a_vision_tower_sglang_leaves_out_is_set_aside_and_said():
    """SGLang's map leaves the vision tower out (plan/tower.py): the engines are compared on the rest, and the
    line says so; a real difference in the rest still refuses (vLLM builds this model's embedding on every
    pipeline stage, SGLang's qwen3_moe.py decoder on the first alone)."""
    vl = load_spec("Qwen/Qwen3-VL-235B-A22B-Instruct")
    there = equivalent(vl, Layout(8), "vllm")
    assert there.launch.endswith("--tp-size 8") and "without the vision tower" in there.line
    assert equivalent(vl, Layout(8), "sglang").launch.endswith("--tensor-parallel-size 8")
    assert "the weights per GPU differ" in equivalent(vl, Layout(4, pp=2), "vllm").line
    assert equivalent(load_spec(QWEN), Layout(8), "vllm").caveat == ""  # no tower: nothing set aside
    pairs = compare(vl, 8, 141.0)
    paired = {a.row.layout: b for a, b in pairs if a and b}
    assert paired[Layout(8)].row.layout == Layout(8)
    a = next(a for a, b in pairs if a and a.row.layout == Layout(8))
    assert a.row.weights > paired[Layout(8)].row.weights  # vLLM's GPUs hold their slice of the tower too


def test_compare_of_a_tower_model_says_what_pairing_set_aside(capsys):
    assert main(["compare", "Qwen/Qwen3-VL-30B-A3B-Instruct", "--gpus", "4", "--gpu-mem", "80"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-1].startswith("pairs are checked GPU by GPU without the vision tower")
    assert main(["compare", QWEN, "--gpus", "4", "--gpu-mem", "80"]) == 0
    assert "vision tower" not in capsys.readouterr().out

"""The public failure reports per rule set (research quant.md sections 1.2-1.4, 2-4, 9): FP8 MoE slices that
miss the 128 block (refused by vLLM 0.28, refined to r x r blocks by 0.33), DeepSeek-V3's dense down_proj at
tp 32, merged layers that pass creation but cannot load, INT4 groups straddling GPUs, GPTQ act-order, and
`valid --json`."""
import json
import math

import pytest

from tpviz import shard_map
from tpviz.cli.main import main
from tpviz.errors import TPSizeError
from tpviz.config.sources import load_spec, presets
from tpviz.trace.validity import split_problem

PRESETS = presets()
FP8 = {"quant_method": "fp8", "weight_block_size": [128, 128], "activation_scheme": "dynamic", "fmt": "e4m3"}
CODER = {"model_type": "qwen3_moe", "hidden_size": 6144, "num_attention_heads": 96, "num_key_value_heads": 8,
         "head_dim": 128, "intermediate_size": 8192, "moe_intermediate_size": 2560, "num_experts": 160,
         "num_experts_per_tok": 8, "num_hidden_layers": 62, "vocab_size": 151936, "torch_dtype": "bfloat16",
         "quantization_config": FP8}  # Qwen3-Coder-480B-A35B-FP8's shape
GATE = "The output_size of gate's and up's weight = {} is not divisible by weight quantization block_n = 128."
ROW = "Weight input_size_per_partition = {} is not divisible by weight quantization block_k = 128."
COL = "Weight output_partition_size = {} is not divisible by weight quantization block_n = 128."
EXPERT = "model.layers.0.mlp.experts.0."


def layout(model, tp, rules):
    return split_problem(load_spec(model), tp, rules)


def refined(model, tp, rules, r):
    """Valid, with one warning naming both expert projections, the r x r blocks and the Triton MoE kernel."""
    problem, warnings = layout(model, tp, rules)
    assert problem is None and len(warnings) == 1, (problem, warnings)
    assert f"{r}×{r} blocks" in warnings[0] and "Triton MoE kernel" in warnings[0], warnings
    assert warnings[0].split(":")[0] == EXPERT + "gate_proj and down_proj"


# (model, tp, expert intermediate per GPU, gcd(128, 128, I_p, hidden) or None when the per-GPU size fits 128)
MOE = [("Qwen/Qwen3-235B-A22B-FP8", 4, 1536 // 4, None),  # 384 = 3 x 128
       ("Qwen/Qwen3-235B-A22B-FP8", 8, 1536 // 8, 64),  # 192; gcd(128, 192, 4096) = 64
       ("Qwen/Qwen3-30B-A3B-FP8", 2, 768 // 2, None),
       ("Qwen/Qwen3-30B-A3B-FP8", 4, 768 // 4, 64),  # 192; gcd(128, 192, 2048) = 64
       ("Qwen/Qwen3-30B-A3B-FP8", 8, 768 // 8, 32),  # 96; gcd(128, 96, 2048) = 32, still >= 32
       (CODER, 4, 2560 // 4, None),  # 640 = 5 x 128
       (CODER, 8, 2560 // 8, 64)]  # 320; gcd(128, 320, 6144) = 64


@pytest.mark.parametrize("model, tp, per_gpu, r", MOE)
def test_fp8_moe_block_per_rule_set(model, tp, per_gpu, r):
    hidden = (model if isinstance(model, dict) else PRESETS[model])["hidden_size"]
    assert r == (None if per_gpu % 128 == 0 else math.gcd(128, per_gpu, hidden))
    if r is None:  # fits the block: valid under both vLLM rule sets, with nothing to warn about
        assert layout(model, tp, "vllm") == layout(model, tp, "vllm-0.28") == (None, [])
        return
    problem, warnings = layout(model, tp, "vllm-0.28")  # vLLM <= 0.28 refuses in Fp8MoEMethod.create_weights
    assert problem.startswith(EXPERT + "gate_proj") and GATE.format(per_gpu) in problem and not warnings
    refined(model, tp, "vllm", r)  # vLLM >= 0.29 refines the scale blocks (Triton MoE only)


def test_qwen3_235b_fp8_tp8_report_text():
    problem, _ = layout("Qwen/Qwen3-235B-A22B-FP8", 8, "vllm-0.28")
    assert ("The output_size of gate's and up's weight = 192 is not divisible by weight "
            "quantization block_n = 128."
            in problem) and "model.layers.0.mlp.experts" in problem and "\n" not in problem
    with pytest.raises(TPSizeError, match="= 192 is not divisible"):  # shard_map refuses with the same line
        shard_map("Qwen/Qwen3-235B-A22B-FP8", 8, "vllm-0.28")
    m = shard_map("Qwen/Qwen3-235B-A22B-FP8", 8)
    assert m.warnings == layout("Qwen/Qwen3-235B-A22B-FP8", 8, "vllm")[1]


def test_qwen3_30b_tp16_too_small_for_any_refinement():
    # 768/16 = 48: gcd(128, 48, 2048) = 16 < 32, so even vLLM 0.33 refuses
    for rules in ("vllm", "vllm-0.28"):
        problem, warnings = layout("Qwen/Qwen3-30B-A3B-FP8", 16, rules)
        assert GATE.format(48) in problem and not warnings


def test_compressed_tensors_fp8_moe_never_refines():
    # compressed-tensors FP8-block MoE calls validate_fp8_block_shape_moe directly: no refine in any version
    ct = {"quant_method": "compressed-tensors", "config_groups": {"g": {"targets": ["Linear"], "weights": {
        "num_bits": 8, "type": "float", "strategy": "block", "block_structure": [128, 128]}}}}
    model = {**PRESETS["Qwen/Qwen3-235B-A22B-FP8"], "quantization_config": ct}
    for rules in ("vllm", "vllm-0.28"):
        problem, warnings = layout(model, 8, rules)
        assert GATE.format(192) in problem and not warnings


@pytest.mark.parametrize("rules", ["vllm", "vllm-0.28"])
def test_deepseek_v3_tp32_dense_down_proj(rules):
    # 18432/32 = 576 = 4.5 blocks of 128; the merged gate_up is skipped at creation, so down_proj raises first
    problem, _ = layout("deepseek-ai/DeepSeek-V3", 32, rules)
    assert problem.startswith("model.layers.0.mlp.down_proj") and ROW.format(576) in problem
    # 1152 = 9 blocks, experts 2048/16 = 128
    assert layout("deepseek-ai/DeepSeek-V3", 16, rules) == (None, [])


def dense(block, inter, head_dim=128, heads=8, kv=8):
    return {"model_type": "llama", "hidden_size": heads * head_dim, "num_attention_heads": heads,
            "num_key_value_heads": kv, "head_dim": head_dim, "intermediate_size": inter, "vocab_size": 256,
            "num_hidden_layers": 1, "quantization_config": {**FP8, "weight_block_size": block}}


@pytest.mark.parametrize("rules, engine", [("vllm", "vLLM 0.33"), ("vllm-0.28", "vLLM 0.28")])
def test_dense_merged_fp8_passes_creation_but_fails_loading(rules, engine):
    # 1536/8 = 192 rows of gate (and of up) per GPU; block [128, 64] keeps down_proj's 192 columns whole (3 x
    # 64)
    problem, warnings = layout(dense([128, 64], 1536), 8, rules)
    assert (problem.startswith("model.layers.0.mlp.gate_proj: ")
            and COL.format(192) in problem and not warnings)
    assert f"{engine} skips this check for merged layers" in problem and "loading fails" in problem
    with pytest.raises(TPSizeError, match="skips this check"):
        shard_map(dense([128, 64], 1536), 8, rules)
    # q/k/v: head_dim 64 with 8 KV heads at tp 8 leaves 64 rows of k per GPU
    problem, _ = layout(dense([128, 128], 2048, head_dim=64, heads=32), 8, rules)
    assert problem.startswith("model.layers.0.self_attn.q_proj: ") and COL.format(64) in problem


def test_nano_vllm_checks_merged_layers_at_creation():
    problem, _ = layout(dense([128, 64], 1536), 8, "nano-vllm")
    assert problem == "model.layers.0.mlp.gate_proj at tp_size=8: " + COL.format(192)


@pytest.mark.parametrize("rules", ["vllm", "vllm-0.28"])
def test_create_time_error_comes_before_load_time(rules):
    # gate_up (checked earlier, fails only at load) and down_proj (fails at creation) both miss the block:
    # vLLM stops at down_proj's constructor before any weight is loaded
    first = f"model.layers.0.mlp.down_proj at tp_size=8: {ROW.format(192)}"
    assert layout(dense([128, 128], 1536), 8, rules)[0] == first
    # q/k/v fails at load as well
    problem, _ = layout(dense([128, 128], 1536, head_dim=64, heads=32), 8, rules)
    assert problem.startswith("model.layers.0.mlp.down_proj at tp_size=8") and ROW.format(192) in problem


def test_compressed_tensors_fp8_block_merged_layers_are_checked():
    # only Fp8Config has weight_block_size, so compressed-tensors merged layers still get the create-time
    # check
    ct = {"quant_method": "compressed-tensors", "config_groups": {"g": {"targets": ["Linear"], "weights": {
        "num_bits": 8, "type": "float", "strategy": "block", "block_structure": [128, 128]}}}}
    model = {**dense([128, 128], 2048, head_dim=64, heads=32), "quantization_config": ct}
    assert layout(model, 8, "vllm")[0] == "model.layers.0.self_attn.q_proj at tp_size=8: " + COL.format(64)


GPTQ13 = PRESETS["TheBloke/Llama-2-13B-chat-GPTQ"]
INT4 = [(GPTQ13["quantization_config"],
         "in_features per partition 1728 is not divisible by group_size = 128"),
        ({"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True, "version": "gemm"},
         "The input size is not aligned with the quantized weight shape"),
        ({"quant_method": "compressed-tensors", "format": "pack-quantized", "config_groups": {"g": {
            "targets": ["Linear"], "format": "pack-quantized", "weights": {
                "num_bits": 4, "type": "int", "strategy": "group", "group_size": 128, "symmetric": True}}}},
         "input_size_per_partition=1728 is not divisible by group_size=128")]


@pytest.mark.parametrize("q, message", INT4)
@pytest.mark.parametrize("rules", ["vllm", "vllm-0.28"])
def test_int4_group_straddling_gpus(q, message, rules):
    model = {**GPTQ13, "quantization_config": q}
    # down_proj: 13824/8 = 1728 = 13.5 groups of 128; o_proj 5120/8 = 640 = 5 groups is fine
    problem, _ = layout(model, 8, rules)
    assert problem.startswith("model.layers.0.mlp.down_proj at tp_size=8") and message in problem
    for tp in (1, 2, 4):  # 13824/4 = 3456 = 27 groups
        assert layout(model, tp, rules) == (None, [])


def test_gptq_act_order_refused_by_vllm_033_only():
    model = {**GPTQ13, "quantization_config": {**GPTQ13["quantization_config"], "desc_act": True}}
    for tp in (1, 2, 4, 8):
        problem, _ = layout(model, tp, "vllm")
        assert "desc_act=True" in problem and "no longer supported" in problem
    assert [layout(model, tp, "vllm-0.28")[0] for tp in (1, 2, 4)] == [None] * 3
    assert "desc_act" not in layout(model, 8, "vllm-0.28")[0]  # there only the group straddling fails


def test_valid_json(capsys):
    assert main(["valid", "Qwen/Qwen3-235B-A22B-FP8", "--json", "--max-tp", "16"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["schema"] == "tpviz.valid/1" and set(out["rules"]) == {"vllm", "vllm-0.28",
                                                                      "sglang", "nano-vllm"}
    rows = {row["tp"]: row for row in out["rows"]}
    assert sorted(rows) == list(range(1, 17))
    assert all(set(rows[tp][r]) == {"valid", "problem", "warnings"} for tp in rows for r in out["rules"])
    assert all(rows[tp][r]["valid"] == (rows[tp][r]["problem"] is None) for tp in rows for r in out["rules"])
    assert rows[4]["vllm"] == rows[4]["vllm-0.28"] == {"valid": True, "problem": None, "warnings": []}
    assert rows[8]["vllm"]["valid"] and all("64×64" in w for w in rows[8]["vllm"]["warnings"])
    assert not rows[8]["vllm-0.28"]["valid"] and GATE.format(192) in rows[8]["vllm-0.28"]["problem"]
    # 1536/16 = 96: gcd(128, 96, 4096) = 32 still refines under 0.33
    assert rows[16]["vllm"]["valid"] and all("32×32" in w for w in rows[16]["vllm"]["warnings"])
    assert GATE.format(96) in rows[16]["vllm-0.28"]["problem"]
    # 64 heads / 3
    assert not rows[3]["vllm"]["valid"] and "num_attention_heads" in rows[3]["vllm"]["problem"]


def test_valid_json_act_order(capsys, tmp_path):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({**GPTQ13, "quantization_config": {**GPTQ13["quantization_config"],
                                                                 "desc_act": True}}))
    assert main(["valid", str(cfg), "--json", "--max-tp", "4"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert [row["vllm"]["valid"] for row in rows] == [False] * 4
    assert [row["vllm-0.28"]["valid"] for row in rows] == [True, True, False, True]  # tp 3: 40 heads


def test_refined_scale_grid_size():
    # 192 rows per GPU on 64x64 blocks: 2*3 rows, 4096/64 = 64 cols
    m = shard_map("Qwen/Qwen3-235B-A22B-FP8", 8)
    shapes = {p.name.split("experts.*.")[1]: p.local_shapes[0] for p in m.params
              if "scale_inv" in p.name and "experts" in p.name}
    assert shapes == {"gate_up_proj.weight_scale_inv": [6, 64], "down_proj.weight_scale_inv": [64, 3]}


def test_vllm_028_act_order_scales_whole_on_row_layers():
    model = {**GPTQ13, "num_hidden_layers": 1,
             "quantization_config": {**GPTQ13["quantization_config"], "desc_act": True}}
    m = shard_map(model, 2, "vllm-0.28")
    assert m.tensor("model.layers.*.mlp.down_proj.scales").split_dim is None
    assert m.tensor("model.layers.*.mlp.down_proj.g_idx").split_dim == 0


def test_merged_block_scales_that_overlap_fail_at_tp1_too():
    """vLLM skips the create-time block check for merged layers, and its loader places each part's scales at
    ceil(offset / 128): q, k and v parts that are not whole blocks overrun the scale rows at tp=1 as well. The
    valid table says so before a view is traced (found by the app fuzz test: head_dim 1)."""
    from tpviz.plan.quantized import misaligned_scales
    assert misaligned_scales([64, 4, 4], 128) and misaligned_scales([128, 4, 4], 128)
    assert not misaligned_scales([128, 64], 128) and not misaligned_scales([8192, 1024, 1024], 128)
    cfg = dict(PRESETS["Qwen/Qwen3-235B-A22B-FP8"], head_dim=1)
    problem = split_problem(load_spec(cfg), 1)[0]
    assert "the merged parts [64, 4, 4] are not whole FP8 blocks of 128 rows" in problem
    with pytest.raises(TPSizeError, match="not whole FP8 blocks"):
        shard_map(cfg, 1)


def test_fused_moe_block_scales_give_gate_and_up_their_own_rows(shard_map_invariants):
    """An expert 96 wide is no whole 128 block even at tp=1: vLLM 0.33 refines the scales to 32 x 32 blocks,
    so w13's scale has 2 x 96 / 32 rows, gate's three copies of its one checkpoint row first, then up's."""
    cfg = dict(PRESETS["Qwen/Qwen3-235B-A22B-FP8"], moe_intermediate_size=96)
    m = shard_map(cfg, 1)
    shard_map_invariants(m)
    tensors = {t["name"]: t for t in m.to_dict()["tensors"]}
    scale = "model.layers.*.mlp.experts.*.{}_proj.weight_scale_inv"
    rows = {part: [p["param_start"] for p in tensors[scale.format(part)]["pieces"]]
            for part in ("gate", "up")}
    assert rows == {"gate": [0, 1, 2], "up": [3, 4, 5]}
    assert {p.name: p.local_shapes for p in m.params}[scale.format("gate_up")] == [[6, 128]]


@pytest.mark.parametrize("inter,vllm,sglang", [
    (1, "= 1 is not divisible by weight quantization block_n = 128", "= 1 is not divisible"),
    (96, 32, "The output_size of gate's and up's weight = 96 is not divisible by weight quantization "
             "block_n = 128.")])
def test_the_experts_block_check_holds_at_tp_1_too(inter, vllm, sglang):
    """Both engines check the experts' width against the FP8 block when the MoE layer is built, at any tp
    (vLLM 0.33 oracle/fp8.py refine_fp8_moe_block_shape and validate_fp8_block_shape_moe; SGLang's
    Fp8MoEMethod.create_weights): only block_k waits for tp > 1. A fuzzed width of 1 once mapped at tp 1."""
    spec = load_spec({**PRESETS["Qwen/Qwen3-235B-A22B-FP8"], "moe_intermediate_size": inter})
    problem, warnings = split_problem(spec, 1, "vllm")
    if isinstance(vllm, int):  # gcd(128, 128, 96, 4096) = 32: refined
        assert problem is None and f"{vllm}×{vllm} blocks" in warnings[0]
    else:
        assert vllm in problem
    assert sglang in split_problem(spec, 1, "sglang")[0]

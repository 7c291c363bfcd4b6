"""Quantized layouts worked out by hand from vLLM 0.33's parameter classes (research quant.md sections 0-6):
FP8 block / per-tensor, GPTQ, AWQ, compressed-tensors W4A16, ModelOpt NVFP4 and gpt-oss MXFP4 at tp 1-16.
Published checkpoint sizes, real safetensors folders and malformed quantization_config:
test_quant_configs.py."""
from types import SimpleNamespace

import pytest

from tpviz import shard_map
from tpviz.plan import build_plan
from tpviz.config.sources import load_spec
from tpviz.trace.tracer import trace_plan
from tests.helpers.quant import AWQ, BLOCK, CT, GPTQ, NVFP4, A, L, llama

TPS = (1, 2, 4, 8)
ROW_LAYERS = (f"{A}o_proj", f"{L}down_proj")
# each projection's slot in its merged parameter: q/k/v 0/1/2, gate/up 0/1, o and down alone
SLOTS = {f"{A}q_proj": 0, f"{A}k_proj": 1, f"{A}v_proj": 2, f"{A}o_proj": 0,
         f"{L}gate_proj": 0, f"{L}up_proj": 1, f"{L}down_proj": 0}


def got(m, name):
    return [(p.rank, p.start, p.stop, p.param_start) for p in m.tensor(name).pieces]


def even(n, tp, at=0):
    """n units cut in tp equal runs, each landing at local offset `at`."""
    return [(r, r * n // tp, (r + 1) * n // tp, at) for r in range(tp)]


def kv(n, tp, at):
    """k or v with 2 KV heads of n/2 units: tp <= 2 splits them, tp 4 / 8 gives rank r head r // (tp / 2)."""
    size, reps = n // min(tp, 2), max(1, tp // 2)
    return [(r, r // reps * size, (r // reps + 1) * size, at) for r in range(tp)]


def mapped(q, tp, invariants):
    """The map of llama(q) at tp, checked by conftest's invariants: every row covered once (KV replicas
    aside)."""
    m = shard_map(llama(q), tp)
    invariants(m)
    return m


def check_merged_column(m, tp, suffix, n_q, n_kv, n_gate):
    """q/k/v and gate/up pieces in a tensor's own units along N (n_*: units of the whole projection)."""
    q_p, kv_p, g_p = n_q // tp, n_kv // min(tp, 2), n_gate // tp
    assert got(m, f"{A}q_proj.{suffix}") == even(n_q, tp)
    assert got(m, f"{A}k_proj.{suffix}") == kv(n_kv, tp, q_p)
    assert got(m, f"{A}v_proj.{suffix}") == kv(n_kv, tp, q_p + kv_p)
    assert got(m, f"{L}gate_proj.{suffix}") == even(n_gate, tp)
    assert got(m, f"{L}up_proj.{suffix}") == even(n_gate, tp, g_p)


def check_row_parallel(m, tp, dim, **units):
    """o_proj and down_proj cut K, tensor dim `dim`: each suffix in tp equal runs of its `units` along K."""
    for name in ROW_LAYERS:
        for suffix, n in units.items():
            t = f"{name}.{suffix}"
            assert (m.tensor(t).split_dim, got(m, t)) == (dim, even(n, tp)), t


def check_scalar_slots(m, tp, suffix, projections=SLOTS):
    """A per-tensor scalar [1] on every GPU, unsplit, in its projection's slot (k: slot 1)."""
    for name in projections:
        t = m.tensor(f"{name}.{suffix}")
        want = [(r, 0, 1, SLOTS[name]) for r in range(tp)]
        assert (t.shape, t.split_dim, got(m, t.name)) == ([1], None, want), t.name


@pytest.mark.parametrize("tp", TPS)
def test_fp8_block_scales_follow_block_rows_and_columns(tp, shard_map_invariants):
    m = mapped(BLOCK, tp, shard_map_invariants)
    # weight [N, K] is cut exactly like the unquantized weight; the scale grid [N/128, K/128] in whole blocks
    check_merged_column(m, tp, "weight", 1024, 256, 1024)
    check_merged_column(m, tp, "weight_scale_inv", 8, 2, 8)  # q 1024 rows = 8 block rows, k/v 256 = 2
    # row-parallel: K cut, in block columns for scales
    check_row_parallel(m, tp, 1, weight=1024, weight_scale_inv=8)
    assert m.tensor(f"{A}k_proj.weight_scale_inv").shape == [2, 8]
    linear = [p for p in m.params if "layers" in p.name and "norm" not in p.name]
    assert {p.name.rsplit(".", 1)[1]: p.element_bytes for p in linear} == {"weight": 1, "weight_scale_inv": 4}
    # per GPU: embed+lm_head 2*(256/tp)*1024*2, 3 norms 1024*2, fp8 qkv rows x 1024, their f32 grid rows x 8;
    # o, gate, up, down: a 1024x1024/tp fp8 slice and 64/tp f32 scales each
    kv_rows = 256 // min(tp, 2)
    rank = (2 * 256 // tp * 1024 * 2 + 3 * 2048 + (1024 // tp + 2 * kv_rows) * 1024
            + (8 // tp + 2 * kv_rows // 128) * 8 * 4 + 4 * 1024 * 1024 // tp + 4 * (64 // tp) * 4)
    assert [r.weight_bytes for r in m.ranks] == [rank] * tp
    # whole model: embed+lm_head 1048576, norms 6144, 5632x1024 fp8, grids (12+8+16+8)x8 f32
    assert m.total_weight_bytes == 1048576 + 6144 + 5767168 + 352 * 4 == 6823296 and not m.warnings


def test_fp8_block_tp4_by_hand():
    m = shard_map(llama(BLOCK), 4)  # 2 KV heads on 4 GPUs: GPUs 0,1 hold KV head 0, GPUs 2,3 head 1
    assert got(m, f"{A}k_proj.weight_scale_inv") == [(0, 0, 1, 2), (1, 0, 1, 2), (2, 1, 2, 2), (3, 1, 2, 2)]
    assert got(m, f"{A}v_proj.weight_scale_inv") == [(0, 0, 1, 3), (1, 0, 1, 3), (2, 1, 2, 3), (3, 1, 2, 3)]
    assert got(m, f"{L}up_proj.weight_scale_inv") == [(0, 0, 2, 2), (1, 2, 4, 2), (2, 4, 6, 2), (3, 6, 8, 2)]
    assert next(p for p in m.params if p.name == f"{A}qkv_proj.weight_scale_inv").local_shapes == [[4, 8]] * 4
    assert m.ranks[0].weight_bytes == 1841536


@pytest.mark.parametrize("q, inputs", [({"quant_method": "fp8", "activation_scheme": "dynamic"}, False),
                                       ({"quant_method": "modelopt", "quant_algo": "FP8"}, True)])
@pytest.mark.parametrize("tp", TPS)
def test_fp8_per_tensor_scales_replicated_one_slot_per_projection(q, inputs, tp, shard_map_invariants):
    m = mapped(q, tp, shard_map_invariants)
    check_merged_column(m, tp, "weight", 1024, 256, 1024)
    for suffix in ("weight_scale", "input_scale") if inputs else ("weight_scale",):
        check_scalar_slots(m, tp, suffix)
    assert (f"{A}k_proj.input_scale" in {t.name for t in m.tensors}) == inputs  # fp8 dynamic: no input scale
    shapes = {p.name: p.local_shapes for p in m.params}
    assert (shapes[f"{A}qkv_proj.weight_scale"] == [[3]] * tp
            and shapes[f"{L}gate_up_proj.weight_scale"] == [[2]] * tp)
    # 5632x1024 fp8 weights + bf16 embed/lm_head/norms + 7 f32 slots (x2 with input scales)
    assert m.total_weight_bytes == 5767168 + 1048576 + 6144 + 28 * (2 if inputs else 1)


# GPTQ packs along K: qweight [K/8, N], scales [K/128, N], qzeros [K/128, N/8]; AWQ along N: qweight [K, N/8],
# qzeros [K/128, N/8], scales [K/128, N]. Column layers cut N (dim 1) in each tensor's units (q, k/v, gate),
# row layers K (dim 0); `shapes`: some column tensors' whole shapes.
INT4 = {"gptq": (GPTQ, {"qweight": (1024, 256, 1024), "scales": (1024, 256, 1024), "qzeros": (128, 32, 128)},
                 {"qweight": 128, "scales": 8, "qzeros": 8}, {f"{A}q_proj.qweight": [128, 1024],
                                                               f"{A}k_proj.qzeros": [8, 32]}),
        "awq": (AWQ, {"qweight": (128, 32, 128), "qzeros": (128, 32, 128), "scales": (1024, 256, 1024)},
                {"qweight": 1024, "qzeros": 8, "scales": 8}, {f"{A}k_proj.qweight": [1024, 32]})}


@pytest.mark.parametrize("q, columns, rows, shapes", INT4.values(), ids=INT4)
@pytest.mark.parametrize("tp", TPS)
def test_gptq_and_awq_packing(q, columns, rows, shapes, tp, shard_map_invariants):
    m = mapped(q, tp, shard_map_invariants)
    for suffix, units in columns.items():
        check_merged_column(m, tp, suffix, *units)
    assert ({n: (m.tensor(n).shape, m.tensor(n).split_dim) for n in shapes}
            == {n: (s, 1) for n, s in shapes.items()})
    check_row_parallel(m, tp, 0, **rows)
    # sum(N*K) = 5632*1024: int4 = /2 bytes; bf16 scales 8*5632*2; int32 zeros 8*704*4; + embed, lm_head,
    # norms: the same bytes for GPTQ and AWQ, packed the other way
    assert m.total_weight_bytes == 2883584 + 90112 + 22528 + 1048576 + 6144 == 4050944


def ct_tensors(tp):
    """compressed-tensors tensors traced plan by plan, looked up by name like a map's (m.tensor)."""
    out = {}
    for plan in build_plan(load_spec(llama(CT)), "vllm"):
        for t in trace_plan(plan, tp)[0]:
            out[t.name] = t
    return SimpleNamespace(tensor=out.__getitem__)


@pytest.mark.parametrize("tp", TPS)
def test_compressed_tensors_w4a16_layout(tp):
    ts = ct_tensors(tp)
    # weight_packed [N, K/8] and weight_scale [N, K/128]: column layers cut N rows like an unquantized weight
    for s in ("weight_packed", "weight_scale"):
        check_merged_column(ts, tp, s, 1024, 256, 1024)
    assert (ts.tensor(f"{A}q_proj.weight_packed").shape, ts.tensor(f"{A}q_proj.weight_scale").shape) == (
        [1024, 128], [1024, 8])
    # row layers cut K: 128 packed, 8 group columns
    check_row_parallel(ts, tp, 1, weight_packed=128, weight_scale=8)
    for name in (f"{A}k_proj", f"{L}down_proj"):  # weight_shape [2] whole on every GPU
        assert ts.tensor(f"{name}.weight_shape").split_dim is None
        assert got(ts, f"{name}.weight_shape") == [(r, 0, 2, 0) for r in range(tp)]


def test_compressed_tensors_w4a16_shard_map():
    m = shard_map(llama(CT), 2)
    assert [r.kv_heads for r in m.ranks] == [[0], [1]]
    # int4 2883584 + bf16 scales 90112 + 4 int64 weight_shape params 64 + embed/lm_head 1048576 + norms 6144
    assert m.total_weight_bytes == 4028480


@pytest.mark.parametrize("tp", TPS)
def test_modelopt_nvfp4_layout(tp, shard_map_invariants):
    m = mapped(NVFP4, tp, shard_map_invariants)
    # weight [N, K/2] uint8 and weight_scale [N, K/16] fp8 are cut like weights; scale_2 / input_scale per
    # slot
    check_merged_column(m, tp, "weight", 1024, 256, 1024)
    check_merged_column(m, tp, "weight_scale", 1024, 256, 1024)
    assert (m.tensor(f"{A}q_proj.weight").shape,
            m.tensor(f"{A}q_proj.weight_scale").shape) == ([1024, 512], [1024, 64])
    check_row_parallel(m, tp, 1, weight=512, weight_scale=64)
    for s in ("weight_scale_2", "input_scale"):
        check_scalar_slots(m, tp, s)
    # 5632*1024/2 fp4 bytes + 5632*64 fp8 scales + 7 slots x 2 f32 scalars + embed/lm_head + norms
    assert m.total_weight_bytes == 2883584 + 360448 + 56 + 1048576 + 6144


@pytest.mark.parametrize("tp, rows", [(1, [2880]), (2, [1440, 1440]), (4, [736, 736, 736, 672]),
                                      (8, [384] * 7 + [192]), (16, [192] * 15 + [0])])
def test_mxfp4_rows_per_gpu(tp, rows, shard_map_invariants):
    # P = ceil((2880/32)/tp)*32 rows per GPU, the last GPUs get the rest (or nothing)
    m = shard_map("openai/gpt-oss-120b", tp)
    shard_map_invariants(m)
    e = "model.layers.*.mlp.experts."
    starts = [sum(rows[:r]) for r in range(tp)]

    def want(unit):
        return [(r, int(s / unit), int((s + n) / unit), 0) for r, (s, n) in enumerate(zip(starts, rows)) if n]
    # gate and up interleaved: 2 rows per intermediate row
    assert got(m, f"{e}gate_up_proj_blocks") == want(0.5)
    assert got(m, f"{e}gate_up_proj_scales") == want(0.5) and got(m, f"{e}gate_up_proj_bias") == want(0.5)
    assert got(m, f"{e}down_proj_blocks") == want(2)  # columns are bytes: 2 fp4 per byte
    assert got(m, f"{e}down_proj_scales") == want(32)  # one E8M0 scale per 32 values
    bias = m.tensor(f"{e}down_proj_bias")
    # rank 0 only; the all-reduce adds it once
    assert (bias.split_dim, got(m, bias.name)) == (None, [(0, 0, 2880, 0)])
    alloc = -(-2880 // tp // 64) * 64  # allocated: 2880/tp rounded up to Triton's 64
    gate_up = next(p for p in m.params if p.name.endswith("gate_up_proj_blocks"))
    assert gate_up.padding == [2 * (alloc - n) for n in rows]

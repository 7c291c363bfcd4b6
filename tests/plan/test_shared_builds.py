"""plan/core.py's shared builds: a layer's weight and bias plans reuse one module per rank, per thread, so two
traces of one cached plan at once (app sessions are threads sharing a Sizer's plans) never fill the same
parameter, and neither reads the other's tp."""
import threading

from tpviz.config.sources import load_spec
from tpviz.plan import build_plan
from tpviz.trace.tracer import trace_plan


def pieces(plan, tp: int) -> list:
    tensors, param = trace_plan(plan, tp)
    pieces = [[(p.rank, p.start, p.stop, p.param_start) for p in t.pieces] for t in tensors]
    return pieces + [param.local_shapes]


def test_weight_and_bias_share_a_module_on_one_thread_only():
    plans = {p.name: p for p in build_plan(load_spec("Qwen/Qwen2.5-VL-7B-Instruct"))}
    weight, bias = plans["visual.blocks.*.attn.qkv.weight"], plans["visual.blocks.*.attn.qkv.bias"]
    assert weight.build(2, 1)[0] is bias.build(2, 1)[0]  # one module for both
    other = []
    threading.Thread(target=lambda: other.append(weight.build(2, 1)[0])).start()
    while not other:
        pass
    assert other[0] is not weight.build(2, 1)[0]  # another thread builds its own


def test_concurrent_traces_of_one_plan_at_other_tps_agree_with_sequential_ones():
    plans = [p for p in build_plan(load_spec("Qwen/Qwen2.5-VL-7B-Instruct")) if p.split and p.tower]
    expected = {(p.name, tp): pieces(p, tp) for p in plans for tp in (2, 4)}
    got, errors = {}, []

    def run(tp: int):
        try:
            for _ in range(3):
                for p in plans:
                    got.setdefault((p.name, tp), []).append(pieces(p, tp))
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)
    threads = [threading.Thread(target=run, args=(tp,)) for tp in (2, 4, 2, 4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(got) == len(expected)
    assert all(all(r == expected[key] for r in runs) for key, runs in got.items())

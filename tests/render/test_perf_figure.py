"""The speed bound's terms figure: a bar per term for each stage, the TPOT in its title."""
import pytest

from tpviz.config.sources import load_spec
from tpviz.deploy.hardware import Topology, gpu_type
from tpviz.deploy.perf import Speed, Workload
from tpviz.deploy.sizing import Sizer
from tpviz.render.plots.perf import terms_figure
from tpviz.rules import Layout


def test_terms_figure_has_a_bar_group_per_stage():
    sizer, gpu = Sizer(load_spec("meta-llama/Llama-3.1-70B")), gpu_type("h100")
    row = sizer.row(Layout(4, 2), gpu.mem_gib * 2**30, 0.9, 2048)
    p = Speed(sizer, Topology(gpu), Workload(1024, 1024, 8)).perf(row)
    fig = terms_figure(p.stage_terms, "TP 4 × PP 2 × DP 1", p.tpot_ms, "a bound")
    assert [b.name for b in fig.data] == ["stage 0", "stage 1"]
    assert "weights read" in fig.data[0].y and "PP hand-off" in fig.data[0].y
    assert fig.data[1].x[list(fig.data[1].y).index("logits gather (per sampled token)")] > 0
    assert fig.data[0].x[list(fig.data[0].y).index("logits gather (per sampled token)")] == 0  # last stage's
    assert f"{p.tpot_ms:.2f} ms" in fig.layout.title.text


def test_the_device_grid_carries_each_stages_step_bound():
    from tpviz.deploy.deployment import deploy
    from tpviz.render.plots.deployment import device_grid
    sizer, gpu = Sizer(load_spec("meta-llama/Llama-3.1-70B")), gpu_type("h100")
    p = Speed(sizer, Topology(gpu), Workload(1024, 1024, 8)).perf(sizer.row(Layout(4, 2), gpu.mem_gib * 2**30,
                                                                              0.9, 2048))
    steps = [Speed.step_time(t) for t in p.stage_terms]
    assert sum(steps) == pytest.approx(p.tpot_ms)
    text = device_grid(deploy(sizer.spec, Layout(4, 2)), steps).data[0].text
    assert f"step ≥ {steps[1]:.2f} ms" in text[1][0] and "step" not in device_grid(
        deploy(sizer.spec, Layout(4, 2))).data[0].text[0][0]

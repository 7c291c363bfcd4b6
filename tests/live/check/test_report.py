"""tpviz.live.check.report: the Run-live figures of a VerifyResult (no ranks spawned)."""
from tpviz.live.check.report import EXACT, rank_figure, stage_figure
from tpviz.live.check.results import Environment, LayerDiff, RankReport, VerifyResult


def result(passed: bool = True) -> VerifyResult:
    layers = [LayerDiff("embed", 0.0, 0.0, 1e-4), LayerDiff("layer 0", 2e-6, 1e-7, 1e-4),
              LayerDiff("logits", 3e-6 if passed else 3.9, 1e-7, 3e-4, exceeds=not passed)]
    ranks = [RankReport(r, "cpu", {}, param_bytes=200 * 2**20, bytes_read=50 * 2**20,
                        bytes_spanned=50 * 2**20, checkpoint_bytes=100 * 2**20, load_s=0.1, forward_s=0.1,
                        collectives={}) for r in range(2)]
    return VerifyResult("tiny", 2, "float32", [1, 8], passed, 3e-4, "float32 rule",
                        layers[-1].max_abs, 1e-7, 1.0, None, None if passed else "logits", layers, ranks,
                        Environment("spawn", "cpu", "gloo", "cpu"))


def test_stage_figure_labels_exact_stages_and_uses_plain_exponents():
    fig = stage_figure(result())
    line = fig.data[0]
    assert line.y[0] == EXACT and list(line.text) == ["exact (0)", "", ""]
    assert fig.layout.yaxis.type == "log" and fig.layout.yaxis.exponentformat == "e"
    bad = stage_figure(result(passed=False))
    assert "<br><span style='font-size:12px'>first beyond tolerance at logits" in bad.layout.title.text
    assert bad.layout.margin.t == fig.layout.margin.t + 18  # room for the second line


def test_rank_figure_says_which_dtype_each_bar_counts():
    fig = rank_figure(result())
    assert [t.name for t in fig.data] == ["read from checkpoint (dtype on disk)",
                                          "held, in the run's float32"]
    assert "whole checkpoint 100.00 MiB (dtype on disk)" in fig.layout.annotations[0].text
    res = result()  # with the checkpoint's dtype known: held bytes in it, next to the run's
    res.checkpoint_dtype = "bfloat16"
    for r in res.ranks:
        r.stored_dtype, r.stored_bytes, r.dtype = "bfloat16", 100 * 2**20, "float32"
    fig = rank_figure(res)
    assert [t.name for t in fig.data] == ["read from checkpoint (bfloat16)", "held, in bfloat16",
                                          "held, in the run's float32"]
    assert "whole checkpoint 100.00 MiB (bfloat16)" in fig.layout.annotations[0].text
    assert "counted in the checkpoint’s bfloat16" in fig.layout.title.subtitle.text
    assert ("The run computes in float32, so it holds those "
            "parameters in 2x the bytes") in fig.layout.title.subtitle.text

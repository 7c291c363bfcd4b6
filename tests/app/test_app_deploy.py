"""AppTest of the explorer's deployment view (explorer/deploy.py): a pp / dp / ep layout from the link or the
sidebar, its device grid, expert placement, GPUs and collectives, and exports that carry it."""
import json

import pytest
from app_harness import charts, errors, heading, run_app

from tpviz.deploy.deployment import deploy
from tpviz.rules import Layout
from tpviz.config.sources import load_spec

QWEN_MOE = "Qwen/Qwen3-30B-A3B"


def table(at, column: str):
    """The first dataframe with this column (the deployment's GPU table has 'GPU', its comm table
    'collective')."""
    return next(d.value for d in at.dataframe if column in d.value.columns)


@pytest.fixture
def served(monkeypatch):
    """What the JSON download button serves (made on click: the deferred callable, called here)."""
    from streamlit.runtime.media_file_manager import MediaFileManager
    out, add_deferred = {}, MediaFileManager.add_deferred

    def capture(self, fn, mimetype, coordinates, file_name=None, **kw):
        out[file_name] = fn
        return add_deferred(self, fn, mimetype, coordinates, file_name=file_name, **kw)
    monkeypatch.setattr(MediaFileManager, "add_deferred", capture)
    return out


def test_a_link_opens_a_deployment_with_its_grid_experts_gpus_and_collectives(served):
    at = run_app({"model": QWEN_MOE, "tp": "4", "pp": "2", "ep": "1"})
    assert errors(at) == []
    assert heading(at) == f"{QWEN_MOE} on 8 GPUs · TP 4 × PP 2 × DP 1 + EP"
    assert [m.delta for m in at.metric][:2] == ["GPU 4", "GPU 0"]  # which GPU (the last stage holds lm_head)
    titles = [c["layout"]["title"]["text"] for c in charts(at)]
    assert (titles[0] == "Device grid · TP 4 × PP 2 × DP 1 + EP"
            and titles[1].startswith("Expert placement · linear"))
    gpus = table(at, "GPU")
    expected = deploy(load_spec(QWEN_MOE), Layout(4, 2, 1, True))
    assert list(gpus["GPU"]) == list(range(8)) and list(gpus["stage"]) == [0] * 4 + [1] * 4
    assert list(gpus["layers"])[:1] == ["0–23"] and list(gpus["experts"])[:2] == ["0–31", "32–63"]
    assert expected.gpus[0].experts == list(range(32))
    comm = table(at, "collective")
    assert set(comm["collective"]) == {"all-reduce over the tp GPUs",
                                       "send between stages + all-gather over the tp GPUs",
                                       "all-gather over the tp GPUs"}  # the last stage's logits
    assert at.query_params == {"model": QWEN_MOE, "tp": "4", "rules": "vllm", "pp": "2", "ep": "1"}
    # EP keeps the experts whole: no tab draws them cut by tp, and the page says where they are instead
    assert "MoE experts" not in [t.label for t in at.tabs]
    assert any(c.value.startswith("Expert parallelism keeps each routed expert whole") for c in at.caption)
    data = json.loads(served["Qwen3-30B-A3B_tp4_pp2_ep_vllm.json"]())
    assert data["layout"]["label"] == "TP 4 × PP 2 × DP 1 + EP" and len(data["layout"]["gpus"]) == 8


def test_sidebar_controls_change_the_layout_and_bad_layouts_are_one_line():
    at = run_app({"model": QWEN_MOE, "tp": "4"})
    assert errors(at) == [] and not any("Deployment" in m.value for m in at.markdown)  # plain TP: no section
    assert not at.sidebar.get("number_input")  # the collapsed pp / dp / ep controls are drawn when opened
    at.session_state["open_layout"] = True
    at.run()
    at.number_input(key="dp").set_value(2).run()
    assert errors(at) == [] and heading(at).endswith("on 8 GPUs · TP 4 × PP 1 × DP 2")
    at.session_state["open_layout"] = False
    at.run()
    # kept while closed
    assert not at.sidebar.get("number_input") and heading(at).endswith("TP 4 × PP 1 × DP 2")
    at.session_state["open_layout"] = True
    at.run()
    comm = table(at, "collective")
    assert "all-gather + reduce-scatter over the dp replicas" in set(comm["collective"])
    at.number_input(key="pp").set_value(64).run()
    assert (errors(at)
            == ["pp=64 is more pipeline stages than the model's 48 layers (showing the tensor-parallel "
                          "map alone)"])
    assert heading(at) == f"{QWEN_MOE} on 4 GPUs"  # the TP map still shows
    dense = run_app({"model": "Qwen/Qwen3-8B", "tp": "4", "ep": "1"})
    assert (errors(dense)
            == ["expert parallelism needs a MoE model; this one has no routed experts (showing the "
                             "tensor-parallel map alone)"])


def test_a_tp_only_ep_makes_work_shows_its_gpus_not_an_error():
    """Qwen3-30B-A3B-FP8 at tp 16: the experts' 768/16 = 48 rows are not a multiple of the 128-row FP8 block,
    so plain TP is refused, but with EP every expert is whole (vLLM accepts it): the page draws the EP
    layout."""
    at = run_app({"model": "Qwen/Qwen3-30B-A3B-FP8", "tp": "16", "ep": "1", "tp_show_invalid": "1"})
    assert errors(at) == []
    assert heading(at) == "Qwen/Qwen3-30B-A3B-FP8 on 16 GPUs · TP 16 × PP 1 × DP 1 + EP"
    info = " ".join(i.value for i in at.info)
    assert ("Without EP this tp is refused" in info and "weight = 48 is not divisible" in info
            and "not drawn" in info)
    assert list(table(at, "GPU")["experts"])[:2] == ["0–7", "8–15"]
    at = run_app({"model": "Qwen/Qwen3-30B-A3B-FP8", "tp": "16"})  # without EP: refused, valid sizes named
    assert any("block_n = 128" in e and "Valid tp sizes" in e for e in errors(at))


def test_a_deployments_headline_and_fit_are_its_own_not_the_tp_maps():
    """DeepSeek-V3 at TP 16 x PP 2 + EP: the metrics and "Does it fit?" describe the layout's fullest GPU (the
    plan's 20.70 GiB and 192 sequences at 80 GiB), not the TP-16 map's 40 GiB and 59 sequences."""
    from tpviz.render.text import fmt_bytes
    from tpviz.deploy.sizing import Sizer
    at = run_app({"model": "deepseek-ai/DeepSeek-V3", "tp": "16", "pp": "2", "ep": "1"})
    assert errors(at) == []
    lay = deploy(load_spec("deepseek-ai/DeepSeek-V3"), Layout(16, 2, 1, True))
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Weights on the fullest GPU"] == fmt_bytes(max(g.weight_bytes for g in lay.gpus))
    assert metrics["Sent per decoded token, busiest GPU"] == fmt_bytes(sum(lay.comm_bytes_per_token.values()))
    row = Sizer(load_spec("deepseek-ai/DeepSeek-V3"), "vllm").row(Layout(16, 2, 1, True),
                                                                  80 * 2**30, 0.9, 8192)
    assert row.weights == max(g.weight_bytes for g in lay.gpus) and row.max_sequences == 192
    verdict = next(s.value for s in at.success if "concurrent sequences" in s.value)
    assert f"{row.max_sequences:,} concurrent sequences of 8,192 tokens fit" in verdict


def test_ep_on_a_dense_model_keeps_the_chosen_pp_and_dp():
    at = run_app({"model": "Qwen/Qwen3-8B", "tp": "4", "pp": "2", "dp": "2", "ep": "1"})
    assert (errors(at)
            == ["expert parallelism needs a MoE model; this one has no routed experts (showing the layout "
                          "without EP)"])
    assert heading(at) == "Qwen/Qwen3-8B on 16 GPUs · TP 4 × PP 2 × DP 2"


def test_nano_vllm_rules_refuse_a_deployment_and_keep_the_tp_map():
    """nano-vllm has no pp / dp / ep: switching a deployment's rules to it says so and shows its TP map
    alone."""
    at = run_app({"model": QWEN_MOE, "tp": "4", "pp": "2", "ep": "1"})
    assert heading(at).endswith("· TP 4 × PP 2 × DP 1 + EP")
    at.radio(key="rules").set_value("nano-vllm").run()
    assert (errors(at)
            == ["nano-vllm runs tensor parallelism alone: no pipeline stages, data-parallel replicas or "
                          "expert parallelism; vLLM rules have them (showing the tensor-parallel map alone)"])
    assert [w.value for w in at.warning][:1] == [  # qwen3_moe: not the Qwen3ForCausalLM nano-vllm builds
        "nano-vllm's engine builds Qwen3ForCausalLM only, so for qwen3\\_moe this shows its layer "
        "classes' rules, not a model it can serve"]
    assert heading(at) == f"{QWEN_MOE} on 4 GPUs"


def test_a_plain_tp_view_counts_traffic_as_the_plan_does():
    """Llama-3.1-8B at tp 8: the header's bytes sent per decoded token are the Plan page's comm/token (ring
    bytes each GPU sends), not the sum of the tensors reduced, which read 770.50 KiB beside the Plan's 1.10
    MiB."""
    from tpviz.render.text import fmt_bytes
    from tpviz.deploy.traffic import comm_per_token
    at = run_app({"model": "meta-llama/Llama-3.1-8B", "tp": "8"})
    assert errors(at) == []
    metric = next(m for m in at.metric if m.label == "Sent per decoded token, busiest GPU")
    plan = sum(comm_per_token(load_spec("meta-llama/Llama-3.1-8B"), Layout(8)).values())
    assert metric.value == fmt_bytes(plan) == "1.10 MiB"


def test_the_memory_tab_of_a_deployment_says_it_is_the_tp_map_alone():
    at = run_app({"model": QWEN_MOE, "tp": "4", "pp": "2", "tab": "memory"})
    assert errors(at) == []
    memory = charts(at)[-1]["layout"]["title"]
    assert memory["text"] == "Memory per GPU · the TP 4 map alone"  # every layer on 4 GPUs, not a stage's
    assert memory["subtitle"]["text"].startswith("Every layer on 4 GPUs, before TP 4 × PP 2 × DP 1 places "
                                                 "them")
    plain = charts(run_app({"model": QWEN_MOE, "tp": "4", "tab": "memory"}))[-1]["layout"]["title"]
    assert plain["text"] == "Memory per GPU"

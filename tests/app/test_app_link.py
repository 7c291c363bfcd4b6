"""The link is the whole view (explorer/state.py EXTRAS): serving choices, fit inputs, layer group and open
tab travel in the query string, the address follows every control (after an error too), and a Plan row's link
carries the fit inputs."""
from tests.app.app_harness import charts, errors, run_app

DSV3 = "deepseek-ai/DeepSeek-V3"
FULL = {"model": DSV3, "tp": "8", "rules": "vllm", "dtype": "float16", "kv": "fp8", "gpu": "141",
        "util": "0.95", "ctx": "32768", "conc": "4", "group": "2", "tab": "experts"}


def metric(at, label: str) -> str:
    return next(m.value for m in at.metric if m.label == label)


def fit_verdict(at) -> str:
    return next(s.value for s in [*at.success, *at.warning] if "left for KV cache" in s.value
                or s.value.startswith("Does not fit"))


def test_a_full_link_opens_the_whole_view_and_keeps_it_in_the_address():
    at = run_app(FULL)
    assert errors(at) == []
    assert dict(at.query_params) == FULL
    assert (at.number_input(key="gpu_mem").value, at.slider(key="gpu_util").value,
            at.number_input(key="context").value, at.number_input(key="concurrency").value) == (
        141.0, 0.95, 32768, 4)
    assert at.session_state["serve_dtype"] == "float16" and at.session_state["kv_dtype"] == "fp8"
    assert at.radio(key="layer_group").value == 1  # the second group, the 58 MoE layers
    assert charts(at)[-1]["layout"]["title"]["text"].startswith("MoE experts")  # the open tab
    link = next(m.value for m in at.sidebar.markdown if m.value.startswith("[Link to this view]"))
    assert "kv=fp8" in link and "tab=experts" in link and "gpu=141" in link and "group=2" in link
    # the numbers on screen follow the link's choices: fp8 halves MLA's latent cache
    plain = run_app({"model": DSV3, "tp": "8", "gpu": "141", "ctx": "32768", "conc": "4"})
    kv = "KV cache per token per GPU"
    assert metric(at, kv) != metric(plain, kv)
    assert "32,768 tokens" in fit_verdict(at) and fit_verdict(at) != fit_verdict(plain)
    assert dict(plain.query_params) == {"model": DSV3, "tp": "8", "rules": "vllm", "gpu": "141",
                                        "ctx": "32768", "conc": "4"}  # the group it opened on is no choice


def test_every_control_rewrites_the_address_after_an_error_too():
    at = run_app({"model": "meta-llama/Llama-3.1-8B", "tp": "3"})
    assert errors(at)  # tp 3 is refused
    at.selectbox(key="preset").set_value("Qwen/Qwen3-8B").run()
    assert at.query_params["model"] == "Qwen/Qwen3-8B"
    at = run_app({"model": "meta-llama/Llama-3.1-8B", "tp": "3"})
    at.radio(key="rules").set_value("sglang").run()
    assert at.query_params["rules"] == "sglang" and at.query_params["model"] == "meta-llama/Llama-3.1-8B"
    at.number_input(key="gpu_mem").set_value(141.0).run()
    at.number_input(key="context").set_value(4096).run()
    assert at.query_params["gpu"] == "141" and at.query_params["ctx"] == "4096"
    at.number_input(key="gpu_mem").set_value(80.0).run()
    assert "gpu" not in at.query_params  # back to the default: the link stays short


def test_bad_view_values_in_a_link_are_one_line_each():
    at = run_app({"model": "Qwen/Qwen3-8B", "kv": "int3", "util": "7", "group": "x"})
    lines = errors(at)
    assert len(lines) == 3 and all("\n" not in line for line in lines)
    assert any(line.startswith("kv='int3' in the link is not one of auto, fp8") for line in lines)
    assert at.slider(key="gpu_util").value == 0.9 and "util" not in at.query_params


def test_a_gpu_type_in_the_link_shows_the_speed_bound_and_stays_in_it():
    query = {"model": "meta-llama/Llama-3.1-70B", "tp": "4", "rules": "vllm", "gpu": "79.6", "ctx": "2048",
             "conc": "1", "hw": "h100", "out": "1024"}
    at = run_app(query)
    assert errors(at) == [] and dict(at.query_params) == {k: v for k, v in query.items() if k != "out"}
    tpot = metric(at, "TPOT, at least")
    assert tpot.endswith(" ms") and 10 < float(tpot.split()[0]) < 12  # 34.8 GB of weights at 3.35 TB/s
    assert metric(at, "Bottleneck").startswith("weights read")
    assert any(c["layout"]["title"]["text"].startswith("Speed bound · TP 4") for c in charts(at))
    at.selectbox(key="gpu_type").set_value("h200").run()
    assert at.number_input(key="gpu_mem").value == 140.4 and at.query_params["hw"] == "h200"
    assert float(metric(at, "TPOT, at least").split()[0]) < float(tpot.split()[0])  # more bandwidth
    assert at.toggle(key="speed_on").value  # the link's hw= opened the speed bound
    at.toggle(key="speed_on").set_value(False).run()
    assert "hw" not in at.query_params and not any(m.label == "TPOT, at least" for m in at.metric)
    bad = run_app({**query, "hw": "h300"})
    assert any("hw='h300' in the link" in e for e in [*errors(bad), *[w.value for w in bad.warning]])
    short = run_app({**query, "out": "4096"})
    assert any("leave no prompt" in e.value for e in short.error)


def test_the_vision_encoder_mode_is_a_serving_choice_in_the_link():
    """Cosmos-Reason2's 16 vision heads refuse tp 32 unless the encoder runs data-parallel (&mm=data): then
    the tower is whole on every GPU and the map draws; the address keeps the choice."""
    refused = run_app({"model": "nvidia/Cosmos-Reason2-8B", "tp": "32"})
    assert any("vision_config.num_heads=16" in line and "--mm-encoder-tp-mode data" in line
               for line in errors(refused))
    at = run_app({"model": "nvidia/Cosmos-Reason2-8B", "tp": "32", "mm": "data"})
    assert errors(at) == [] and at.session_state["mm_encoder"] == "data"
    assert at.query_params["mm"] == "data"
    vision = run_app({"model": "nvidia/Cosmos-Reason2-8B", "tp": "4", "tab": "vision"})
    assert errors(vision) == [] and charts(vision)[-1]["layout"]["title"]["text"].startswith("Vision tower")
    assert run_app({"model": "nvidia/Cosmos-Reason2-8B", "mm": "tensor"}).query_params.get("mm") is None


def test_an_audio_tower_has_its_own_tab_and_a_data_mode_vision_tower_is_drawn_whole():
    """Qwen2-Audio: the audio tower's tab (&tab=audio) draws it whole on every GPU; under &mm=data the vision
    tower keeps its tab, drawn whole, and its bytes stay in the memory chart."""
    at = run_app({"model": "Qwen/Qwen2-Audio-7B", "tp": "4", "tab": "audio"})
    assert errors(at) == [] and charts(at)[-1]["layout"]["title"]["text"].startswith("Audio tower · whole")
    data = run_app({"model": "nvidia/Cosmos-Reason2-8B", "tp": "32", "mm": "data", "tab": "vision"})
    assert errors(data) == []
    assert charts(data)[-1]["layout"]["title"]["text"].startswith("Vision tower · whole on every GPU")


def test_transformers_built_towers_open_in_their_tabs():
    """Gemma-4-31B's vision tab (&tab=vision) draws the tower gemma4_mm.py builds from transformers' modules,
    whole; Gemma-3n's audio tab draws embed_audio's split table and projection."""
    at = run_app({"model": "google/gemma-4-31B-it", "tp": "2", "tab": "vision"})
    assert errors(at) == []
    assert charts(at)[-1]["layout"]["title"]["text"].startswith("Vision tower · whole on every GPU (transf")
    audio = run_app({"model": "google/gemma-3n-E2B-it", "tp": "2", "tab": "audio"})
    assert errors(audio) == []
    assert charts(audio)[-1]["layout"]["title"]["text"].startswith("Audio tower's embedder")

"""AppTest: hybrid and heterogeneous models show a layer strip and one view per layer group;
classic fused layouts show their interleaved q/k/v; windowed caches and recurrent state are spelled out."""
from app_harness import charts, errors, heading, run_app


def titles(at) -> list[str]:
    return [c["layout"]["title"]["text"] for c in charts(at)]


def test_hybrid_preset_has_a_layer_strip_and_group_views():
    at = run_app({"model": "Qwen/Qwen3-Next-80B-A3B-Thinking", "tp": "4"})
    assert errors(at) == [] and heading(at) == "Qwen/Qwen3-Next-80B-A3B-Thinking on 4 GPUs"
    strip = charts(at)[0]
    assert strip["layout"]["title"]["text"].startswith("Layers · 48 layers in 2 kinds")
    bars = strip["data"][0]
    assert bars["x"] == sorted(bars["x"], key=lambda i: (i % 4 == 3, i)) and len(bars["x"]) == 48
    full = [x for x, g in zip(bars["x"], bars["customdata"]) if g == 1]
    assert full == list(range(3, 48, 4))  # every 4th layer is full attention, clickable as group 2
    groups = at.radio(key="layer_group")
    first = "1. Gated DeltaNet + MoE 512×512 + shared 512 · layers 0–2, 4–6"
    assert groups.options[0].startswith(first)
    assert groups.options[-1] == "All layers"
    # group 1 (the default): the linear-attention figure, no q/k/v
    assert any(t.startswith("Gated DeltaNet") for t in titles(at))
    assert not any(t.startswith("q / k / v") for t in titles(at))
    assert any("Gated DeltaNet layers keep a fixed state" in i.value for i in at.info)
    groups.set_value(1).run()
    assert errors(at) == []
    assert any(t.startswith("q / k / v") for t in titles(at))
    assert not any(t.startswith("Gated DeltaNet") for t in titles(at))
    assert any(m.value.startswith("#### Layers 3, 7, 11") for m in at.markdown)
    at.radio(key="layer_group").set_value(-1).run()  # all layers: both mixers
    assert {"q / k / v projections · column-parallel"} <= set(titles(at)) and any(
        t.startswith("Gated DeltaNet") for t in titles(at))


def test_heterogeneous_preset_lists_every_block_kind():
    at = run_app({"model": "nvidia/Llama-3_3-Nemotron-Super-49B-v1", "tp": "8"})
    assert errors(at) == []
    labels = at.radio(key="layer_group").options
    # 49 attention layers (two MLP sizes) and 31 attention-free blocks with six MLP sizes, then "All layers"
    assert len(labels) == 9 and sum("no mixer" in x for x in labels) == 6
    assert labels[1].startswith("2. full attention + dense MLP 28672 · layers 1–5")
    at.radio(key="layer_group").set_value(4).run()  # attention-free blocks: only MLP and norm figures
    assert errors(at) == [] and not any(t.startswith("q / k / v") for t in titles(at))


def test_mamba_preset_shows_mamba_and_state():
    at = run_app({"model": "nvidia/Nemotron-H-56B-Base-8K", "tp": "8"})
    assert errors(at) == []
    assert any(t.startswith("Mamba2") for t in titles(at))
    assert any("Mamba2 layers keep a fixed state" in i.value for i in at.info)
    at.session_state["open_fit"] = True
    at.run()
    fit = next(df.value for df in at.dataframe if "GPU memory" in df.value.columns)
    # not tokens alone
    assert "sequences of 8,192 tokens" in fit.columns and set(fit["KV-cache tokens"]) == {"—"}
    assert not any("collective" in df.value.columns for df in at.dataframe)  # drawn only when opened
    at.session_state["open_collectives"] = True
    at.run()
    coll = next(df.value for df in at.dataframe if "collective" in df.value.columns)
    assert list(coll["per forward"])[:2] == [64, 54]  # 54 Mamba2 + 10 attention out-projections; 54 MLPs


def test_sliding_window_cache_is_capped_and_the_context_changes_the_fit():
    at = run_app({"model": "openai/gpt-oss-20b", "tp": "2"})
    assert errors(at) == []
    assert any("12 sliding-window layers cache at most 128 tokens" in i.value for i in at.info)
    # the headline counts every layer's cache of a token: 24 layers x 8 KV heads / 2 GPUs x 64 x 2 (k, v) x 2
    # bytes
    kv = next(x for x in at.metric if x.label == "KV cache per token per GPU")
    assert (kv.value, kv.delta) == ("24.00 KiB", "12.00 KiB of it up to a window")
    at.session_state["open_fit"] = True
    at.number_input(key="context").set_value(100_000).run()
    assert errors(at) == [] and any("sequences of 100,000 tokens" in c for df in at.dataframe
                                    for c in df.value.columns)


def test_fused_legacy_preset_draws_interleaved_qkv():
    at = run_app({"model": "bigscience/bloom-560m", "tp": "2"})
    assert errors(at) == [] and heading(at) == "bigscience/bloom-560m on 2 GPUs"
    qkv = next(c for c in charts(at) if c["layout"]["title"]["text"].startswith("q / k / v"))
    source = qkv["data"][0]  # the source view: one band per (piece, head); BLOOM interleaves q, k, v per head
    gpu0 = [h for h in source["hovertext"] if h.startswith("<b>GPU 0</b>")]
    assert len(gpu0) >= 3 * 8  # 8 heads per GPU, each with its own q, k and v bands
    assert not at.get("radio") or all(r.key != "layer_group" for r in at.radio)  # one layer kind: no strip


def test_unknown_hybrid_upload_is_refused_in_one_line():
    at = run_app({"model": "Qwen/Qwen3-8B"})
    at.radio(key="source").set_value("Hub repo id").run()
    at.text_input(key="hub").input("MiniMaxAI/MiniMax-M1-40k").run()  # offline: refused by the hub, one line
    assert len(errors(at)) == 1


def test_fit_inputs_give_the_answer_for_the_users_gpu():
    at = run_app({"model": "deepseek-ai/DeepSeek-V3", "tp": "8"})
    assert errors(at) == []
    assert any(w.value.startswith("Does not fit: 79.29 GiB") for w in at.warning)  # 80 GiB at 0.9: no room
    at.number_input(key="gpu_mem").set_value(141.0).run()
    at.number_input(key="context").set_value(32768).run()
    ok = [s.value for s in at.success]
    assert errors(at) == [] and len(ok) == 1 and "concurrent sequences of 32,768 tokens fit" in ok[0]
    before = int(ok[0].split(": ")[1].split(" concurrent")[0].replace(",", ""))
    at.session_state["open_serving"] = True  # the serving choices are drawn when opened
    at.run()
    at.selectbox(key="kv_dtype").set_value("fp8").run()  # the MLA latent in one byte: twice the sequences
    after = int(at.success[0].value.split(": ")[1].split(" concurrent")[0].replace(",", ""))
    assert errors(at) == [] and after in (2 * before, 2 * before + 1)


def test_quantized_preset_shows_its_scheme_and_the_fallback_warning():
    at = run_app({"model": "Qwen/Qwen3-235B-A22B-FP8", "tp": "8"})
    assert errors(at) == []
    assert any("FP8 with block scales 128×128" in c.value for c in at.caption)
    assert any("refines the scales to 64×64 blocks" in w.value for w in at.warning)
    at.radio(key="rules").set_value("vllm-0.28").run()  # the older release refuses tp 8
    assert any("= 192 is not divisible by weight quantization block_n = 128" in e for e in errors(at))


def test_a_multi_group_model_opens_on_its_largest_group():
    at = run_app({"model": "deepseek-ai/DeepSeek-V3", "tp": "8"})
    assert errors(at) == []
    assert at.radio(key="layer_group").value == 1  # the 58 MoE layers, not the 3 dense ones
    assert any(m.value.startswith("#### Layers 3–60") for m in at.markdown)

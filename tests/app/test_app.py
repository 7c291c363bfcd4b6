"""AppTest: every control of the explorer, and the share link (query parameters) in both directions."""
from app_harness import charts, errors, figure_tabs, heading, run_app, tab_charts

from tpviz.render import summary as S


def test_opens_offline_on_the_default_preset():
    at = run_app()
    assert errors(at) == []
    assert heading(at) == "Qwen/Qwen3-8B on 4 GPUs"
    assert figure_tabs(at) == ["q/k/v", "o_proj", "gate/up", "down_proj", "embed_tokens",
                               "lm_head", "replicated", "memory"]
    assert len(charts(at)) == 1  # only the open tab's figure is drawn
    titles = [c["layout"]["title"]["text"] for c in tab_charts(at)]
    assert len(titles) == 8 and titles[0].startswith("q / k / v") and titles[-1] == "Memory per GPU"
    assert at.query_params == {"model": "Qwen/Qwen3-8B", "tp": "4", "rules": "vllm"}
    assert [m.label for m in at.metric][:2] == ["Weights per GPU", "KV cache per token per GPU"]
    assert at.metric[3].value == "1 2 4 8 16 32"
    assert "no replicated KV heads" in " ".join(c.value for c in at.caption)


def test_tp_picker_offers_valid_sizes_and_shows_invalid_ones_with_their_reason():
    at = run_app()
    assert at.selectbox(key="tp").options == ["1", "2", "4", "8", "16", "32"]  # valid sizes only by default
    at.toggle(key="tp_show_invalid").set_value(True).run()
    options = at.selectbox(key="tp").options
    assert len(options) == S.MAX_TP and options[3] == "4" and options[2] == "3  ✗ invalid"
    reasons = [c.value for c in at.caption if c.value.startswith("**tp=")]
    assert reasons[0] == "**tp=3** ✗ num\\_attention\\_heads=32 is not divisible by tp\\_size=3"
    assert len(reasons) == S.MAX_TP - 6  # every invalid size, its reason in full
    at.radio(key="rules").set_value("nano-vllm").run()
    assert any("never replicate KV heads" in r.value for r in at.caption if r.value.startswith("**tp=16**"))
    at.selectbox(key="tp").select(3).run()
    assert errors(at)[0].startswith("num_attention_heads=32 is not divisible by tp_size=3")
    at.toggle(key="tp_show_invalid").set_value(False).run()
    # the chosen size stays listed
    assert at.selectbox(key="tp").options == ["1", "2", "3  ✗ invalid", "4", "8"]


def test_preset_and_tp_change_update_the_view_and_the_link():
    at = run_app()
    at.selectbox(key="preset").select("meta-llama/Llama-3.1-8B").run()
    at.selectbox(key="tp").select(16).run()
    assert errors(at) == [] and heading(at) == "meta-llama/Llama-3.1-8B on 16 GPUs"
    assert any("Replicated KV heads: 8 KV heads on 16 GPUs" in i.value for i in at.info)
    assert at.query_params == {"model": "meta-llama/Llama-3.1-8B", "tp": "16", "rules": "vllm"}
    qkv = charts(at)[0]
    assert len(qkv["layout"]["yaxis2"]["categoryarray"]) == 16  # one strip per GPU


def test_invalid_tp_shows_the_reason_and_keeps_the_last_good_view():
    at = run_app()
    at.toggle(key="tp_show_invalid").set_value(True).run()
    at.selectbox(key="tp").select(3).run()
    (line,) = errors(at)
    assert line == ("num_attention_heads=32 is not divisible by tp_size=3. Valid tp sizes for Qwen/Qwen3-8B "
                    "under vLLM 0.33 rules: 1, 2, 4, 8, 16, 32.")
    assert heading(at) == "Qwen/Qwen3-8B on 4 GPUs" and len(figure_tabs(at)) == 8
    assert any("Showing the last good view: Qwen/Qwen3-8B at tp=4" in c.value for c in at.caption)
    at.selectbox(key="tp").select(8).run()
    assert errors(at) == [] and heading(at) == "Qwen/Qwen3-8B on 8 GPUs"


def test_a_link_with_an_invalid_tp_opens_that_model_at_the_nearest_valid_tp():
    at = run_app({"model": "google/gemma-2-9b-it", "tp": "16", "rules": "nano-vllm"})
    (line,) = errors(at)
    assert "never replicate KV heads" in line and line.endswith("nano-vllm rules: 1, 2, 4, 8.")
    # not the default model: the one the link asked for
    assert heading(at) == "google/gemma-2-9b-it on 8 GPUs"
    assert any("Showing the nearest valid view: google/gemma-2-9b-it at tp=8 (nano-vllm rules)" in c.value
               for c in at.caption)
    at.selectbox(key="tp").select(4).run()
    assert errors(at) == [] and heading(at) == "google/gemma-2-9b-it on 4 GPUs"


def test_fit_table_and_the_mla_kv_note():
    at = run_app({"model": "deepseek-ai/DeepSeek-V3", "tp": "8"})
    assert errors(at) == []
    assert any(i.value.startswith("MLA KV cache:")
               and "each of the 8 tensor-parallel GPUs" in i.value for i in at.info)
    labels = [e.label for e in at.expander]
    assert "At common GPU sizes (24 GiB to 288 GiB): room for KV cache from 94 GiB up" in labels  # the picks
    at.session_state["open_fit"] = True  # the table is drawn when opened
    at.run()
    (fit,) = [d.value for d in at.dataframe if "KV-cache tokens" in d.value.columns]
    assert list(fit["GPU memory"])[:4] == ["24 GiB", "40 GiB", "48 GiB", "80 GiB"]
    assert list(fit["left for KV cache"])[3] == "does not fit"  # 79.3 GiB of FP8 weights per GPU


def test_rules_control():
    at = run_app({"model": "meta-llama/Llama-3.1-8B", "tp": "16"})
    assert errors(at) == [] and heading(at) == "meta-llama/Llama-3.1-8B on 16 GPUs"
    at.radio(key="rules").set_value("nano-vllm").run()
    (line,) = errors(at)
    assert ("nano-vllm rules never replicate KV heads" in line
            and line.endswith("nano-vllm rules: 1, 2, 4, 8."))
    assert heading(at) == "meta-llama/Llama-3.1-8B on 16 GPUs"  # the last good (vLLM) view stays usable
    at.selectbox(key="tp").select(8).run()
    assert errors(at) == [] and heading(at) == "meta-llama/Llama-3.1-8B on 8 GPUs"
    assert any(c.value.startswith("nano-vllm rules") for c in at.caption)


def test_every_source_option_renders_its_control():
    at = run_app()
    for source, widget in (("Hub repo id", "text_input"), ("Local path", "text_input"),
                           ("Upload config.json", "file_uploader"), ("Preset", "selectbox")):
        at.radio(key="source").set_value(source).run()
        assert not at.exception
        assert len(getattr(at, widget)) >= 1, source
    assert heading(at) == "Qwen/Qwen3-8B on 4 GPUs"


def test_query_restores_the_view_and_a_control_change_updates_it():
    at = run_app({"model": "meta-llama/Llama-3.1-8B", "tp": "16", "rules": "vllm"})
    assert errors(at) == []
    assert (at.selectbox(key="preset").value == "meta-llama/Llama-3.1-8B"
            and at.selectbox(key="tp").value == 16)
    assert heading(at) == "meta-llama/Llama-3.1-8B on 16 GPUs"
    at.selectbox(key="tp").select(8).run()
    params = dict(at.query_params)
    assert params == {"model": "meta-llama/Llama-3.1-8B", "tp": "8", "rules": "vllm"}
    # the new link opens the same view
    again = run_app(params)
    assert heading(again) == "meta-llama/Llama-3.1-8B on 8 GPUs" and again.radio(key="rules").value == "vllm"


def test_query_with_rules_and_a_hub_id():
    at = run_app({"model": "Qwen/Qwen3-8B", "tp": "8", "rules": "nano-vllm"})
    assert errors(at) == [] and at.radio(key="rules").value == "nano-vllm"
    hub = run_app({"model": "someone/not-cached", "tp": "2"})
    assert (hub.radio(key="source").value == "Hub repo id"
            and hub.text_input(key="hub").value == "someone/not-cached")
    (line,) = errors(hub)
    assert "HF_HUB_OFFLINE" in line and "pick a preset" in line
    assert heading(hub) == "Qwen/Qwen3-8B on 4 GPUs"  # nothing good yet: the default view


def test_bad_query_values_are_reported_and_ignored():
    at = run_app({"tp": "abc", "rules": "trtllm"})
    lines = errors(at)
    assert len(lines) == 2 and "tp='abc'" in lines[0] and "rules='trtllm'" in lines[1]
    assert heading(at) == "Qwen/Qwen3-8B on 4 GPUs"
    at.run()  # the notices belong to the link, not to every rerun
    assert errors(at) == []


def test_link_to_this_view():
    at = run_app({"model": "meta-llama/Llama-3.1-8B", "tp": "8"})
    links = [m.value for m in at.markdown if "Link to this view" in m.value]
    assert links == ["[Link to this view](?model=meta-llama/Llama-3.1-8B&tp=8&rules=vllm)"]


def test_pages_keep_their_own_controls():
    """Explorer -> Run live: each page's widgets keep their own state (no leaked source or tp), and the
    explorer's outlive the other page's run."""
    at = run_app({"model": "meta-llama/Llama-3.1-8B", "tp": "8"})
    at.radio(key="source").set_value("Local path").run()
    at.switch_page("app_pages/1_Run_live.py").run()
    assert not at.exception
    assert at.radio(key="live_source").value == "Preset" and at.number_input(key="live_tp").value == 2
    # the explorer is app.py's main(), a page AppTest cannot switch back to (it switches to files): its
    # controls' values outlive the Run-live run in the session (persist_state), which is what brings them back
    assert at.session_state["source"] == "Local path" and at.session_state["tp"] == 8


def test_sections_below_the_figures_are_drawn_when_opened():
    at = run_app()
    labels = [e.label for e in at.expander]
    assert "Valid tp sizes (vLLM 0.33: 1, 2, 4, 8, 16, 32) and why the others fail" in labels
    assert "Collectives per forward pass: 74" in labels
    assert len(at.dataframe) == 0  # every table is drawn when opened
    for key in ("open_valid", "open_collectives", "open_memory", "open_fit"):
        at.session_state[key] = True
    at.run()
    columns = [list(d.value.columns) for d in at.dataframe]
    assert any(c[0] == "GPU memory" for c in columns)  # the fit at common GPU sizes
    assert (["tp", "vLLM 0.33", "vLLM 0.28", "SGLang 0.5.23", "nano-vllm"] in columns
            and any("collective" in c for c in columns))
    assert any("GPU" in c and "KV cache / token" in c for c in columns)


def test_tensor_names_in_the_notes_keep_their_stars():
    """Block names carry '*' (visual.blocks.*.attn.proj.bias): the notes escape them, or Markdown would set
    the text between two of them in italics and drop both stars."""
    import re
    from app_harness import shown
    at = run_app({"model": "Qwen/Qwen2.5-VL-7B-Instruct", "tp": "4"})
    assert errors(at) == []
    bias = next(i.value for i in at.info if shown(i.value).startswith("Row-parallel bias"))
    assert "visual.blocks.*.attn.proj.bias and visual.blocks.*.mlp.down_proj.bias" in shown(bias)
    assert not re.search(r"(?<!\\)\*", bias), bias  # every star escaped

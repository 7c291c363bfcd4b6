"""The explorer under SGLang rules: its attention-DP and EP controls inside tp, the map cut over their
groups, links that carry them, and bad values in a link."""
from app_harness import errors, figure_tabs, heading, run_app, shown

from explorer.state import controls_from_query, query_from_controls

DS = {"model": "deepseek-ai/DeepSeek-V3", "tp": "8", "rules": "sglang"}


def test_attention_dp_and_ep_controls_draw_the_sglang_deployment():
    at = run_app({**DS, "attn_dp": "8", "ep_size": "8"})
    assert errors(at) == []
    assert heading(at) == "deepseek-ai/DeepSeek-V3 on 8 GPUs · TP 8 × PP 1 × DP 1 · attn-DP 8 · EP 8"
    assert {s.label for s in at.selectbox} >= {"attn-dp: attention-DP groups", "ep: expert-parallel size"}
    assert not [c for c in at.checkbox if c.label == "Expert parallelism (EP)"]  # vLLM's EP is not SGLang's
    # one GPU per attention group: MLA's q_b/kv_b/o are whole on every GPU, drawn with the replicated tensors
    assert "q/k/v" not in figure_tabs(at)
    link, = [m.value for m in at.markdown if "Link to this view" in m.value]
    assert "rules=sglang&attn_dp=8&ep_size=8" in link
    mla, = [shown(i.value) for i in at.info if i.value.startswith("MLA KV cache")]
    assert "with attention DP 8, each GPU keeps the latents of its own sequences" in mla  # no copy, not 1/8


def test_changing_the_ep_size_redraws_and_a_size_from_another_tp_resets():
    at = run_app({**DS, "ep_size": "8"})
    at.selectbox(key="ep_size").set_value(2).run()
    assert errors(at) == [] and heading(at).endswith("· EP 2")
    at.selectbox(key="tp").set_value(4).run()  # 8 does not divide 4: EP 2 still does
    assert errors(at) == [] and "TP 4" in heading(at)


def test_a_layout_sglang_refuses_is_one_line_and_the_view_stays():
    at = run_app({**DS, "ep_size": "8", "dense_tp1": "1", "model": "Qwen/Qwen3-30B-A3B"})
    line, = errors(at)
    assert "does not change qwen3_moe.py's dense MLPs" in line and at.exception == []


def test_links_carry_sglangs_fields_and_bad_ones_are_said():
    values, problems = controls_from_query({**DS, "attn_dp": "4", "dp_lm_head": "1", "ep_size": "x"}, [])
    assert (values["attn_dp"], values["dp_lm_head"], values["ep_size"]) == (4, True, 1)
    assert problems == ["ep_size='x' in the link is not a whole number from 1 to 64; showing ep_size=1"]
    query = query_from_controls({**values, "source": "Hub repo id", "hub": "deepseek-ai/DeepSeek-V3",
                                 "tp": 8, "rules": "sglang"})
    assert query == {"model": "deepseek-ai/DeepSeek-V3", "tp": "8", "rules": "sglang", "attn_dp": "4",
                     "dp_lm_head": "1"}


def test_the_view_names_the_same_gpus_in_the_other_engine():
    at = run_app({"model": "Qwen/Qwen3-30B-A3B", "tp": "8", "ep": "1"})  # vLLM's EP over 8 GPUs
    assert any("The same deployment in SGLang 0.5.23: python -m sglang.launch_server" in shown(c.value)
               and "--ep-size 8" in shown(c.value) for c in at.caption)
    at = run_app({"model": "Qwen/Qwen3-30B-A3B", "tp": "8", "rules": "sglang", "ep_size": "2"})
    assert any(shown(c.value).startswith("No vLLM 0.33 equivalent: --ep 2 below --tp 8") for c in at.caption)
    sent = [mt for mt in at.metric if mt.label == "Sent per decoded token, busiest GPU"]
    assert sent and sent[0].value == "not modelled"  # SGLang's EP traffic: said, not guessed


def test_attention_dp_over_every_gpu_of_a_gqa_model_caches_every_kv_head_on_each():
    at = run_app({"model": "Qwen/Qwen3-30B-A3B", "tp": "8", "rules": "sglang", "attn_dp": "8",
                  "ep_size": "8"})
    assert errors(at) == []  # the KV heads of a whole k were read as none (a crash) before
    assert not [i for i in at.info if i.value.startswith("Replicated KV heads")]
    assert any("attn_tp=1 ≤ 4 KV heads" in shown(c.value) for c in at.caption)


def test_the_model_files_read_this_session_draw_and_say_their_own_refusals():
    """Qwen3.5 under attention DP (its state and mixers over the group, the embedding whole), InternLM2 at
    tp 16 (SGLang regroups wqkv, so KV heads may be replicated), and an SGLang file's own refusal (GPT-2 above
    tp 1) as one st.error with the view kept."""
    at = run_app({"model": "Qwen/Qwen3.5-9B", "tp": "4", "rules": "sglang", "attn_dp": "2"})
    assert errors(at) == [] and heading(at).endswith("· attn-DP 2")
    at = run_app({"model": "internlm/internlm2-chat-7b", "tp": "16", "rules": "sglang"})
    assert errors(at) == [] and "on 16 GPUs" in heading(at)
    at = run_app({"model": "openai-community/gpt2", "tp": "2", "rules": "sglang"})
    line, = errors(at)
    assert line.startswith("SGLang 0.5.23's gpt2.py gives its attention all 12 KV heads")
    assert at.exception == []

"""explorer.fit: the fit at common GPU sizes as the explorer's table (formatting of tpviz.deploy.fit)."""
from explorer.fit import fit_rows
from tpviz import shard_map
from tpviz.render.text import fmt_bytes


def test_fit_rows_room_for_kv_cache():
    m = shard_map("Qwen/Qwen3-8B", 4)
    weights = max(r.weight_bytes for r in m.ranks)
    kv = max(r.kv_cache_bytes_per_token for r in m.ranks)
    rows = {r["GPU memory"]: r for r in fit_rows(m, sizes=(4, 80))}
    room = 80 * 2**30 * 0.9 - weights
    assert rows["80 GiB"]["left for KV cache"] == fmt_bytes(room)
    assert rows["80 GiB"]["KV-cache tokens"] == f"{(room // kv) / 1e6:.2f} M"
    assert rows["80 GiB"]["sequences of 8,192 tokens"] == f"{int(room // (kv * 8192)):,}"
    assert rows["4 GiB"]["left for KV cache"] == "does not fit" and rows["4 GiB"]["KV-cache tokens"] == "—"
    # FP8: ~79 GiB per GPU
    ds = {r["GPU memory"]: r for r in fit_rows(shard_map("deepseek-ai/DeepSeek-V3", 8))}
    assert (ds["80 GiB"]["left for KV cache"] == "does not fit"
            and ds["141 GiB"]["KV-cache tokens"].endswith(" k"))


def test_a_hybrid_models_fit_says_vllm_pads_its_pages():
    from app_harness import run_app, shown
    from tpviz.deploy.fit import HYBRID_PAGES
    notes = lambda at: [shown(c.value) for c in at.caption
                        if shown(c.value).startswith("Note: vLLM 0.33 sizes")]  # noqa: E731
    note = HYBRID_PAGES.format(engine="vLLM 0.33")
    assert notes(run_app({"model": "Qwen/Qwen3-Next-80B-A3B-Thinking", "tp": "4"})) == [f"Note: {note}."]
    assert notes(run_app({"model": "Qwen/Qwen3-8B", "tp": "4"})) == []


def test_the_default_context_past_a_models_length_is_sized_at_it():
    from app_harness import run_app, shown
    at = run_app({"model": "meta-llama/Llama-2-7b-hf", "tp": "2"})  # the 8,192 default; Llama-2 serves 4,096
    assert [shown(w.value) for w in at.warning if "max_model_len" in shown(w.value)] == [
        "context 8,192 is past this model's max_model_len 4,096 (from its config), the "
        "longest vLLM serves it (nano-vllm caps there too): sized for 4,096 tokens."]
    assert any("concurrent sequences of 4,096 tokens fit" in s.value for s in at.success)

"""tpviz.deploy.fit: the fit on one GPU size, from the map's per-rank numbers computed by hand here."""
from dataclasses import replace

from tpviz import shard_map
from tpviz.deploy.fit import fit

QWEN8 = "Qwen/Qwen3-8B"


def test_fit_counts_the_fullest_gpu_and_its_kv_room():
    m = shard_map(QWEN8, 4)
    weights = max(r.weight_bytes for r in m.ranks)
    kv = max(r.kv_cache_bytes_per_token for r in m.ranks)
    f = fit(m, 80, 0.9, context=8192, concurrency=16)
    assert f.usable == 80 * 2**30 * 0.9 and f.weights == weights and f.room == f.usable - weights
    assert f.kv_tokens == int(f.room // kv) and f.per_sequence == kv * 8192
    assert f.max_sequences == int(f.room // (kv * 8192)) and f.fits
    assert not fit(m, 80, 0.9, context=8192, concurrency=f.max_sequences + 1).fits


def test_no_room_and_per_sequence_caches():
    tight = fit(shard_map(QWEN8, 1), 8)  # 16 GB of bf16 weights on one 8 GiB GPU
    assert tight.room < 0 and tight.kv_tokens is None and tight.max_sequences == 0 and not tight.fits
    gemma = shard_map("google/gemma-3-27b-it", 2)  # sliding windows: KV per sequence, no flat token count
    f = fit(gemma, 141, context=100_000)
    full = max(r.kv_cache_bytes_per_token for r in gemma.ranks) * 100_000
    assert f.kv_tokens is None and full < f.per_sequence == max(r.cache_bytes(100_000) for r in gemma.ranks)


def test_hybrid_models_say_vllm_pads_their_pages(capsys):
    """vLLM aligns a hybrid model's attention block to its recurrent state
    (Platform._align_hybrid_block_size), which the sizing does not model: hybrids carry the note, under vLLM
    rules and when something fits, in the library, `map --gpu-mem` and `plan` (text and JSON); dense, MoE and
    MLA models do not."""
    import json
    from tpviz.cli.main import main
    from tpviz.deploy.fit import HYBRID_PAGES, sizing_notes
    from tpviz.config.sources import load_spec
    note = HYBRID_PAGES.format(engine="vLLM 0.33")
    for hybrid in ("Qwen/Qwen3-Next-80B-A3B-Thinking", "nvidia/Nemotron-H-56B-Base-8K",
                   "LiquidAI/LFM2.5-VL-1.6B"):
        assert (sizing_notes(load_spec(hybrid)) == [note]
                and sizing_notes(load_spec(hybrid), "nano-vllm") == [])
    assert sizing_notes(load_spec("nvidia/Nemotron-H-56B-Base-8K"),
                        "vllm-0.28")[0].startswith("vLLM 0.28 sizes")
    for plain in ("Qwen/Qwen3-8B", "Qwen/Qwen3-30B-A3B", "deepseek-ai/DeepSeek-V3"):
        assert sizing_notes(load_spec(plain)) == []
    assert main(["map", "Qwen/Qwen3-Next-80B-A3B-Thinking", "--tp", "4", "--gpu-mem", "80"]) == 0
    assert f"note: {note}\n" in capsys.readouterr().out
    assert main(["map", "nvidia/Nemotron-H-56B-Base-8K", "--tp", "1", "--gpu-mem", "24"]) == 0  # nothing fits
    assert "note: vLLM" not in capsys.readouterr().out
    assert main(["plan", "Qwen/Qwen3-Next-80B-A3B-Thinking", "--gpus", "4", "--gpu-mem", "80", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["notes"] == [note]
    assert main(["plan", "Qwen/Qwen3-8B", "--gpus", "2", "--gpu-mem", "80"]) == 0
    assert "note:" not in capsys.readouterr().out


def test_a_context_past_max_model_len_is_sized_at_it_and_said(capsys):
    """vLLM 0.33 refuses a max_model_len past the one its config derives (the least length key, times a RoPE
    factor the length does not count already): Llama-2's 4,096; Llama-3.1's 131,072 (llama3 RoPE: not
    multiplied); a linear factor multiplies. A longer context is sized at that length, with a note, not
    counted as if served."""
    from tpviz.cli.main import main
    from tpviz.deploy.fit import capped_context
    from tpviz.config.sources import load_spec, presets
    llama2 = load_spec("meta-llama/Llama-2-7b-hf")
    assert (llama2.max_model_len, load_spec("meta-llama/Llama-3.1-8B").max_model_len) == (4096, 131072)
    linear = dict(presets()["meta-llama/Llama-2-7b-hf"], rope_scaling={"type": "linear", "factor": 4.0})
    assert load_spec(linear).max_model_len == 16384
    assert load_spec(dict(linear, max_position_embeddings=None)).max_model_len == 0  # no length: not claimed
    from tpviz.archs import arch_of
    from tpviz.config.readers import max_model_len
    assert [max_model_len({"max_position_embeddings": v}, arch_of("llama"))
            for v in (float("inf"), float("nan"), "4096", True,
                                                                            # not claimed
                                                                            1.5, -1)] == [0] * 6
    odd = load_spec(dict(presets()["meta-llama/Llama-2-7b-hf"], max_position_embeddings=1.5))
    assert (odd.max_model_len == 0
            and "max_position_embeddings=1.5 is not a whole number of tokens" in " ".join(
        odd.notes))
    assert not any("whole number" in n for n in load_spec(dict(linear, max_position_embeddings=1e30)).notes)
    assert max_model_len({"max_position_embeddings": 4096,
                          "rope_scaling": {"type": "linear", "factor": 1e300}},
                         arch_of("llama")) == 4096
    assert capped_context(llama2, 4096) == (4096, None)
    long = fit(shard_map("meta-llama/Llama-2-7b-hf", 2), 80, context=100_000)
    assert long.context == 4096 and long.max_sequences == fit(shard_map("meta-llama/Llama-2-7b-hf", 2), 80,
                                                              context=4096).max_sequences
    assert long.note.startswith("context 100,000 is past this model's max_model_len 4,096")
    assert main(["map", "meta-llama/Llama-2-7b-hf", "--tp", "2", "--gpu-mem", "80",
                 "--context", "100000"]) == 0
    out = capsys.readouterr().out
    assert "concurrent sequences of 4,096 tokens" in out and f"note: {long.note}\n" in out


def test_the_sequence_count_reads_as_english():
    from tpviz.deploy.fit import Fit
    one = Fit(80 * 2**30, 72 * 2**30, 70 * 2**30, 2 * 2**30, None, 2**30, 1, 8192, 16)
    assert one.sequences == "1 concurrent sequence of 8,192 tokens fits"
    assert replace(one, max_sequences=1046).sequences == "1,046 concurrent sequences of 8,192 tokens fit"

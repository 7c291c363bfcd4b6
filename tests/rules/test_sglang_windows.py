"""SGLang 0.5.23 gives sliding layers a pool of their own only for the classes configs/model_config.py lists
(is_hybrid_swa_model: Llama-4, gpt-oss, Gemma-4, Step-3.5 ...); every other model's sliding layers cache every
token of the context, so its cache, sequences and fit are counted as full attention's."""
from tpviz import load_spec, shard_map
from tpviz.deploy.fit import fit
from tpviz.deploy.sizing import Sizer
from tpviz.rules import Layout, ruleset

SGL = ruleset("sglang")


def test_gemma_3_sliding_layers_cache_every_token_in_sglang():
    gemma = load_spec("google/gemma-3-27b-it")  # 62 layers, 52 of them sliding (window 1024)
    sgl, vllm = shard_map(gemma, 4, rules="sglang"), shard_map(gemma, 4)
    full = vllm.ranks[0].kv_cache_bytes_per_token + sum(w["bytes_per_token"]
                                                        for w in vllm.ranks[0].kv_cache_windowed)
    assert sgl.ranks[0].kv_cache_windowed == [] and sgl.ranks[0].kv_cache_bytes_per_token == full
    assert sgl.ranks[0].cache_bytes(32768) == full * 32768 > vllm.ranks[0].cache_bytes(32768)
    said = [w for w in sgl.warnings if w.startswith("SGLang 0.5.23 keeps no sliding-window pool")]
    assert len(said) == 1 and "its 52 sliding layers cache every token" in said[0]
    few, many = fit(sgl, 80.0, 0.9, 32768), fit(vllm, 80.0, 0.9, 32768)
    assert few.max_sequences < many.max_sequences / 4  # the 52 capped layers were most of the cache
    row = Sizer(gemma, SGL).row(Layout(4), 80 * 2**30, 0.9, 32768)
    assert row.max_sequences == few.max_sequences and row.per_sequence == sgl.ranks[0].cache_bytes(32768)


def test_llama_4_keeps_its_chunked_layers_capped_as_a_hybrid_swa_model():
    scout = load_spec("meta-llama/Llama-4-Scout-17B-16E-Instruct")
    assert SGL.caps_window(scout) and ruleset("vllm").caps_window(scout)
    m = shard_map(scout, 4, rules="sglang")
    assert m.ranks[0].kv_cache_windowed and not any("sliding-window pool" in w for w in m.warnings)
    assert not SGL.caps_window(load_spec("google/gemma-2-9b-it"))

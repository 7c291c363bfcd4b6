"""tpviz.fit: the fit on one GPU size, from the map's per-rank numbers computed by hand here."""
from tpviz import shard_map
from tpviz.fit import fit

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

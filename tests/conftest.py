"""Shared fixtures: the real configs in ../shared/configs, and the shard-map invariants checker."""
import json
import math
import os
from pathlib import Path

import pytest
import torch
from hypothesis import settings

from tests.paths import SHARED_CONFIGS


# the suite draws the same hypothesis examples on every run, so a clean CI run repeats the run that passed
# here; TPVIZ_FUZZ=random draws new ones (and keeps what fails in .hypothesis/), to look for new bugs
settings.register_profile("repeatable", derandomize=True)
settings.register_profile("explore", derandomize=False)
settings.load_profile("explore" if os.environ.get("TPVIZ_FUZZ") == "random" else "repeatable")


def _shared_config_files() -> list[Path]:
    if not SHARED_CONFIGS.is_dir():
        return []
    return sorted(p for p in SHARED_CONFIGS.glob("*.json") if not p.name.endswith(".index.json"))


@pytest.fixture(scope="session", autouse=True)
def tpviz_cache(tmp_path_factory):
    """tpviz's caches (configs as transformers read them, random checkpoints) go to a per-session folder,
    never the user's ~/.cache."""
    old = os.environ.get("TPVIZ_CACHE")
    os.environ["TPVIZ_CACHE"] = str(tmp_path_factory.mktemp("tpviz-cache"))
    yield
    if old is None:
        os.environ.pop("TPVIZ_CACHE", None)
    else:
        os.environ["TPVIZ_CACHE"] = old


@pytest.fixture(scope="session", autouse=True)
def torch_single_thread():
    """The tracer works on tiny probe tensors; on a busy 2-core machine torch's spinning worker threads make
    each shard_map call 10-100x slower (see bench/bench_shardmap.py), so the suite runs torch on one
    thread."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def shared_configs() -> dict[str, dict]:
    """{file stem: parsed config.json} of every real config in ../shared/configs (skip when absent)."""
    files = _shared_config_files()
    if not files:
        pytest.skip("../shared/configs is absent")
    return {p.stem: json.loads(p.read_text(encoding="utf-8")) for p in files}


def _kv_replicas(model, tp: int) -> int:
    """How many ranks hold each KV head: tp / num_kv_heads when tp exceeds the KV heads, else 1."""
    kv = model.num_key_value_heads
    return tp // kv if tp > kv else 1


def _expected_cover(t, tp: int, replicas: int, q_rows: int, d: int, model) -> torch.Tensor:
    """How many ranks hold each source row: once, except replicated KV heads and Mamba2's single group."""
    expected = torch.ones(t.shape[t.split_dim], dtype=torch.int64)
    fused_kv = [sec for sec in t.sections if t.family == "qkv" and not sec[3]
                and sec[0].split(" ")[0] in "kv"]
    n_kv = len(fused_kv) // 2  # per-head / per-KV-group fused q/k/v: one k and one v section per KV head
    for _, a, b, _, _ in fused_kv:
        expected[a:b] = tp // n_kv if tp > n_kv else 1
    for label, a, b, size, word in t.sections if t.family in ("qkv", "mamba", "kda") else []:
        if not size:
            continue
        blocks = (b - a) // size
        if word == "KV head":  # a k or v section: replicated when tp exceeds its KV heads
            expected[a:b] = tp // blocks if tp > blocks else 1
        elif word == "KV group":  # Falcon: [q..., k, v] per KV group; k and v are the last 2 heads
            for blk in range(blocks):
                expected[a + (blk + 1) * size - 2 * d:a + (blk + 1) * size] = (tp // blocks
                                                                               if tp > blocks else 1)
        elif word == "group" and blocks % tp:  # Mamba2 with one group: B and C go to every rank
            expected[a:b] = tp
        elif word == "whole":  # a part every rank loads whole (Kimi-Linear's f_a_proj in in_proj_qkvgfab)
            expected[a:b] = tp
    if t.layer_class == "QKVParallelLinear" and not t.sections:
        if t.shard_id in ("k", "v"):
            expected[:] = replicas
        elif t.shard_id is None:
            expected[q_rows:] = replicas
    tower = model.audio if t.tower == "audio" else model.tower
    # built whole where tp does not divide its heads
    if "disable_tp" in t.note and tower and tower.heads % tp:
        expected[:] = tp
    if isinstance(t.shard_id, list):  # one tensor loaded into several shards (Gemma-4's K = V)
        expected *= len(t.shard_id)
    quant = model.quant
    if t.family == "experts" and quant and quant.block and t.name.endswith(("_scale_inv", ".weight_scale")):
        # a slice of I/tp rows that misses the 128 block is refined to r x r blocks (vLLM >= 0.29): each
        # checkpoint block's scale is loaded once per r-row sub-block, by the GPU that holds that sub-block
        width, (bn, bk) = model.moe_intermediate_size, quant.block
        per = width // tp
        r = bn if per % bn == 0 else math.gcd(math.gcd(bn, bk), math.gcd(per, model.hidden_size))
        # block j holds min(bn, width - j bn) rows: that many r-row sub-blocks (a last, partial block fewer)
        expected[:] = torch.tensor([min(bn, width - j * bn) // r for j in range(len(expected))])
    return expected


def check_shard_map(m) -> None:
    """Invariants every valid shard map must satisfy, computed from the config numbers, not the tracer.

    - replicated tensors (split_dim None): one piece per rank covering all of dim 0 at param_start 0;
    - split tensors: every source row/column is covered exactly once across ranks, except k/v rows
      (and the k/v part of a fused qkv) which are covered tp/num_kv_heads times when KV heads are replicated;
    - on every rank, the pieces landing in one local parameter never overlap, stay inside it, and together
      with ParamMap.padding fill it exactly;
    - padding exists only in the vocab tables, and equals the vocab padded to 64 (vllm) minus the vocab.
    """
    tp, model = m.tp_size, m.model
    assert m.schema == "tpviz.shardmap/4"
    assert [r.rank for r in m.ranks] == list(range(tp))
    params = {(p.name, tuple(p.layers or ())): p for p in m.params}
    assert len(params) == len(m.params), "duplicate parameters (a name may repeat only for other layers)"
    names = [(t.name, tuple(t.layers or ())) for t in m.tensors]
    assert len(set(names)) == len(names), "duplicate checkpoint tensors"
    replicas = _kv_replicas(model, tp)
    q_rows = model.num_attention_heads * model.head_dim
    by_param_rank: dict[tuple[str, int], list[tuple[int, int]]] = {}
    for t in m.tensors:
        assert (t.param, tuple(t.layers or ())) in params, (t.name, t.param)
        p = params[(t.param, tuple(t.layers or ()))]
        transposed = t.shape[::-1] == p.shape and len(t.shape) == 2  # Conv1D weights are stored [in, out]
        assert t.split_dim == p.split_dim or (transposed and t.split_dim == 1 - p.split_dim), t.name
        if t.layers is not None:
            assert t.layers == p.layers and all(0 <= i < model.num_hidden_layers for i in t.layers), t.name
        for piece in t.pieces:
            assert 0 <= piece.rank < tp, (t.name, piece)
            assert piece.stop > piece.start >= 0 and piece.param_start >= 0, (t.name, piece)
            dim = 0 if t.split_dim is None else t.split_dim
            pdim = 0 if p.split_dim is None else p.split_dim
            assert piece.stop <= t.shape[dim], (t.name, piece, t.shape)
            assert piece.param_start + piece.size <= p.local_shapes[piece.rank][pdim], (t.name, piece)
            by_param_rank.setdefault((t.param, tuple(t.layers or ()), piece.rank), []).append(
                (piece.param_start, piece.size))
        if t.split_dim is None and "GPU 0 only" in t.note:  # gpt-oss MXFP4 down bias: the others hold zeros
            assert sorted((x.rank, x.start, x.stop) for x in t.pieces) == [(0, 0, t.shape[0])], t.name
            continue
        if t.split_dim is None:
            got = sorted((x.rank, x.start, x.stop, x.param_start) for x in t.pieces)
            # whole, at the same offset on every rank: 0, a per-tensor scale's slot of its projection, or a
            # part of a table no rank splits (MLA's kv latent after q's rows in fused_qkv_a_proj)
            at = got[0][3]
            assert got == [(r, 0, t.shape[0], at) for r in range(tp)], (t.name, got)
            # (DeepSeek-V3.2's weights_proj after wk's rows in the indexer's wk_weights_proj, too)
            merged = "fused" in t.param or p.layer_class == "MergedColumnParallelLinear"
            assert at == 0 or t.shape == [1] or merged, (t.name, got)
            continue
        n = t.shape[t.split_dim]
        counts = torch.zeros(n, dtype=torch.int64)
        for piece in t.pieces:
            counts[piece.start:piece.stop] += 1
        expected = _expected_cover(t, tp, replicas, q_rows, model.head_dim, model)
        bad = torch.nonzero(counts != expected).flatten()
        assert not len(bad), (f"{t.name} (shard_id={t.shard_id}, tp={tp}): source index "
                              f"{int(bad[0])} covered {int(counts[bad[0]])} times, expected "
                              f"{int(expected[bad[0]])}")
    for p in m.params:
        dim = 0 if p.split_dim is None else p.split_dim
        assert len(p.local_shapes) == tp and len(p.padding) == tp, p.name
        for r in range(tp):
            local = p.local_shapes[r]
            assert len(local) == len(p.shape), p.name
            # r x r MoE grids: finer on both dims
            refined = p.family == "experts" and p.name.endswith("scale_inv")
            assert all(a == b or (refined and a % b == 0)
                       for i, (a, b) in enumerate(zip(local, p.shape)) if i != dim), (
                p.name, local, p.shape)
            spans = sorted(by_param_rank.get((p.name, tuple(p.layers or ()), r), []))
            if p.name.endswith(".weight_shape"):  # each part writes the whole [2] again (vLLM's loaders)
                spans = sorted(set(spans))
            for (a, n), (b, _) in zip(spans, spans[1:]):
                assert a + n <= b, f"{p.name} rank {r}: pieces overlap at local index {b}"
            loaded = sum(n for _, n in spans)
            assert loaded + p.padding[r] == local[dim], (p.name, r, loaded, p.padding[r], local)
        if p.family in ("embed", "lm_head") and p.split_dim is None:  # whole on each GPU (SGLang's Gemma-3)
            whole = m.rules.padded_vocab(model.vocab_size, 1)
            assert all(s[0] == whole for s in p.local_shapes), (p.name, p.local_shapes)
        elif p.family in ("embed", "lm_head"):  # Gemma-3n's / Gemma-4's per-layer table has its own rows
            vocab = model.per_layer_vocab if "embed_tokens_per_layer" in p.name else model.vocab_size
            padded = m.rules.padded_vocab(vocab, tp)
            assert sum(p.padding) == padded - vocab, (p.name, p.padding)
            assert all(s[0] * tp == padded for s in p.local_shapes), (p.name, p.local_shapes)
            for r in range(tp):  # real rows first, padding after them
                assert min(a for a, _ in by_param_rank.get((p.name, (), r), [(0, 0)])) == 0, (p.name, r)
        elif p.layer_class in ("PaddedExpertsGateUp", "PaddedExpertsDown"):
            # KimiMoE: each GPU's I/tp rows of an expert padded to 256 when fewer (vLLM 0.33 kimi_k3)
            per = model.moe_intermediate_size // tp
            pad = (256 - per if tp > 1 and per < 256 else 0) * (2 if "GateUp" in p.layer_class else 1)
            assert p.padding == [pad] * tp, (p.name, p.padding)
        elif p.layer_class == "Mxfp4Down" and p.name.endswith("bias"):  # loaded by GPU 0 only
            assert p.padding == [0] + [p.shape[0]] * (tp - 1), (p.name, p.padding)
        elif "_blocks" in p.name or "_scales" in p.name or p.name.endswith("gate_up_proj_bias"):
            # gpt-oss MXFP4: rank r loads whole 32-row blocks, [r*per, (r+1)*per) capped at I, into an
            # allocation of I/tp rounded up to 64; the rest of the parameter is padding
            inter = model.moe_intermediate_size
            per, alloc = -(-(inter // 32) // tp) * 32, -(-(inter // tp) // 64) * 64
            unit = {"gate": 0.5, "down_proj_blocks": 2, "down_proj_scales": 32}
            scale = next(v for k, v in unit.items() if k in p.name)
            for r in range(tp):
                rows = max(0, min((r + 1) * per, inter) - min(r * per, inter))
                assert p.padding[r] == int((alloc - rows) / scale), (p.name, r, p.padding)
        else:
            assert not any(p.padding), (p.name, p.padding)
    for r in m.ranks:
        assert r.weight_bytes == sum(r.weight_bytes_by_family.values()) > 0
        assert r.kv_cache_bytes_per_token > 0 or r.kv_cache_windowed or r.state_bytes_per_sequence > 0


@pytest.fixture(scope="session")
def shard_map_invariants():
    """The invariants checker (session scope, so hypothesis tests can use it)."""
    return check_shard_map

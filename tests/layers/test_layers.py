"""Unit tests of the TP layer classes: shapes, weight_loaders, fused loading, KV replication, vocab padding,
forward without a process group, and the errors they raise."""
import pytest
import torch
import torch.nn.functional as F

from tpviz.errors import TPSizeError, WeightsError
from tpviz.layers import (ColumnParallelLinear, LinearBase, MergedColumnParallelLinear, ParallelLMHead,
                          QKVParallelLinear, ReplicatedLinear, RMSNorm, RowParallelLinear,
                          VocabParallelEmbedding, divide, tp_group)

DT = torch.float64


def rand(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=DT)


def one_line(e: BaseException) -> str:
    assert str(e) and "\n" not in str(e)
    return str(e)


def test_exports_and_no_process_group():
    assert divide(12, 4) == 3
    assert tp_group(1) is None and tp_group(2) is None  # no process group: one rank's partial result
    with pytest.raises(NotImplementedError):
        LinearBase(2, 2, 1, 0).weight_loader(None, None)


# --- ColumnParallelLinear ---

@pytest.mark.parametrize("tp", [1, 2, 4])
def test_column_parallel_shapes_loader_forward(tp):
    w, b, x = rand(8, 6), rand(8, seed=1), rand(3, 6, seed=2)
    outs = []
    for r in range(tp):
        m = ColumnParallelLinear(6, 8, tp, r, bias=True, dtype=DT)
        assert (m.tp_dim, tuple(m.weight.shape), tuple(m.bias.shape)) == (0, (8 // tp, 6), (8 // tp,))
        m.weight.weight_loader(m.weight, w)
        m.bias.weight_loader(m.bias, b)
        rows = slice(r * 8 // tp, (r + 1) * 8 // tp)
        assert torch.equal(m.weight.data, w[rows]) and torch.equal(m.bias.data, b[rows])
        outs.append(m(x))
    torch.testing.assert_close(torch.cat(outs, -1), F.linear(x, w, b))


def test_column_parallel_errors():
    with pytest.raises(TPSizeError) as err:
        ColumnParallelLinear(4, 6, 4, 0)
    assert one_line(err.value) == "output_size=6 is not divisible by tp_size=4"
    m = ColumnParallelLinear(4, 8, 2, 1)
    with pytest.raises(WeightsError) as err:
        m.weight_loader(m.weight, torch.zeros(6, 4))
    assert "6" in one_line(err.value) and "8" in str(err.value)
    with pytest.raises(WeightsError) as err:
        m.weight_loader(m.weight, torch.zeros(8, 5))
    assert "(4, 5)" in one_line(err.value) and "(4, 4)" in str(err.value)
    with pytest.raises(TPSizeError):
        ColumnParallelLinear(4, 8, 2, 2)


# --- RowParallelLinear ---

@pytest.mark.parametrize("tp", [1, 2, 4])
def test_row_parallel_shapes_loader_and_bias_on_rank0_only(tp):
    w, b, x = rand(5, 8), rand(5, seed=1), rand(3, 8, seed=2)
    total = torch.zeros(3, 5, dtype=DT)
    for r in range(tp):
        m = RowParallelLinear(8, 5, tp, r, bias=True, dtype=DT)
        assert (m.tp_dim, tuple(m.weight.shape), tuple(m.bias.shape)) == (1, (5, 8 // tp), (5,))
        m.weight.weight_loader(m.weight, w)
        m.bias.weight_loader(m.bias, b)  # every rank holds the whole bias
        cols = slice(r * 8 // tp, (r + 1) * 8 // tp)
        assert torch.equal(m.weight.data, w[:, cols]) and torch.equal(m.bias.data, b)
        y = m(x[:, cols])  # no process group: the rank-local partial sum
        partial = F.linear(x[:, cols], w[:, cols])
        torch.testing.assert_close(y, partial + b if r == 0 else partial)
        total += y
    torch.testing.assert_close(total, F.linear(x, w, b))  # the bias is counted once


def test_row_parallel_errors():
    with pytest.raises(TPSizeError) as err:
        RowParallelLinear(6, 4, 4, 0)
    assert one_line(err.value) == "input_size=6 is not divisible by tp_size=4"
    m = RowParallelLinear(8, 4, 2, 0, bias=True)
    with pytest.raises(WeightsError) as err:
        m.weight_loader(m.weight, torch.zeros(4, 6))
    one_line(err.value)
    with pytest.raises(WeightsError):
        m.weight_loader(m.weight, torch.zeros(8))
    with pytest.raises(WeightsError):
        m.weight_loader(m.bias, torch.zeros(5))


# --- MergedColumnParallelLinear ---

def test_merged_column_loads_each_projection_then_each_rank():
    gate, up, x = rand(8, 4), rand(12, 4, seed=1), rand(2, 4, seed=2)
    tp = 2
    for r in range(tp):
        m = MergedColumnParallelLinear(4, [8, 12], tp, r, dtype=DT)
        assert tuple(m.weight.shape) == (10, 4)
        m.weight.weight_loader(m.weight, up, 1)  # order of loading does not matter
        m.weight.weight_loader(m.weight, gate, 0)
        want = torch.cat([gate[4 * r:4 * r + 4], up[6 * r:6 * r + 6]])
        assert torch.equal(m.weight.data, want)
        # fused on disk (Phi-3 gate_up_proj): loaded_shard_id None splits by the total sizes
        fused = MergedColumnParallelLinear(4, [8, 12], tp, r, dtype=DT)
        fused.weight.weight_loader(fused.weight, torch.cat([gate, up]))
        assert torch.equal(fused.weight.data, want)
        torch.testing.assert_close(fused(x), F.linear(x, want))


def test_merged_column_errors():
    with pytest.raises(TPSizeError) as err:
        MergedColumnParallelLinear(4, [8, 6], 4, 0)
    assert one_line(err.value) == "output_sizes[1]=6 is not divisible by tp_size=4"
    m = MergedColumnParallelLinear(4, [8, 8], 2, 0)
    for bad_id in (2, -1):
        with pytest.raises(WeightsError) as err:
            m.weight_loader(m.weight, torch.zeros(8, 4), bad_id)
        one_line(err.value)
    with pytest.raises(WeightsError):
        m.weight_loader(m.weight, torch.zeros(6, 4), 0)
    with pytest.raises(WeightsError):
        m.weight_loader(m.weight, torch.zeros(15, 4))  # fused, wrong total


# --- QKVParallelLinear ---

def qkv_weights(heads, kv, d, hidden):
    return rand(heads * d, hidden), rand(kv * d, hidden, seed=1), rand(kv * d, hidden, seed=2)


@pytest.mark.parametrize("heads, kv, tp", [(8, 8, 2), (8, 2, 2), (8, 4, 4), (8, 2, 8),
                                           (16, 4, 16), (8, 1, 4)])
def test_qkv_split_and_kv_replication(heads, kv, tp):
    d, hidden = 3, 5
    q, k, v = qkv_weights(heads, kv, d, hidden)
    kv_per_rank = max(kv // tp, 1)
    replicas = tp // kv if tp > kv else 1
    for r in range(tp):
        m = QKVParallelLinear(hidden, d, heads, kv, tp, r, bias=False, dtype=DT)
        assert (m.num_heads, m.num_kv_heads, m.num_kv_head_replicas) == (heads // tp, kv_per_rank, replicas)
        assert tuple(m.weight.shape) == ((heads // tp + 2 * kv_per_rank) * d, hidden)
        for sid, w in zip("qkv", (q, k, v)):
            m.weight.weight_loader(m.weight, w, sid)
        head = r // (tp // kv) if tp > kv else r * kv_per_rank  # first KV head of this rank
        qs, ks = heads // tp * d, kv_per_rank * d
        assert torch.equal(m.weight.data[:qs], q[r * qs:(r + 1) * qs])
        assert torch.equal(m.weight.data[qs:qs + ks], k[head * d:head * d + ks])
        assert torch.equal(m.weight.data[qs + ks:], v[head * d:head * d + ks])
        assert m.kv_shard_index() == (r // replicas if tp > kv else r)


def test_qkv_kv_head_mapping_tp16_kv8():
    # rank r holds KV head r // (16 / 8): ranks 6 and 7 share head 3
    heads = [QKVParallelLinear(4, 1, 16, 8, 16, r).kv_shard_index() for r in range(16)]
    assert heads == [r // 2 for r in range(16)] and heads[6] == heads[7] == 3


def test_qkv_fused_equals_separate_and_bias():
    heads, kv, d, hidden, tp = 4, 2, 2, 3, 4
    q, k, v = qkv_weights(heads, kv, d, hidden)
    bq, bk, bv = rand(heads * d, seed=3), rand(kv * d, seed=4), rand(kv * d, seed=5)
    for r in range(tp):
        a = QKVParallelLinear(hidden, d, heads, kv, tp, r, bias=True, dtype=DT)
        b = QKVParallelLinear(hidden, d, heads, kv, tp, r, bias=True, dtype=DT)
        for sid, w, bias in zip("qkv", (q, k, v), (bq, bk, bv)):
            a.weight.weight_loader(a.weight, w, sid)
            a.bias.weight_loader(a.bias, bias, sid)
        b.weight.weight_loader(b.weight, torch.cat([q, k, v]))  # Phi-3 qkv_proj: shard id None
        b.bias.weight_loader(b.bias, torch.cat([bq, bk, bv]))
        assert torch.equal(a.weight.data, b.weight.data) and torch.equal(a.bias.data, b.bias.data)
        head = r // 2
        assert torch.equal(a.bias.data, torch.cat([bq[2 * r:2 * r + 2], bk[2 * head:2 * head + 2],
                                                   bv[2 * head:2 * head + 2]]))


def test_qkv_errors():
    with pytest.raises(TPSizeError) as err:
        QKVParallelLinear(8, 2, 8, 8, 3, 0)
    assert one_line(err.value) == "num_attention_heads=8 is not divisible by tp_size=3"
    with pytest.raises(TPSizeError) as err:
        QKVParallelLinear(8, 2, 12, 6, 4, 0)
    assert one_line(err.value) == (
        "num_key_value_heads=6 is not divisible by tp_size=4, and tp_size is not a multiple of it")
    with pytest.raises(TPSizeError) as err:
        QKVParallelLinear(8, 2, 16, 8, 16, 0, rules="nano-vllm")
    assert "num_key_value_heads=8" in one_line(err.value) and "tp_size=16" in str(err.value)
    m = QKVParallelLinear(8, 2, 4, 2, 2, 0)
    with pytest.raises(WeightsError):
        m.weight_loader(m.weight, torch.zeros(8, 8), "x")
    with pytest.raises(WeightsError) as err:
        m.weight_loader(m.weight, torch.zeros(5, 8), "k")
    assert "5" in one_line(err.value) and "4" in str(err.value)
    with pytest.raises(WeightsError):
        m.weight_loader(m.weight, torch.zeros(17, 8))
    with pytest.raises(WeightsError):
        m.weight_loader(m.weight, torch.zeros(8, 9), "q")


# --- VocabParallelEmbedding / ParallelLMHead ---

def test_vocab_embedding_padding_and_masked_forward():
    vocab, dim, tp = 1000, 4, 8  # padded to 1024: 128 rows per rank, rank 7 has 104 real rows
    w = rand(vocab, dim)
    ids = torch.tensor([[0, 127, 128, 500, 895, 896, 999]])
    total = torch.zeros(1, 7, dim, dtype=DT)
    for r in range(tp):
        m = VocabParallelEmbedding(vocab, dim, tp, r, dtype=DT)
        assert (m.num_embeddings_padded, m.num_embeddings_per_partition) == (1024, 128)
        assert (m.vocab_start_idx, m.vocab_end_idx, m.num_real_rows) == (128 * r, 128 * r + 128,
                                                                         104 if r == 7 else 128)
        m.weight_loader(m.weight, w)
        real = m.num_real_rows
        assert torch.equal(m.weight.data[:real], w[128 * r:128 * r + real])
        # padding: never loaded
        assert torch.equal(m.weight.data[real:], torch.zeros(128 - real, dim, dtype=DT))
        y = m(ids)
        inside = (ids >= 128 * r) & (ids < 128 * r + 128)
        assert torch.equal(y[~inside], torch.zeros_like(y[~inside]))  # other ranks' tokens are masked to 0
        total += y
    torch.testing.assert_close(total, F.embedding(ids, w))
    one = VocabParallelEmbedding(vocab, dim, 1, 0, dtype=DT)
    one.weight_loader(one.weight, w)
    assert tuple(one.weight.shape) == (1024, dim)
    torch.testing.assert_close(one(ids), F.embedding(ids, w))


def test_vocab_embedding_nano_vllm_has_no_padding():
    m = VocabParallelEmbedding(1000, 4, 8, 7, rules="nano-vllm")
    assert (m.num_embeddings_padded, tuple(m.weight.shape), m.num_real_rows) == (1000, (125, 4), 125)
    with pytest.raises(TPSizeError) as err:
        VocabParallelEmbedding(1000, 4, 16, 0, rules="nano-vllm")
    assert one_line(err.value) == "vocab_size=1000 is not divisible by tp_size=16"
    with pytest.raises(TPSizeError) as err:
        VocabParallelEmbedding(1000, 4, 3, 0)  # 1024 % 3
    assert "1000" in one_line(err.value) and "tp_size=3" in str(err.value)


def test_vocab_embedding_loader_errors():
    m = VocabParallelEmbedding(1000, 4, 8, 0)
    with pytest.raises(WeightsError) as err:
        m.weight_loader(m.weight, torch.zeros(999, 4))
    assert "999" in one_line(err.value) and "1000" in str(err.value)
    with pytest.raises(WeightsError):
        m.weight_loader(m.weight, torch.zeros(1000, 5))


def test_lm_head_returns_local_logits_without_process_group():
    vocab, dim, tp = 100, 6, 2  # padded to 128: 64 logits per rank, the last 28 of rank 1 are padding
    w, x = rand(vocab, dim), rand(3, dim, seed=1)
    parts = []
    for r in range(tp):
        h = ParallelLMHead(vocab, dim, tp, r, dtype=DT)
        h.weight_loader(h.weight, w)
        y = h(x)
        assert y is not None and tuple(y.shape) == (3, 64)
        parts.append(y)
    assert torch.equal(parts[1][:, 36:], torch.zeros(3, 28, dtype=DT))
    torch.testing.assert_close(torch.cat(parts, -1)[:, :vocab], F.linear(x, w))
    single = ParallelLMHead(vocab, dim, 1, 0, dtype=DT)
    single.weight_loader(single.weight, w)
    assert tuple(single.weight.shape) == (128, dim)
    torch.testing.assert_close(single(x), F.linear(x, w))  # tp=1: padding trimmed


# --- replicated layers ---

def test_replicated_linear_and_rmsnorm():
    w, x = rand(3, 4), rand(2, 4, seed=1)
    for r in range(4):
        m = ReplicatedLinear(4, 3, 4, r, bias=True, dtype=DT)
        assert m.tp_dim is None and tuple(m.weight.shape) == (3, 4)
        m.weight.weight_loader(m.weight, w)
        m.bias.weight_loader(m.bias, torch.ones(3, dtype=DT))
        torch.testing.assert_close(m(x), F.linear(x, w) + 1)
    with pytest.raises(WeightsError):
        m.weight.weight_loader(m.weight, torch.zeros(4, 3))
    norm = RMSNorm(4, eps=1e-6, dtype=DT)
    g = rand(4, seed=2)
    norm.weight.weight_loader(norm.weight, g)
    torch.testing.assert_close(norm(x), x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * g)
    with pytest.raises(WeightsError) as err:
        norm.weight.weight_loader(norm.weight, torch.zeros(5))
    one_line(err.value)

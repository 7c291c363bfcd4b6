"""The layers' collectives are real under a gloo process group: TP output equals the unsplit computation."""
import socket

import pytest
import torch
import torch.multiprocessing as mp
import torch.nn.functional as F
from safetensors.torch import load_file

from tests.helpers.dist_layers import worker


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_row_allreduce_embedding_allreduce_and_lmhead_gather(tmp_path):
    """Also: a layer whose tp_size differs from the group's size raises TPGroupError instead of skipping."""
    tp = 2
    mp.start_processes(worker, args=(tp, free_port(), str(tmp_path)), nprocs=tp,
                       start_method="spawn", join=True)
    got = load_file(tmp_path / "rank0.safetensors")
    g = torch.Generator().manual_seed(0)
    w_col, w_row, b_row = (torch.randn(8, 6, generator=g), torch.randn(5, 8, generator=g),
                           torch.randn(5, generator=g))
    vocab = torch.randn(100, 6, generator=g)
    x, ids = torch.randn(3, 6, generator=g), torch.tensor([[0, 31, 32, 99, 64]])
    torch.testing.assert_close(got["mlp"], F.linear(F.linear(x, w_col), w_row, b_row))
    torch.testing.assert_close(got["embed"], F.embedding(ids, vocab))
    assert got["logits"].shape == (3, 100)  # gathered, padding rows 100..127 trimmed
    torch.testing.assert_close(got["logits"], F.linear(x, vocab))
    assert got["group_size_refused"].item() == 1  # a tp=4 layer in a 2-rank group raises, it never skips

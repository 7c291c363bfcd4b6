"""Worker for test_layers_dist: each rank runs the TP layers under a real gloo group."""
import os

import torch
import torch.distributed as dist
from safetensors.torch import save_file

from tpviz.errors import TPGroupError
from tpviz.layers import ColumnParallelLinear, ParallelLMHead, RowParallelLinear, VocabParallelEmbedding


def worker(rank: int, tp: int, port: int, out_dir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=tp)
    try:
        g = torch.Generator().manual_seed(0)  # same full weights on every rank
        w_col, w_row, b_row = (torch.randn(8, 6, generator=g), torch.randn(5, 8, generator=g),
                               torch.randn(5, generator=g))
        vocab = torch.randn(100, 6, generator=g)  # 100 rows: padded to 128 under vllm rules
        x, ids = torch.randn(3, 6, generator=g), torch.tensor([[0, 31, 32, 99, 64]])
        col, row = ColumnParallelLinear(6, 8, tp, rank), RowParallelLinear(8, 5, tp, rank, bias=True)
        emb, head = VocabParallelEmbedding(100, 6, tp, rank), ParallelLMHead(100, 6, tp, rank)
        col.weight_loader(col.weight, w_col)
        row.weight_loader(row.weight, w_row)
        row.weight_loader(row.bias, b_row)
        emb.weight_loader(emb.weight, vocab)
        head.weight_loader(head.weight, vocab)
        y = row(col(x))  # column output stays sharded and feeds the row layer directly
        result = {"mlp": y, "embed": emb(ids), "logits": head(x)}
        wrong = RowParallelLinear(8, 5, 2 * tp, rank)  # a layer built for another tp: refused, never skipped
        try:
            wrong(torch.randn(3, 8 // (2 * tp)))
            result["group_size_refused"] = torch.tensor(0)
        except TPGroupError as e:
            result["group_size_refused"] = torch.tensor(int(f"process group has {tp} ranks" in str(e)))
        if rank == 0:
            save_file({k: v.contiguous() for k, v in result.items()},
                      os.path.join(out_dir, "rank0.safetensors"))
    finally:
        dist.destroy_process_group()

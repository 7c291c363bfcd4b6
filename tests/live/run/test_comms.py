"""tpviz/live/run/comms.py: collectives counted through a torch dispatch mode, with bytes, p2p included."""
import threading

import torch
import torch.distributed as dist

from tpviz.live.run.comms import CollectiveCounter


def test_counts_and_bytes_of_this_block_only(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        x = torch.ones(4, 8)
        dist.all_reduce(x)  # before the block: not counted
        with CollectiveCounter() as c:
            dist.all_reduce(x)
            dist.all_reduce(x[:2].contiguous())
            dist.all_gather([torch.empty(4, 8)], x)
            dist.broadcast(x, 0)
            # another thread: not ours
            other = threading.Thread(target=lambda: dist.all_reduce(torch.ones(3)))
            other.start()
            other.join()
        assert c.stats == {"all_reduce": {"count": 2, "bytes": 128 + 64},
                           "all_gather": {"count": 1, "bytes": 128}, "broadcast": {"count": 1, "bytes": 128}}
    finally:
        dist.destroy_process_group()

"""What a live run sends its ranks, typed: the Job every rank (and the tp=1 reference) runs, and the Launch
that tells one spawned rank where its group meets. Both cross to the ranks pickled, the spec inside them read
once."""
from dataclasses import dataclass, field

from tpviz.live.model.config import LiveConfig
from tpviz.rules import Layout


@dataclass(frozen=True)
class Job:
    """One live run: the model (its LiveConfig and checkpoint folder), the input, the dtype and backend, the
    injected bugs, the layout (pipeline stages, expert parallelism) and what generation follows."""
    cfg: LiveConfig
    checkpoint: str
    input_ids: list[list[int]]
    dtype: str
    device: str
    backend: str
    inject: tuple[str, ...] = ()
    pp_size: int = 1
    ep: bool = False
    placement: str = "linear"
    stored_dtype: str = ""  # the dtype most of the checkpoint's bytes are stored in
    generate: int = 0  # greedy tokens after the first forward pass
    # generation stops at these (the checkpoint's generation_config.json)
    eos: list[int] = field(default_factory=list)
    follow: list[int] | None = None  # tokens the fp32 reference follows (the low-precision run's picks)
    follow_routing: dict | None = None  # expert choices the fp32 reference computes with (routing.py)
    ref_tokens: list[int] | None = None  # the tp=1 reference's picks, which the ranks compare step by step
    layout: Layout | None = None  # an SGLang layout (rules 'sglang'): attention DP and --ep carved from tp


@dataclass(frozen=True)
class Launch:
    """One spawned group: where its ranks write (run_dir), the parent's TCPStore, the widths, the deadline,
    the parent to watch, and the caller's environment (a forkserver child would inherit the server's)."""
    job: Job
    run_dir: str
    store_port: int
    tp_size: int
    world_size: int
    timeout: float
    parent_pid: int
    env: dict[str, str] = field(default_factory=dict)

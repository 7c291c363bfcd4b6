"""What one machine can take: one live run at a time per server, and no more ranks than its cores carry."""
import os
import threading
from contextlib import contextmanager

from tpviz.live.errors import LiveError
from tpviz.live.check.results import layout_name

MAX_RANKS_ENV = "TPVIZ_LIVE_MAX_RANKS"  # overrides the cap below; "off" lifts it
_SLOT = threading.Lock()  # module state: one per server process, shared by every browser session


def max_ranks(gpus: int = 0) -> int | None:
    """The most spawned ranks this machine runs: two per CPU core (each rank is a process with its own torch),
    and never fewer than the GPUs; $TPVIZ_LIVE_MAX_RANKS overrides it, 'off' lifts it (None)."""
    text = os.environ.get(MAX_RANKS_ENV, "").strip()
    if text.lower() in ("off", "none", "0"):
        return None
    if text:
        if not text.isascii() or not text.isdigit():
            raise LiveError(f"{MAX_RANKS_ENV}={text[:40]!r} must be a whole number of ranks or 'off'")
        return int(text)
    return max(2 * (os.cpu_count() or 1), gpus)


def check_ranks(tp_size: int, gpus: int = 0, pp: int = 1) -> None:
    """Refuse, in one line, more rank processes (tp x pp) than this machine can run at once."""
    limit, ranks = max_ranks(gpus), tp_size * pp
    if limit is not None and ranks > limit:
        what = layout_name(tp_size, pp)
        pick = f"tp ≤ {limit}" if pp == 1 else f"tp × pp ≤ {limit}"
        raise LiveError(f"{what} needs {ranks} rank processes; this machine ({os.cpu_count()} CPU cores, "
                        f"{gpus} GPUs) runs at most {limit}: pick {pick}, or set {MAX_RANKS_ENV}")


@contextmanager
def one_run_at_a_time(on_wait=None, wait_s: float = 600.0):
    """Hold the server's single live-run slot; `on_wait()` is called once if another run holds it (a queue of
    one lock: waiters are served as it frees), and after `wait_s` s of waiting the run is refused."""
    if not _SLOT.acquire(blocking=False):
        if on_wait:
            on_wait()
        if not _SLOT.acquire(timeout=wait_s):
            raise LiveError(f"another live run has held this server for over {wait_s:g} s; try again later")
    try:
        yield
    finally:
        _SLOT.release()

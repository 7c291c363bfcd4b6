"""A download in a worker thread, its bytes counted through huggingface_hub's tqdm bars and reported from the
caller's thread (a Streamlit page may update its widgets only from there)."""
from __future__ import annotations

import threading
from types import SimpleNamespace
from typing import Callable

try:
    from huggingface_hub.utils import tqdm as hf_tqdm
except ImportError:  # pragma: no cover - download_checkpoint says huggingface_hub is missing
    hf_tqdm = object

POLL_S = 0.2  # how often the caller's thread reports progress while the download runs
# what snapshot_download's bytes bar is called (the other bars count files or network transfer)
BYTES_BAR = "huggingface_hub.snapshot_download"

Progress = Callable[[str, int, int], None]  # (what is happening, bytes done, bytes in all)


class Cancelled(Exception):
    """Raised inside the download threads once the caller stopped waiting."""


def counting_bar(state: SimpleNamespace, bars: bool):
    """A huggingface_hub tqdm that also counts the snapshot's written bytes, and stops once cancelled."""

    class Bar(hf_tqdm):
        def __init__(self, *args, **kwargs):
            self._counts = kwargs.get("name") == BYTES_BAR
            super().__init__(*args, **{**kwargs, **({} if bars else {"disable": True})})

        def update(self, n=1):
            if state.cancelled:
                raise Cancelled()
            if self._counts:
                with state.lock:
                    state.done += int(n or 0)
            return super().update(n)

    return Bar


def run_with_progress(fetch, progress: Progress | None, message: str, total: int, bars: bool, error) -> str:
    """fetch(tqdm_class) in a thread; this thread reports progress until it ends (and cancels it on an error);
    a failure is raised as error(exc)."""
    state, out = SimpleNamespace(lock=threading.Lock(), done=0, cancelled=False), {}

    def work():
        try:
            out["folder"] = fetch(counting_bar(state, bars))
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
            out["error"] = exc

    worker = threading.Thread(target=work, name="tpviz-download", daemon=True)
    try:
        if progress:
            progress(message, 0, total)
        worker.start()
        shown = -1
        while worker.is_alive():
            worker.join(POLL_S)
            if progress and state.done != shown:
                shown = state.done
                progress(message, min(shown, total), total)
    # the callback stopped us (Stop on the page, Ctrl-C): the threads stop at their next chunk
    except BaseException:
        state.cancelled = True
        raise
    if isinstance(out.get("error"), (KeyboardInterrupt, SystemExit)):
        raise out["error"]
    if "error" in out:
        raise error(out["error"]) from None
    if progress:
        progress(message, total, total)
    return out["folder"]

"""Work in this process (the tp=1 reference, its re-runs) under the same timeout as the ranks.

The work runs on a daemon thread while the caller's thread keeps the clock, draws progress and calls tick(),
so a hang ends at the deadline, and a UI's stop or SIGTERM (KeyboardInterrupt) ends the wait at once.
"""
import queue
import threading
import time

from tpviz.live.errors import LiveError


class Background:
    """fn() on a daemon thread, so the watchdog keeps its clock while the parent works too: a hang there
    ends at the timeout like a rank's. The thread is abandoned then (Python cannot kill one); a CLI run
    exits."""

    def __init__(self, fn):
        self.result, self.error = None, None
        self.thread = threading.Thread(target=self._run, args=(fn,), daemon=True, name="tpviz-in-process")
        self.thread.start()

    def _run(self, fn) -> None:
        try:
            self.result = fn()
        except BaseException as e:  # noqa: BLE001 - re-raised in the caller's thread by get()
            self.error = e

    @property
    def done(self) -> bool:
        return not self.thread.is_alive()

    def get(self):
        if self.error is not None:
            raise self.error
        return self.result


def run_within(fn, timeout: float, what: str, progress=None, tick=None, deadline: float | None = None):
    """fn(mark) in this process until `deadline` (time.monotonic(); default: `timeout` s from now), so the
    tp=1 work obeys the run's timeout; the phases it marks reach progress() on the caller's thread (a UI may
    only draw from there). Past the deadline: one line naming `what` was running and the whole `timeout`."""
    marks = queue.SimpleQueue()
    deadline = time.monotonic() + timeout if deadline is None else deadline
    job = Background(lambda: fn(marks.put))
    while True:
        job.thread.join(max(0.0, min(0.1, deadline - time.monotonic())))
        if tick:
            tick()
        while not marks.empty():
            phase = marks.get()
            if progress:
                progress(phase)
        if job.done:
            return job.get()
        if time.monotonic() >= deadline:
            raise LiveError(f"{what} did not finish within the {timeout:g} s timeout")

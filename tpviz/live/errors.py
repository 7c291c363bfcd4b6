"""Live-run errors: still one-line ValueErrors, so the CLI and page treat them like any user error."""
import math

from tpviz.errors import TpvizError


class LiveError(TpvizError):
    """A live run that cannot start or finish: unsupported model, bad input ids, no GPU for --device cuda."""


class RankFailure(LiveError):
    """A worker rank raised, died or hung; the whole group was stopped. `rank` is the culprit (or None)."""

    def __init__(self, message: str, rank: int | None = None):
        super().__init__(message)
        self.rank = rank


# A hint that names a control names the CLI flag and the page's control together ("--layers/Layers to keep");
# each front end keeps only its own.
RANDOM_FLAG = "--random-weights/Random weights"
PROMPT_FLAG, IDS_FLAG = "--prompt/Prompt", "--input-ids/Token ids"
TIMEOUT_FLAG = "--timeout/Timeout (s)"
CONTROLS = {RANDOM_FLAG: ("--random-weights", "the Random weights box"),
            TIMEOUT_FLAG: ("--timeout", "Timeout (s)"),
            "--layers/Layers to keep": ("--layers", "Layers to keep"),
            PROMPT_FLAG: ("--prompt TEXT", "a prompt"), IDS_FLAG: ("--input-ids", "token ids")}


def for_cli(message: str) -> str:
    """A message naming only the CLI's flags."""
    for both, (flag, _) in CONTROLS.items():
        message = message.replace(both, flag)
    return message


def for_page(message: str) -> str:
    """A message naming only the page's controls."""
    for both, (_, control) in CONTROLS.items():
        message = message.replace(both, control)
    return message


MAX_TIMEOUT = 86_400.0  # a day: beyond it (or at inf/NaN) torch's store timeouts overflow


def check_timeout(timeout) -> float:
    """A live run's timeout in seconds, or one line: at least 1 s (ranks take about that to start), at most a
    day."""
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not math.isfinite(timeout) \
            or not 1 <= timeout <= MAX_TIMEOUT:
        raise LiveError(f"{TIMEOUT_FLAG} {timeout!r} must be a number of seconds from 1 to {MAX_TIMEOUT:g}")
    return float(timeout)

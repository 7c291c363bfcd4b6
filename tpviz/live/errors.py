"""Live-run errors: still one-line ValueErrors, so the CLI and page treat them like any user error."""
from tpviz.errors import TpvizError


class LiveError(TpvizError):
    """A live run that cannot start or finish: unsupported model, bad input ids, no GPU for --device cuda."""


class RankFailure(LiveError):
    """A worker rank raised, died or hung; the whole group was stopped. `rank` is the culprit (or None)."""

    def __init__(self, message: str, rank: int | None = None):
        super().__init__(message)
        self.rank = rank

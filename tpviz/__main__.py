import os
import sys
import threading

from tpviz.cli.main import main


def leave(code: int) -> None:
    """Exit with `code`; when a timed-out tp=1 run is still inside torch on its abandoned thread, skip the
    interpreter's shutdown, which would abort on it (SIGABRT, "terminate called without an active exception")."""
    if any(t.name == "tpviz-in-process" and t.is_alive() for t in threading.enumerate()):
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":
    leave(main())

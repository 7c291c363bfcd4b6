"""Output paths (--json, --png, --dump-logits) checked before any work: a typo costs one line, not a finished
run whose result cannot be written."""
import os
from pathlib import Path

from tpviz.errors import TpvizError


def _nearest_existing(p: Path) -> Path:
    p = p.absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def writable_file(path: str, flag: str, example: str) -> None:
    """Raise one line unless `path` names a file that can be written: not empty, not a folder, in a folder
    that exists and may be written to. `example`: a file name to suggest when a folder was given."""
    if not path.strip():
        raise TpvizError(f"{flag} needs a path, got an empty one")
    p = Path(path)
    if p.is_dir():
        raise TpvizError(f"{flag} {path} is a folder; give a file name, such as {p / example}")
    folder = p.absolute().parent
    if not folder.is_dir():
        raise TpvizError(f"{flag} {path}: the folder {folder} does not exist")
    if not os.access(folder, os.W_OK) or (p.exists() and not os.access(p, os.W_OK)):
        raise TpvizError(f"{flag} {path}: no permission to write there")


def writable_folder(path: str, flag: str) -> None:
    """Raise one line unless `path` is a folder, or can be made one, that may be written to."""
    if not path.strip():
        raise TpvizError(f"{flag} needs a path, got an empty one")
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise TpvizError(f"{flag} {path} is a file; give a folder to write the PNGs into")
    base = _nearest_existing(p)
    if not base.is_dir():
        raise TpvizError(f"{flag} {path}: {base} is a file, so the folder cannot be made")
    if not os.access(base, os.W_OK):
        raise TpvizError(f"{flag} {path}: no permission to write in {base}")

"""A fake Hugging Face hub cache on disk, a closed localhost port, and a network that must not be tried."""
import hashlib
import os
import socket

REPO = "tpviz-test/tiny-model"
COMMIT = "0123456789abcdef0123456789abcdef01234567"
CONFIG = {"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2}


def closed_port() -> int:
    """A localhost port with nothing listening (bound then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def add_to_cache(cache, repo_id, files, commit=COMMIT, missing=()):
    """Lay files out as the hub cache does: blobs + snapshot symlinks + refs/main (+ .no_exist markers)."""
    repo_dir = cache / ("models--" + repo_id.replace("/", "--"))
    (repo_dir / "refs").mkdir(parents=True, exist_ok=True)
    (repo_dir / "refs" / "main").write_text(commit)
    snap = repo_dir / "snapshots" / commit
    snap.mkdir(parents=True, exist_ok=True)
    (repo_dir / "blobs").mkdir(exist_ok=True)
    for name, content in files.items():
        data = content if isinstance(content, bytes) else content.encode()
        blob = repo_dir / "blobs" / hashlib.sha1(data).hexdigest()
        blob.write_bytes(data)
        try:
            os.symlink(os.path.relpath(blob, snap), snap / name)
        except OSError:  # no symlinks (some filesystems): the hub then stores copies
            (snap / name).write_bytes(data)
    for name in missing:
        marker = repo_dir / ".no_exist" / commit / name
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.touch()


def no_network(*args, **kwargs):
    raise AssertionError("the network must not be tried")

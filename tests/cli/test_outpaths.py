"""tpviz/cli/outpaths.py: output paths refused in one line before any work."""
import pytest

from tpviz.errors import TpvizError
from tpviz.cli.outpaths import writable_file, writable_folder


def refused(check, *args) -> str:
    with pytest.raises(TpvizError) as e:
        check(*args)
    assert "\n" not in str(e.value)
    return str(e.value)


def test_a_file_path(tmp_path):
    writable_file(str(tmp_path / "new.json"), "--json", "map.json")  # a new file in a folder that exists
    (tmp_path / "old.json").write_text("{}")
    writable_file(str(tmp_path / "old.json"), "--json", "map.json")  # overwritten, as before
    assert refused(writable_file, " ", "--json", "map.json") == "--json needs a path, got an empty one"
    assert refused(writable_file, str(tmp_path), "--json",
                   "x.json").endswith(f"such as {tmp_path / 'x.json'}")
    assert "does not exist" in refused(writable_file, str(tmp_path / "a" / "b.json"), "--dump-logits", "l.st")


def test_a_folder_path(tmp_path):
    writable_folder(str(tmp_path), "--png")
    writable_folder(str(tmp_path / "new" / "deeper"), "--png")  # made when written
    (tmp_path / "f").write_text("")
    assert refused(writable_folder, str(tmp_path / "f"),
                   "--png").endswith("give a folder to write the PNGs into")
    assert "is a file, so the folder cannot be made" in refused(writable_folder,
                                                                str(tmp_path / "f" / "x"), "--png")
    assert refused(writable_folder, "", "--png") == "--png needs a path, got an empty one"

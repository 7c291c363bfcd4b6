"""Guards of a live run: the parameter cap, streamed random weights, a bounded cache, hostile checkpoint
indexes, local-path confinement of the tokenizer lookup, and half-written phase files."""
import json
import os
import time

import pytest
import torch
from safetensors import safe_open

from tpviz.errors import TpvizError, WeightsError
from tpviz.live import LiveError, resolve_model
from tpviz.live.run.runner import _hang_message, _phases
from tpviz.config.cache import cache_root
from tpviz.live.load.random_weights import prune_cache, random_tensors, write_random_safetensors
from tpviz.live.load.source import check_size, local_tokenizer, param_count
from tpviz.live.load.weights import checkpoint_files


def test_a_huge_preset_is_refused_before_any_weights_are_made(monkeypatch):
    random_dir = cache_root() / "random"
    before = set(random_dir.glob("*")) if random_dir.exists() else set()
    with pytest.raises(LiveError) as e:
        resolve_model("meta-llama/Llama-3.1-405B", layers=2, random_weights=True)
    msg = str(e.value)
    assert "\n" not in msg and "B parameters on CPU (limit 2.0B)" in msg and "TPVIZ_LIVE_MAX_PARAMS" in msg
    assert "even one layer is too big" in msg  # 1 layer of 405B is still 7.4B
    with pytest.raises(LiveError, match="keep fewer layers with --layers"):
        resolve_model("Qwen/Qwen3-8B", random_weights=True)  # all 36 layers; a few would fit
    with pytest.raises(LiveError, match=r"limit 2.0B"):  # layers=None (all) too
        resolve_model("meta-llama/Llama-3.1-405B", random_weights=True)
    after = set(random_dir.glob("*")) if random_dir.exists() else set()
    assert after == before


def test_the_cap_is_configurable(monkeypatch, tiny_config):
    cfg = resolve_model(tiny_config, layers=1).cfg
    n = param_count(cfg)
    assert n == sum(t.numel() for t in random_tensors(cfg, 0).values())
    monkeypatch.setenv("TPVIZ_LIVE_MAX_PARAMS", str(n - 1))
    with pytest.raises(LiveError, match="TPVIZ_LIVE_MAX_PARAMS"):
        check_size(cfg)
    monkeypatch.setenv("TPVIZ_LIVE_MAX_PARAMS", str(n))
    check_size(cfg)
    monkeypatch.setenv("TPVIZ_LIVE_MAX_PARAMS", "off")
    check_size(cfg)
    monkeypatch.setenv("TPVIZ_LIVE_MAX_PARAMS", "lots")
    with pytest.raises(LiveError, match="must be a positive number"):
        check_size(cfg)


def test_streamed_checkpoint_matches_the_seeded_tensors(tmp_path, tiny_config):
    cfg = resolve_model(tiny_config, layers=1).cfg
    write_random_safetensors(cfg, 5, tmp_path / "model.safetensors")
    expected = random_tensors(cfg, 5)
    with safe_open(str(tmp_path / "model.safetensors"), "pt") as f:
        assert set(f.keys()) == set(expected) and f.metadata() == {"format": "pt"}
        for k, t in expected.items():
            got = f.get_tensor(k)
            assert got.dtype == torch.bfloat16 and torch.equal(got, t)


def test_random_cache_is_pruned_oldest_first(tmp_path):
    for i in range(5):
        d = tmp_path / f"m{i}"
        d.mkdir()
        (d / "model.safetensors").write_bytes(b"x" * 100)
        os.utime(d, (time.time() - 100 + i, time.time() - 100 + i))
    (tmp_path / ".tmp-building").mkdir()  # another run's work in progress: never touched
    prune_cache(tmp_path / "m0", max_entries=3, max_bytes=10_000)  # m0 was just made/used: kept
    assert sorted(p.name for p in tmp_path.iterdir()) == [".tmp-building", "m0", "m3", "m4"]
    prune_cache(tmp_path / "m3", max_entries=10, max_bytes=250)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".tmp-building", "m3", "m4"]


@pytest.mark.parametrize("index, match", [
    ({"weight_map": {"a": "../outside.safetensors"}}, "outside"),
    ({"weight_map": {"a": "/etc/passwd"}}, "outside"),
    ({"weight_map": ["model.safetensors"]}, "not a valid safetensors index"),
    ({"weight_map": {"a": 3}}, "not a valid safetensors index"),
    ({"weight_map": {"a": None}}, "not a valid safetensors index"),
    ({"weight_map": {"a": ""}}, "not a valid safetensors index"),
    ([1, 2], "not a valid safetensors index"),
    ({"weight_map": {"a": "missing.safetensors"}}, "missing.safetensors, which is not a regular file in"),
])
def test_bad_indexes_are_one_line_weights_errors(tmp_path, index, match):
    folder = tmp_path / "ckpt"
    folder.mkdir()
    (tmp_path / "outside.safetensors").write_bytes(b"")
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(WeightsError, match=match) as e:
        checkpoint_files(folder)
    assert "\n" not in str(e.value)


def test_index_files_in_subfolders_are_fine(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "a.safetensors").write_bytes(b"")
    (tmp_path
     / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"x": "sub/a.safetensors"}}))
    assert checkpoint_files(tmp_path) == [(tmp_path / "sub" / "a.safetensors").resolve()]


def test_local_tokenizer_obeys_local_root(tmp_path, monkeypatch):
    (tmp_path / "tokenizer.json").write_text("{}")
    assert local_tokenizer(str(tmp_path)) == tmp_path.resolve()
    monkeypatch.setenv("TPVIZ_LOCAL_ROOT", "off")
    assert local_tokenizer(str(tmp_path)) is None
    monkeypatch.setenv("TPVIZ_LOCAL_ROOT", str(tmp_path / "elsewhere"))
    assert local_tokenizer(str(tmp_path)) is None
    monkeypatch.delenv("TPVIZ_LOCAL_ROOT")
    assert local_tokenizer("x" * 300) is None and local_tokenizer("/" + "x" * 300) is None


@pytest.mark.parametrize("name", ["x" * 300, "/tmp/" + "x" * 300, "a/" + "b" * 300])
def test_overlong_names_are_one_line_errors(name):
    with pytest.raises(TpvizError) as e:
        resolve_model(name, layers=1)
    assert "\n" not in str(e.value)


def test_half_written_phase_lines_are_skipped(tmp_path):
    (tmp_path / "rank0.phase").write_text(f"init {time.time()}\nload {time.time()}\nforw")
    (tmp_path / "rank1.phase").write_text(f"init {time.time()}\nlo")
    (tmp_path / "rank2.phase").write_text("init 12.")
    marks = _phases(tmp_path, 3)
    assert [m[0] for m in marks[0]] == ["init", "load"] and [m[0] for m in marks[1]] == ["init"]
    assert [m[0] for m in marks[2]] == ["init"]
    message, rank = _hang_message(tmp_path, 3, 30, alive=[0, 1, 2])
    assert message.startswith("rank 1, 2 hung in init")


def test_checkpoint_files_as_transformers_picks_them(tmp_path):
    """model.safetensors alone (a stray adapter or consolidated file is never read); a FIFO or a symlink
    out of the folder is refused in one line, never opened."""
    from safetensors.torch import save_file
    save_file({"w": torch.zeros(2)}, str(tmp_path / "model.safetensors"))
    save_file({"x": torch.zeros(2)}, str(tmp_path / "consolidated.safetensors"))
    assert checkpoint_files(tmp_path) == [(tmp_path / "model.safetensors").resolve()]
    fifo = tmp_path / "fifo"
    fifo.mkdir()
    os.mkfifo(fifo / "model.safetensors")
    with pytest.raises(WeightsError, match="not a regular file"):
        checkpoint_files(fifo)
    link = tmp_path / "link"
    link.mkdir()
    (link / "model.safetensors").symlink_to(tmp_path / "model.safetensors")
    with pytest.raises(WeightsError, match="points outside"):
        checkpoint_files(link)


def test_random_cache_key_covers_every_field_the_folder_holds(tmp_path, monkeypatch, tiny_config):
    from dataclasses import replace

    from tpviz.live.load.random_weights import random_checkpoint
    monkeypatch.setenv("TPVIZ_CACHE", str(tmp_path))
    cfg = resolve_model(tiny_config, layers=1).cfg
    plain = random_checkpoint(cfg)
    windowed = random_checkpoint(replace(cfg, sliding_window=4, notes=[]))
    assert plain != windowed and json.loads((windowed / "config.json").read_text())["sliding_window"] == 4
    assert "sliding_window" not in json.loads((plain / "config.json").read_text())
    assert random_checkpoint(replace(cfg, notes=[])) == plain  # same fields: the cache is hit

"""Model sources: presets, local files and folders, uploaded bytes, dicts, hub ids; and every bad input."""
import json
import os
import time
from pathlib import Path

import pytest

from tpviz import ConfigError, HubError, SourceError, load_spec, shard_map
from tpviz.config.files import MAX_CONFIG_BYTES, parse_config
from tpviz.config.sources import find_preset, local_config, presets, resolve_config
from tests.paths import SHARED_CONFIGS

CFG = {"model_type": "llama", "hidden_size": 256, "num_attention_heads": 8, "num_key_value_heads": 4,
       "intermediate_size": 512, "vocab_size": 1000, "num_hidden_layers": 2}


def one_line(e: BaseException) -> str:
    assert str(e) and "\n" not in str(e), repr(str(e))
    return str(e)


@pytest.fixture(autouse=True)
def no_local_root(monkeypatch):
    monkeypatch.delenv("TPVIZ_LOCAL_ROOT", raising=False)


# --- presets ---

def test_presets_offline_and_case_insensitive():
    assert len(presets()) >= 15
    assert load_spec("Qwen/Qwen3-8B").name == "Qwen/Qwen3-8B"
    assert find_preset("qwen/QWEN3-8b") == "Qwen/Qwen3-8B"
    assert load_spec("  qwen/qwen3-8b ").name == "Qwen/Qwen3-8B"
    assert find_preset("Qwen/Qwen3-9B") is None


def test_every_preset_normalizes():
    for repo in presets():
        s = load_spec(repo)
        assert s.name == repo and s.num_hidden_layers > 0 and s.vocab_size > 0


# --- uploaded bytes / strings ---

def test_parse_config_bytes_and_bom():
    raw = json.dumps(CFG).encode()
    assert parse_config(raw) == CFG
    assert parse_config(b"\xef\xbb\xbf" + raw) == CFG  # a BOM is tolerated
    assert parse_config(raw.decode()) == CFG
    s = load_spec(raw)
    assert s.name == "uploaded config" and s.hidden_size == 256
    assert load_spec(bytearray(raw)).hidden_size == 256


@pytest.mark.parametrize("data, cls, match", [
    (b"\xff\xfe\x00garbage", ConfigError, "UTF-8"),
    (b"{\"hidden_size\": 4096,", ConfigError, "not valid JSON"),
    (b"{'hidden_size': 4096}", ConfigError, "not valid JSON"),
    (b"", ConfigError, "not valid JSON"),
    (b"[1, 2, 3]", ConfigError, "JSON object"),
    (b"\"config\"", ConfigError, "JSON object"),
    (b"null", ConfigError, "JSON object"),
    (b"{}", ConfigError, "missing hidden_size"),
    (b"{\"hidden_size\": \"big\"}", ConfigError, "hidden_size"),
])
def test_bad_uploads(data, cls, match):
    with pytest.raises(cls) as err:
        load_spec(data)
    assert match in one_line(err.value)


def test_oversize_upload():
    big = b"{\"pad\": \"" + b"x" * MAX_CONFIG_BYTES + b"\"}"
    for data in (big, big.decode()):
        t = time.perf_counter()
        with pytest.raises(SourceError) as err:
            parse_config(data)
        assert "MB" in one_line(err.value) and time.perf_counter() - t < 1
    with pytest.raises(SourceError):
        load_spec(big)


# --- dicts and other Python values ---

def test_dict_source_name():
    assert load_spec(CFG).name == "config"
    assert load_spec({**CFG, "_name_or_path": "org/tiny"}).name == "org/tiny"
    assert load_spec(CFG, name="mine").name == "mine"
    assert load_spec(load_spec(CFG)) is not None


@pytest.mark.parametrize("source", [None, 3, 2.5, [], ["Qwen/Qwen3-8B"], "", "   ", object()])
def test_not_a_source(source):
    with pytest.raises(SourceError) as err:
        load_spec(source)
    one_line(err.value)


@pytest.mark.parametrize("name", ["nope", "llama-3-8b", "Qwen3-8B", "not a model", "a//b", "-x/y"])
def test_unknown_model(name):
    with pytest.raises(SourceError) as err:
        load_spec(name)
    msg = one_line(err.value)
    assert "unknown model" in msg or "not a Hugging Face repo id" in msg, msg


# --- local files and folders ---

def write(path, cfg=CFG):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(cfg) if isinstance(cfg, dict) else cfg)
    return path


def test_local_config_file_and_folder(tmp_path):
    f = write(tmp_path / "tiny-llama" / "config.json")
    assert load_spec(str(f)).name == "tiny-llama"
    assert load_spec(f).name == "tiny-llama"  # a Path object
    assert load_spec(str(f.parent)).name == "tiny-llama"  # a checkpoint folder
    other = write(tmp_path / "mine.json")
    assert load_spec(str(other)).name == "mine"
    assert shard_map(str(f.parent), 2).model.name == "tiny-llama"


def test_relative_local_path(tmp_path, monkeypatch):
    write(tmp_path / "ckpt" / "config.json")
    monkeypatch.chdir(tmp_path)
    assert load_spec("ckpt").name == "ckpt"
    assert load_spec("./ckpt/config.json").name == "ckpt"


def test_local_folder_without_config(tmp_path):
    (tmp_path / "empty").mkdir()
    write(tmp_path / "empty" / "model.safetensors.index.json", {"weight_map": {}})
    with pytest.raises(SourceError) as err:
        load_spec(str(tmp_path / "empty"))
    assert "no config.json" in one_line(err.value)


def test_local_missing_path(tmp_path):
    with pytest.raises(SourceError) as err:
        load_spec(str(tmp_path / "nothing" / "config.json"))
    assert "no such file" in one_line(err.value)


@pytest.mark.parametrize("text, cls, match", [
    ("{not json", ConfigError, "not valid JSON"), ("[]", ConfigError, "JSON object"),
    ("{\"model_type\": \"llama\"}", ConfigError, "missing"),
])
def test_local_bad_contents(tmp_path, text, cls, match):
    f = write(tmp_path / "m" / "config.json", text)
    with pytest.raises(cls) as err:
        load_spec(str(f))
    assert match in one_line(err.value)


def test_local_non_utf8_and_oversize(tmp_path):
    f = tmp_path / "bin" / "config.json"
    f.parent.mkdir()
    f.write_bytes(b"\x89PNG\r\n\x1a\n\xff\xff")
    with pytest.raises(ConfigError) as err:
        load_spec(str(f))
    assert "UTF-8" in one_line(err.value)
    big = tmp_path / "big" / "config.json"
    big.parent.mkdir()
    big.write_bytes(b" " * (MAX_CONFIG_BYTES + 1))
    with pytest.raises(SourceError) as err:
        load_spec(str(big))
    assert "MB" in one_line(err.value)


def test_shared_configs_load_from_their_paths(shared_configs):
    configs = SHARED_CONFIGS
    for stem, cfg in shared_configs.items():
        by_path = load_spec(str(configs / f"{stem}.json"))
        by_dict = load_spec(cfg, name=stem)
        assert by_path.name == stem
        assert by_path.to_dict() == by_dict.to_dict()


# --- TPVIZ_LOCAL_ROOT ---

@pytest.mark.parametrize("value", ["off", "OFF", " off ", "none", "0", "false"])
def test_local_root_off(tmp_path, monkeypatch, value):
    f = write(tmp_path / "m" / "config.json")
    monkeypatch.setenv("TPVIZ_LOCAL_ROOT", value)
    with pytest.raises(SourceError) as err:
        load_spec(str(f))
    assert "disabled" in one_line(err.value)
    assert load_spec("Qwen/Qwen3-8B").name == "Qwen/Qwen3-8B"  # presets still work
    assert load_spec(json.dumps(CFG).encode()).hidden_size == 256  # and uploads


def test_local_root_confines(tmp_path, monkeypatch):
    root = tmp_path / "root"
    inside = write(root / "a" / "config.json")
    outside = write(tmp_path / "outside" / "config.json")
    monkeypatch.setenv("TPVIZ_LOCAL_ROOT", str(root))
    assert load_spec(str(inside)).name == "a"
    assert load_spec(str(root / "a")).name == "a"
    for bad in (outside, outside.parent, root / ".." / "outside" / "config.json", "/etc/passwd", "~"):
        with pytest.raises(SourceError) as err:
            load_spec(str(bad))
        assert "limited to" in one_line(err.value), bad
    # a symlink inside the root that points outside it is refused too
    link = root / "escape"
    os.symlink(outside.parent, link)
    with pytest.raises(SourceError) as err:
        local_config(link)
    assert "limited to" in one_line(err.value)
    # a sibling whose name merely starts with the root's name is outside
    sibling = write(tmp_path / "root-evil" / "config.json")
    with pytest.raises(SourceError):
        load_spec(str(sibling))


# --- hub ids, offline ---

def test_offline_hub_id_fails_fast(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
    t = time.perf_counter()
    with pytest.raises(HubError) as err:
        load_spec("someone-unknown/some-model")
    assert time.perf_counter() - t < 3
    msg = one_line(err.value)
    assert "someone-unknown/some-model" in msg and "offline" in msg.lower()
    cfg, name = resolve_config("Qwen/Qwen3-8B")  # presets need no hub
    assert name == "Qwen/Qwen3-8B" and cfg["num_hidden_layers"] == 36


def test_overlong_or_unreadable_paths_are_one_line_source_errors(tmp_path, monkeypatch):
    monkeypatch.delenv("TPVIZ_LOCAL_ROOT", raising=False)
    with pytest.raises(SourceError):
        load_spec("x" * 300)  # ENAMETOOLONG from the filesystem, not an OSError traceback
    with pytest.raises(SourceError):
        load_spec("/" + "y" * 300 + "/config.json")
    locked = tmp_path / "config.json"
    locked.write_text("{}")
    monkeypatch.setattr(Path, "read_bytes",
                        lambda self: (_ for _ in ()).throw(PermissionError(13, "Permission denied")))
    with pytest.raises(SourceError, match="cannot read"):
        load_spec(str(locked))


def test_restricted_server_never_probes_bare_names(tmp_path, monkeypatch):
    """With TPVIZ_LOCAL_ROOT set, a bare relative name is not looked up on disk, so errors reveal nothing."""
    (tmp_path / "secret").mkdir()
    (tmp_path / "secret" / "config.json").write_text("{}")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TPVIZ_LOCAL_ROOT", str(tmp_path / "models"))
    with pytest.raises(SourceError, match="unknown model"):
        load_spec("secret")


def test_text_upload_size_counts_bytes_not_characters():
    with pytest.raises(SourceError, match="MB"):
        parse_config("€" * (MAX_CONFIG_BYTES // 3 + 1))  # 3 bytes per character in UTF-8


def test_special_files_are_refused_without_opening(tmp_path, monkeypatch):
    monkeypatch.delenv("TPVIZ_LOCAL_ROOT", raising=False)
    fifo = tmp_path / "config.json"
    os.mkfifo(fifo)  # reading it would block for ever
    with pytest.raises(SourceError, match="not a regular file"):
        load_spec(str(fifo))
    with pytest.raises(SourceError, match="has a config.json that is not a regular file"):  # a FIFO
        load_spec(str(tmp_path))

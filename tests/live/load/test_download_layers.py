"""--layers K on real weights: only the shards the first K layers need are fetched (or required in the cache),
and the note says what that saved, never more than it did."""
import json
from pathlib import Path

import pytest

from tpviz.errors import WeightsError
from tpviz.live.load import download
from tpviz.live.load.download import Download, human_size, shrink_note
from tpviz.live.model.causal_lm import LiveForCausalLM
from tpviz.live.load.source import resolve_model
from tpviz.live.load.weights import load_weights
from tpviz.cli.verify import main

from tests.live.load.test_download import (COMMIT, checkpoint, fake_fetch, fake_listing, fill_cache,
                                           hf_cache, online, one_line)

__all__ = ["hf_cache", "online"]  # fixtures, used by name
REPO = "tpviz-test/split-qwen3"
INDEX = "model.safetensors.index.json"
FIRST, SECOND = "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"


@pytest.fixture(scope="module")
def split(tiny, tmp_path_factory) -> dict[str, Path]:
    """Tiny Qwen3 re-saved in two shards: layer 1 alone in the second; embeddings, layer 0 and the norm in the
    first. Its files by name."""
    from safetensors.torch import load_file, save_file
    folder, out = tiny["qwen3"][0], tmp_path_factory.mktemp("split")
    tensors = load_file(str(folder / "model.safetensors"))
    parts = {FIRST: {k: v for k, v in tensors.items() if ".layers.1." not in k},
             SECOND: {k: v for k, v in tensors.items() if ".layers.1." in k}}
    for name, part in parts.items():
        save_file(part, str(out / name), metadata={"format": "pt"})
    weight_map = {k: name for name, part in parts.items() for k in part}
    (out / INDEX).write_text(json.dumps({"metadata": {"total_size": 0}, "weight_map": weight_map}))
    for name in ("config.json", "generation_config.json"):
        (out / name).write_bytes((folder / name).read_bytes())
    return checkpoint(out)


def fake_index_download(monkeypatch, files: dict[str, Path], fetched: list):
    """hf_hub_download (how hub.fetch_index gets the index) fills the cache when the lookup is not
    local-only."""
    from tpviz.config import hub
    real = hub.hf_hub_download

    def fetch(*, repo_id, filename, revision, cache_dir, local_files_only=False, **kwargs):
        if local_files_only:
            return real(repo_id=repo_id, filename=filename, revision=revision, cache_dir=cache_dir,
                        local_files_only=True, **kwargs)
        fetched.append(filename)
        return str(fill_cache(Path(cache_dir), repo_id, {filename: files[filename]},
                              revision or COMMIT) / filename)
    monkeypatch.setattr(hub, "hf_hub_download", fetch)


def loads(source) -> None:
    """The shrunk model loads every parameter from the snapshot (load_weights refuses a missing tensor)."""
    load_weights(LiveForCausalLM(source.cfg, 2, 0), source.checkpoint)


def test_a_shrunk_download_fetches_the_index_first_and_skips_later_layers_shards(split, monkeypatch, online):
    sizes = {name: path.stat().st_size for name, path in split.items()}
    fake_listing(monkeypatch, sizes)
    asked, fetched = [], []
    fake_fetch(monkeypatch, split, asked)
    fake_index_download(monkeypatch, split, fetched)
    source = resolve_model(REPO, layers=1)
    assert fetched == ["config.json", INDEX]  # the index before the shards were chosen
    assert asked[0]["files"] == ["config.json", INDEX, FIRST, "generation_config.json"]
    snapshot = online / "models--tpviz-test--split-qwen3" / "snapshots" / COMMIT
    assert source.checkpoint == snapshot and (snapshot / FIRST).is_file() and not (snapshot / SECOND).exists()
    loads(source)
    total = sum(sizes.values()) - sizes[SECOND]
    note = (f"1 of 2 shard files, {human_size(sizes[SECOND])} of "
            f"{human_size(total + sizes[SECOND])}, holding only")
    assert any(note in n and n.endswith("were not fetched") for n in source.cfg.notes), source.cfg.notes
    assert any(f"real weights: {REPO}" in n and f"{human_size(total)}, downloaded" in n
               for n in source.cfg.notes)
    # the whole model needs the second shard: asked for now, and no saving is claimed
    source = resolve_model(REPO)
    assert asked[1]["files"] == ["config.json", INDEX, FIRST, SECOND, "generation_config.json"]
    assert (snapshot / SECOND).is_file() and not any("not fetched" in n for n in source.cfg.notes)
    # shrunk again, with the second shard cached by then: not asked for, not claimed as saved, counted as
    # there
    source = resolve_model(REPO, layers=1)
    assert asked[2]["files"] == asked[0]["files"] and not any("not fetched" in n for n in source.cfg.notes)
    assert any(f"{human_size(sum(sizes.values()))}, from the Hugging Face cache" in n
               for n in source.cfg.notes)


def test_an_offline_cache_with_only_the_needed_shards_runs_the_shrunk_model(split, hf_cache, monkeypatch):
    monkeypatch.setattr(download, "_listing", lambda *a: pytest.fail("offline: the hub is never asked"))
    fill_cache(hf_cache, REPO, {k: v for k, v in split.items() if k != SECOND})
    source = resolve_model(REPO, layers=1)
    assert not source.random_weights and source.cfg.spec.num_hidden_layers == 1
    loads(source)
    notes = [n for n in source.cfg.notes if "were not fetched" in n]
    assert notes == ["only the first 1 of 2 layers are read: 1 of 2 shard files, holding only later layers, "
                     "were not fetched"]  # sizes are not known offline, so none is claimed
    with pytest.raises(WeightsError) as e:  # the whole model needs it
        resolve_model(REPO)
    assert f"lacks {SECOND}" in one_line(e) and "HF_HUB_OFFLINE" in str(e.value)


def test_an_offline_cache_missing_a_shard_the_kept_layers_need_is_one_line(split, hf_cache):
    fill_cache(hf_cache, REPO, {k: v for k, v in split.items() if k != FIRST})
    with pytest.raises(WeightsError) as e:
        resolve_model(REPO, layers=1)
    msg = one_line(e)
    assert f"the cached snapshot of {REPO} lacks {FIRST} (the first 1 layers need it)" in msg
    assert "HF_HUB_OFFLINE" in msg and "--random-weights" in msg


@pytest.mark.slow
def test_the_cli_runs_a_shrunk_model_from_a_partial_cache(split, hf_cache, capsys):
    fill_cache(hf_cache, REPO, {k: v for k, v in split.items() if k != SECOND})
    code = main([REPO, "--tp", "2", "--layers", "1", "--device", "cpu", "--seq-len", "6", "--timeout", "120"])
    out, err = capsys.readouterr()
    assert code == 0 and err == "" and out.startswith("PASS"), out + err
    assert "1 of 2 shard files, holding only later layers, were not fetched" in out


def test_the_shrink_note_claims_no_saving_that_did_not_happen():
    big = 3 * 10**9
    single = Download("o/n", Path("."), COMMIT, big)
    assert (shrink_note(single, 1, 4)
            == ("the whole checkpoint (3.0 GB, a single file: nothing to skip) is in the "
                                         "Hugging Face cache; only the first 1 of 4 layers are read"))
    # all needed, or some cached before
    sharded = Download("o/n", Path("."), COMMIT, big, shards=["a", "b", "c"])
    assert ("all 3 shard files" in shrink_note(sharded, 1, 4)
            and "not fetched" not in shrink_note(sharded, 1, 4))
    assert shrink_note(sharded, None, 4) is None and shrink_note(sharded, 4, 4) is None
    # small: no note
    assert shrink_note(Download("o/n", Path("."), COMMIT, 10**6, shards=["a", "b"]), 1, 4) is None
    skipped = Download("o/n", Path("."), COMMIT, 10**9, shards=list("abcd"), skipped=["b", "c"],
                       skipped_bytes=2 * 10**9)
    assert (shrink_note(skipped, 1, 4)
            == ("only the first 1 of 4 layers are read: 2 of 4 shard files, 2.0 GB of "
                                          "3.0 GB, holding only later layers, were not fetched"))

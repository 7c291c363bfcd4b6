"""Real weights that cannot be had, each refused in one line: nothing cached offline, pickles only, a gated or
missing repo, a full disk; and what is refused (or made random) before any download."""
import errno
import shutil

import pytest
import torch

from tpviz.errors import HubError, TpvizError, WeightsError
from tpviz.live.load import download
from tpviz.live.load.source import resolve_model
from tpviz.cli.verify import main

from tests.live.load.test_download import (checkpoint, fake_listing, fill_cache, hf_cache, hub_error,
                                           never, one_line, online)

__all__ = ["hf_cache", "online"]  # fixtures, used by name


def test_offline_with_nothing_cached_says_so_in_one_line(hf_cache, capsys):
    with pytest.raises(HubError) as e:
        resolve_model("Qwen/Qwen3-0.6B", layers=1)  # a preset: its config is built in, its weights are not
    msg = one_line(e)
    assert "Qwen/Qwen3-0.6B" in msg and "HF_HUB_OFFLINE" in msg and "--random-weights" in msg
    assert main(["Qwen/Qwen3-0.6B", "--tp", "2", "--layers", "1", "--device", "cpu"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and err.startswith("error: ") and "HF_HUB_OFFLINE" in err
    # the CLI's words only
    assert "use --random-weights to run without downloading" in err and "box" not in err


def test_a_cached_config_without_weights_is_no_checkpoint(tiny, hf_cache):
    """The explorer caches config.json alone: offline, that is no checkpoint (and no random weights
    either)."""
    fill_cache(hf_cache, "tpviz-test/tiny-qwen3", {"config.json": tiny["qwen3"][0] / "config.json"})
    with pytest.raises(WeightsError) as e:
        resolve_model("tpviz-test/tiny-qwen3")
    msg = one_line(e)
    assert ("weights of tpviz-test/tiny-qwen3 are not in the local Hugging Face "
            "cache (only config.json)") in msg
    assert "HF_HUB_OFFLINE" in msg and "--random-weights" in msg


def test_a_cached_snapshot_missing_a_shard_is_refused(tiny, hf_cache):
    files = checkpoint(tiny["llama"][0])
    shard = sorted(n for n in files if n.startswith("model-"))[-1]
    fill_cache(hf_cache, "tpviz-test/tiny-llama", {k: v for k, v in files.items() if k != shard})
    with pytest.raises(WeightsError, match=f"lacks {shard}"):
        resolve_model("tpviz-test/tiny-llama")


def test_a_pickle_only_repo_is_refused_before_downloading(monkeypatch, online):
    fake_listing(monkeypatch, {"config.json": 700, "pytorch_model.bin": 5_000_000, "README.md": 10})
    monkeypatch.setattr(download, "snapshot_download", never)
    with pytest.raises(WeightsError) as e:
        download.download_checkpoint("tpviz-test/pickles")
    msg = one_line(e)
    assert ("only pickle weights (pytorch_model.bin)" in msg and "never loads" in msg
            and "--random-weights" in msg)


def test_a_cached_snapshot_linking_out_of_its_repo_is_refused(tiny, hf_cache, tmp_path):
    """Snapshot files may link into their own repo's blobs/, nowhere else."""
    files = checkpoint(tiny["qwen3"][0])
    snapshot = fill_cache(hf_cache, "tpviz-test/escape", {"config.json": files["config.json"]})
    (snapshot / "model.safetensors").symlink_to(files["model.safetensors"])  # outside the cache
    with pytest.raises(WeightsError, match="points outside") as e:
        resolve_model("tpviz-test/escape")
    one_line(e)


def test_a_cached_pickle_only_snapshot_is_refused_and_never_loaded(tiny, hf_cache, monkeypatch):
    monkeypatch.setattr(torch, "load", never)
    config = tiny["qwen3"][0] / "config.json"
    fill_cache(hf_cache, "tpviz-test/pickles", {"config.json": config,
                                                "pytorch_model.bin": b"\x80\x04not really"})
    with pytest.raises(WeightsError, match="only pickle weights") as e:
        resolve_model("tpviz-test/pickles")
    one_line(e)


def test_a_repo_with_safetensors_outside_transformers_layout_is_refused(monkeypatch, online):
    fake_listing(monkeypatch, {"config.json": 700, "consolidated.safetensors": 10**9})
    monkeypatch.setattr(download, "snapshot_download", never)
    with pytest.raises(WeightsError, match="no model.safetensors or model.safetensors.index.json") as e:
        download.download_checkpoint("mistralai/Mistral-7B-Instruct-v0.3")
    one_line(e)


def test_a_gated_repo_says_to_accept_the_licence(monkeypatch, online):
    # gated repos list their files
    fake_listing(monkeypatch, {"config.json": 800, "model.safetensors": 2_000_000})
    error = hub_error(403, "GatedRepo")
    assert type(error).__name__ == "GatedRepoError"

    def gated(*args, **kwargs):
        raise error
    monkeypatch.setattr(download, "snapshot_download", gated)
    with pytest.raises(HubError) as e:
        resolve_model("meta-llama/Llama-3.2-1B", layers=1)
    msg = one_line(e)
    assert "meta-llama/Llama-3.2-1B is gated: accept the licence" in msg and "HF_TOKEN" in msg


def test_a_missing_repo_is_one_line(monkeypatch, online, capsys):
    error = hub_error(404, "RepoNotFound", "Qwen/Qwen3-0.6B")
    assert type(error).__name__ == "RepositoryNotFoundError"
    fake_listing(monkeypatch, {}, error=error)
    monkeypatch.setattr(download, "snapshot_download", never)
    with pytest.raises(HubError) as e:
        resolve_model("Qwen/Qwen3-0.6B", layers=1)
    assert "Qwen/Qwen3-0.6B was not found on the Hugging Face hub" in one_line(e)
    assert main(["Qwen/Qwen3-0.6B", "--tp", "2", "--layers", "1", "--device", "cpu"]) == 2
    out, err = capsys.readouterr()
    assert err.count("\n") == 1 and "was not found on the Hugging Face hub" in err


def test_an_unreachable_hub_falls_back_to_the_cache_or_says_so(tiny, hf_cache, monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setattr("tpviz.config.hub.constants.HF_HUB_OFFLINE", False)
    monkeypatch.setattr("tpviz.config.hub._reachable", lambda endpoint, limit: False)
    monkeypatch.setattr(download, "_listing", never)
    with pytest.raises(HubError) as e:
        resolve_model("Qwen/Qwen3-0.6B", layers=1)
    msg = one_line(e)
    assert "cannot reach" in msg and "--random-weights" in msg
    fill_cache(hf_cache, "tpviz-test/tiny-qwen3", checkpoint(tiny["qwen3"][0]))
    source = resolve_model("tpviz-test/tiny-qwen3")
    assert not source.random_weights and any("cannot reach" in n for n in source.cfg.notes)


def test_a_download_the_disk_cannot_hold_is_refused_first(monkeypatch, online):
    fake_listing(monkeypatch, {"config.json": 800, "model.safetensors": 3 * 10**9})
    monkeypatch.setattr(download, "snapshot_download", never)
    monkeypatch.setattr(shutil, "disk_usage",
                        lambda path: shutil._ntuple_diskusage(10**10, 10**10 - 10**9, 10**9))
    with pytest.raises(WeightsError) as e:
        download.download_checkpoint("tpviz-test/big")
    msg = one_line(e)
    assert "needs 3.0 GB but only 1.0 GB is free" in msg and "HF_HUB_CACHE" in msg


def test_an_os_error_while_downloading_is_one_line(monkeypatch, online):
    fake_listing(monkeypatch, {"config.json": 800, "model.safetensors": 1000})

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(download, "snapshot_download", full)
    with pytest.raises(WeightsError) as e:
        download.download_checkpoint("tpviz-test/big")
    assert "No space left on device" in one_line(e)


def test_random_weights_are_asked_for_and_labelled(hf_cache, monkeypatch, capsys):
    monkeypatch.setattr(download, "download_checkpoint", never)
    source = resolve_model("Qwen/Qwen3-0.6B", layers=1, random_weights=True)
    assert source.random_weights and source.cfg.spec.num_hidden_layers == 1
    code = main(["Qwen/Qwen3-0.6B", "--tp", "1", "--layers", "1", "--random-weights",
                 "--device", "cpu", "--seq-len", "4", "--quiet"])
    out, err = capsys.readouterr()
    assert (code == 0 and err == "" and out.startswith("PASS")
            and out.strip().endswith("random weights (seed 0)"))


def test_a_local_checkpoint_can_run_random_weights_instead(tiny):
    folder, _ = tiny["qwen3"]
    assert not resolve_model(folder).random_weights
    source = resolve_model(folder, random_weights=True, seed=5)
    assert source.random_weights and source.checkpoint != folder and source.tokenizer_dir is None


def test_a_quantized_preset_is_refused_before_downloading(hf_cache, monkeypatch):
    monkeypatch.setattr(download, "download_checkpoint", never)
    with pytest.raises(TpvizError) as e:
        resolve_model("Qwen/Qwen3-30B-A3B-FP8", layers=1)
    assert "quantized" in one_line(e) and "--random-weights" in str(e.value)


def test_the_parameter_cap_comes_before_any_download(hf_cache, monkeypatch):
    monkeypatch.setattr(download, "download_checkpoint", never)
    with pytest.raises(TpvizError, match=r"parameters on CPU \(limit 2.0B\)"):
        resolve_model("meta-llama/Llama-3.1-405B")

"""The memory estimate before a run: weights per rank and in the tp=1 reference, read off the shard map,
checked against what real runs hold; the refusal when they would not fit, in the library, the CLI and the
page."""
from tests.paths import ROOT
import pytest
import torch
from streamlit.testing.v1 import AppTest

from tpviz.live import verify
from tpviz.live.errors import LiveError
from tpviz.live.check.memory import (BUILD_DTYPE, MEMORY_ENV, MemoryEstimate, OverMemory,
                                     available_memory, check_memory,
                               input_shape, plan_memory)
from tpviz.cli.verify import main

PAGE = str(ROOT / "app_pages" / "1_Run_live.py")
EIGHT_LAYERS = {"model_type": "qwen3", "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
                "head_dim": 16, "intermediate_size": 128, "vocab_size": 1000, "num_hidden_layers": 8,
                "tie_word_embeddings": True, "_name_or_path": "eight-layers"}


@pytest.mark.slow
def test_the_estimate_is_what_each_rank_and_the_reference_hold(tiny):
    folder = tiny["qwen2"][0]  # untied, vocab 1003: padded rows on every rank
    est = plan_memory(folder, 2, device="cpu")
    result, _ = verify(folder, 2, device="cpu", seq_len=4)
    assert est.ranks == [r.param_bytes for r in result.ranks] and est.dtype == result.dtype == "float32"
    alone, _ = verify(folder, 1, device="cpu", seq_len=4)  # the in-process tp=1 run: the reference's model
    assert est.reference == alone.ranks[0].param_bytes
    # as the report says
    assert est.rows()[0]["held MiB (float32)"] == result.ranks[0].row()["held MiB (float32)"]


@pytest.mark.slow
def test_the_estimate_follows_stages_experts_and_the_run_dtype(tiny_moe):
    folder = tiny_moe["qwen3_moe"][0]  # layer 1 is dense: the two stages differ
    options = dict(pp=2, ep=True, placement="round_robin", dtype="bfloat16")
    est = plan_memory(folder, 2, device="cpu", **options)
    result, _ = verify(folder, 2, device="cpu", seq_len=4, **options)
    held = [r.param_bytes for r in result.ranks]
    assert est.ranks == held and held[0] != held[2] and est.dtype == "bfloat16"
    # the folder's stored dtype, as the run picks
    assert plan_memory(folder, 2, dtype="auto").dtype == "float32"


def test_peaks_per_memory():
    est = MemoryEstimate("m", "bfloat16", 2, [100, 120], 200)
    up = 4 // 2 if BUILD_DTYPE == "float32" else 1  # built in float32, then cast
    assert est.pools() == {"RAM": (100 + 120 + 200) * up}  # spawned ranks and the reference build at once
    one = MemoryEstimate("m", "float32", 2, [200], 200)
    assert one.pools() == {"RAM": 200}  # a lone tp=1 run follows the reference, in the same process
    gpus = MemoryEstimate("m", "float32", 2, [100, 120, 100, 120], 300, device="cuda", gpus=2)
    # rank r on GPU r % 2, the reference on 0
    assert gpus.pools() == {"cuda:0": 100 + 100 + 300, "cuda:1": 240}
    assert gpus.over({"cuda:0": 499, "cuda:1": 10**6}) == ("cuda:0", 500, 499) and gpus.over({}) is None


def test_a_run_that_would_not_fit_is_refused_with_what_fits():
    five = plan_memory(EIGHT_LAYERS, 2, layers=5).pools()["RAM"]
    est = plan_memory(EIGHT_LAYERS, 2)
    check_memory(est, {"RAM": est.pools()["RAM"]})
    with pytest.raises(OverMemory) as e:
        check_memory(est, {"RAM": five})
    message = str(e.value)
    assert "\n" not in message and e.value.pool == "RAM" and e.value.need == est.pools()["RAM"]
    assert message.startswith("eight-layers (8 layers, float32) at tp=2 needs about ")
    assert "keep at most 5 layers with --layers/Layers to keep" in message and MEMORY_ENV in message
    with pytest.raises(OverMemory, match="even one layer would not fit"):
        check_memory(est, {"RAM": 1000})
    assert plan_memory(EIGHT_LAYERS, 2, dtype="auto", random_weights=True).dtype == "bfloat16"


def test_available_memory_and_its_cap(monkeypatch):
    monkeypatch.delenv(MEMORY_ENV, raising=False)
    with open("/proc/meminfo") as f:
        assert "MemAvailable:" in f.read()
    free = available_memory()["RAM"]
    assert free > 0
    monkeypatch.setenv(MEMORY_ENV, "0.5")
    assert available_memory()["RAM"] == min(2**29, free) or free < 2**29 + 2**27  # others come and go
    # each GPU's free memory
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda i: ((i + 1) * 2**28, 2**40))
    assert available_memory("cuda", 3) == {"cuda:0": 2**28, "cuda:1": 2**29, "cuda:2": 2**29}
    monkeypatch.delenv(MEMORY_ENV)
    assert available_memory("cuda", 2) == {"cuda:0": 2**28, "cuda:1": 2**29}
    monkeypatch.setenv(MEMORY_ENV, "off")  # nothing refused
    assert available_memory() == {}
    monkeypatch.setenv(MEMORY_ENV, "lots")
    with pytest.raises(LiveError, match=f"{MEMORY_ENV}='lots' must be a positive number of GiB"):
        available_memory()


def test_verify_refuses_a_run_over_memory_before_anything_is_downloaded(monkeypatch):
    def never(*args, **kwargs):
        raise AssertionError("nothing is downloaded or built")
    monkeypatch.setattr("tpviz.live.check.verify.resolve_model", never)
    monkeypatch.setattr("tpviz.live.check.memory.available_memory",
                        lambda device="cpu", gpus=0: {"RAM": 2**20})
    with pytest.raises(OverMemory, match=r"^Qwen/Qwen3-0.6B \(28 layers, float32\) at tp=2 needs about "):
        verify("Qwen/Qwen3-0.6B", 2, device="cpu")


def test_cli_dry_run_prints_the_estimate_and_a_run_over_it_is_refused(tiny_config, capsys, monkeypatch):
    monkeypatch.delenv(MEMORY_ENV, raising=False)
    assert main([str(tiny_config), "--tp", "2", "--device", "cpu", "--dry-run"]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("memory estimate: 2 ranks × ") and "the tp=1 reference" in out and not err
    one = plan_memory(tiny_config, 2, layers=1, input_shape=(2, 32)).pools()["RAM"]  # the run's default ids
    monkeypatch.setenv(MEMORY_ENV, f"{one / 2**30:.9f}")
    assert main([str(tiny_config), "--tp", "2", "--device", "cpu"]) == 2  # refused before anything runs
    out, err = capsys.readouterr()
    assert err.count("\n") == 1 and "needs about" in err and "--layers" in err and "Layers to keep" not in err


def test_page_shows_the_estimate_before_run_and_refuses_a_run_over_it(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # refused before the checkpoint is downloaded

    def never(*args, **kwargs):
        raise AssertionError("nothing is downloaded or built")
    monkeypatch.setattr("tpviz.live.check.verify.resolve_model", never)
    at = AppTest.from_file(PAGE, default_timeout=60).run()  # the default preset, 2 layers, tp=2
    at.selectbox(key="live_device").set_value("cpu").run()
    assert not at.exception
    line = next(c.value for c in at.caption if c.value.startswith("Memory estimate: 2 ranks × "))
    assert "the tp=1 reference" in line and "peak RAM " in line and "available" in line
    table = at.table[0].value
    assert list(table["who"]) == ["rank 0", "rank 1", "tp=1 reference"] and set(table["memory"]) == {"RAM"}
    one = plan_memory("Qwen/Qwen3-0.6B", 2, layers=1, input_shape=(2, 32)).pools()["RAM"]
    monkeypatch.setattr("tpviz.live.check.memory.available_memory", lambda device="cpu", gpus=0: {"RAM": one})
    at.button(key="live_run").click().run()
    assert not at.exception and len(at.error) == 1
    error = at.error[0].value
    assert error.startswith("Qwen/Qwen3-0.6B (2 layers, float32) at tp=2 needs about ") and "\n" not in error
    assert "keep at most 1 layer with Layers to keep" in error and "--layers" not in error


def test_activations_for_the_input_are_counted_in_every_process():
    """Logits (two copies), every layer's hidden states and eager attention's scores, in float32, for the
    input's batch x seq: in each rank and in the reference."""
    bare, est = plan_memory(EIGHT_LAYERS, 2), plan_memory(EIGHT_LAYERS, 2, input_shape=(2, 32))
    assert est.activations == 4 * (2 * 32 * (2 * 1000 + (8 + 2) * 64) + 2 * 2 * 4 * 32 * 32)
    assert est.pools()["RAM"] - bare.pools()["RAM"] == 3 * est.activations  # 2 ranks and the reference
    huge = plan_memory(EIGHT_LAYERS, 2, input_shape=(10**6, 32))
    with pytest.raises(OverMemory) as e:
        check_memory(huge, {"RAM": 2**30})
    assert "of activations for its 1000000 × 32 input" in str(e.value) and "a shorter input" in str(e.value)


def test_the_input_shape_before_the_model_is_read():
    assert input_shape(None, 2, 32, None, 0) == (2, 32)
    assert input_shape(torch.zeros(3, 5, dtype=torch.long), 2, 32, None, 4) == (3, 9)  # generated tokens too
    assert input_shape(None, 2, 32, "hello", 6) == (1, 6)  # a prompt's own length is known once tokenized
    assert input_shape(None, 0, 32, None, 0) == input_shape(None, 2, True, None, 0) == (0, 0)  # refused later


def test_cli_refuses_an_input_whose_activations_would_not_fit(tiny_config, capsys, monkeypatch):
    monkeypatch.setenv(MEMORY_ENV, "1")
    assert main([str(tiny_config), "--tp", "2", "--device", "cpu", "--batch", "100000000", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert (err.count("\n") == 1 and "of activations for its 100000000 × 32 input" in err
            and "shorter input" in err)

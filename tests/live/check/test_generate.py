"""Prompts and greedy generation on TP and on tp=1 (tpviz.live.check.generate), and memory in the checkpoint's
dtype."""
import json
import re
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from tpviz.live import LiveError, verify
from tpviz.live.check.generate import MAX_NEW_TOKENS, explain, step_diffs
from tpviz.live.check.report import rank_figure
from tpviz.cli.verify import main

from tests.live.checks import add_tokenizer


@pytest.fixture(scope="module")
def with_tokenizer(tiny, tmp_path_factory):
    """A copy of the tiny Qwen3 checkpoint with a tokenizer (the shared fixture's folder stays without
    one)."""
    folder = tmp_path_factory.mktemp("tok") / "qwen3"
    shutil.copytree(tiny["qwen3"][0], folder)
    add_tokenizer(folder, tiny["qwen3"][1].config.vocab_size)
    return folder


@pytest.mark.slow
def test_tp_and_tp1_write_the_same_text_in_fp32(with_tokenizer):
    result, _ = verify(with_tokenizer, 2, device="cpu", prompt="t1 t2 t3 t4 t5", generate=6)
    g = result.generation
    assert result.passed and result.input_shape == [1, 5] and g.prompt_ids == [1, 2, 3, 4, 5]
    assert g.prompt_text == "t1 t2 t3 t4 t5" and g.tp_text == g.ref_text and len(g.tp_tokens) == 6
    assert g.tp_text == " ".join(f"t{i}" for i in g.tp_tokens)  # decoded with the folder's tokenizer
    assert g.diverged_at is None and g.layers == [] and len(g.steps) == 6
    assert g.explanation.startswith("Identical for all 6 new tokens") and "float32 tolerance" in g.explanation
    assert "generate" in result.phases and result.to_dict()["schema"] == "tpviz.verify/4"
    lines = result.summary().splitlines()
    assert f'    tp=2   "{g.tp_text}"' in lines and f'    tp=1   "{g.ref_text}"' in lines
    assert any(line.startswith("    Identical for all 6 new tokens; ") for line in lines)


@pytest.mark.slow
def test_an_injected_bug_diverges_and_that_step_is_compared_stage_by_stage(with_tokenizer):
    # with these weights skip-allreduce keeps the first pick and changes the second: that step is replayed
    result, _ = verify(with_tokenizer, 2, device="cpu", prompt="t7 t100 t3", generate=4,
                       inject=["skip-allreduce"])
    g = result.generation
    assert not result.passed and g.diverged_at == 1 and g.tp_tokens[0] == g.ref_tokens[0]
    assert g.tp_tokens[1] != g.ref_tokens[1] and g.tp_text != g.ref_text
    assert [d.name for d in g.layers] == ["embed", "layer 0", "layer 1", "final norm", "logits"]
    assert g.first_stage == "layer 0" and g.layers[0].max_abs == 0 and g.layers[1].exceeds
    assert g.noise_explained is False and "NOT explained by float noise" in g.explanation
    assert "first differ at new token #2 of 4 (position 4)" in g.divergence("tp=2")
    text = result.summary()
    assert "per stage max|Δ| at new token #2 (same 4 input tokens on both):" in text
    assert json.loads(json.dumps(result.to_dict()))["generation"]["diverged_at"] == 1


def _steps(gap: float, floor: float, limit: float | None = None) -> list:
    from tpviz.live.check.results import LayerDiff
    limit = 4 * floor if limit is None else limit
    return [LayerDiff("new token #1", gap, gap, limit, floor, not gap <= limit)]


def test_a_flip_within_the_noise_floor_is_float_noise():
    ref = torch.tensor([[0.0, 5.0, 4.996, 1.0]])  # tp=1 picks 1; its runner-up 2 trails by 0.004
    g = explain(_steps(0.003, 0.01), [2], [1], ref, None, "bfloat16", decode=lambda ids: f"w{ids[0]}")
    assert g["diverged_at"] == 0 and g["noise_explained"] is True
    assert abs(g["margin"] - 0.004) < 1e-4 and g["floor"] == 0.01
    assert 'top two logits ("w1" 5, "w2" 4.996) differ by only 0.004' in g["explanation"]
    assert "below the bfloat16 noise floor 0.01" in g["explanation"]
    assert g["explanation"].endswith("so the flip is float noise, not a TP bug.")


def test_a_flip_with_a_large_margin_is_not_noise():
    ref = torch.tensor([[0.0, 5.0, 1.0, 2.0]])  # tp=1 leads TP's pick (2, its #3) by 4
    g = explain(_steps(3.0, 0.01), [2], [1], ref, None, "bfloat16", first_stage="layer 0")
    assert g["noise_explained"] is False and g["margin"] == 4.0
    assert ("TP's pick (#2, tp=1's #3, 1)" in g["explanation"]
            and "4e+02× the bfloat16 noise floor" in g["explanation"])
    assert ("NOT explained by float noise; look for a TP bug (first beyond "
            "tolerance at layer 0)") in g["explanation"]


def test_a_late_flip_reports_how_close_the_earlier_steps_were():
    tp = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.4995, 0.5]])
    ref = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.5, 0.4995]])  # step 3: a 5e-4 margin flipped
    ref32 = torch.tensor([[1.0, 0.002], [0.0, 1.001], [0.5, 0.5002]])  # fp32 itself prefers token 1 there
    steps = step_diffs(tp, ref, ref32, "bfloat16")
    assert ([s.name for s in steps] == ["new token #1", "new token #2", "new token #3"]
            and steps[0].max_abs == 0)
    g = explain(steps, [0, 1, 1], [0, 1, 0], ref, ref32, "bfloat16")
    assert g["diverged_at"] == 2 and g["noise_explained"] is True
    assert g["explanation"].startswith("Up to new token #2 the last position's logits "
                                       "matched exactly. At new token #3 tp=1's top two logits "
                                       "(#0 0.5, #1 0.4995) differ by only 0.0005")
    assert "(float32 tp=1 picks #1 too)" in g["explanation"]


def test_bad_generation_requests_are_one_line(tiny_config, with_tokenizer):
    cases = [(dict(model=tiny_config, generate=3), "generating text needs --prompt/Prompt"),
             (dict(model=tiny_config, generate=MAX_NEW_TOKENS + 1, input_ids=[[1, 2]]), "at most 128"),
             (dict(model=tiny_config, generate=-1, input_ids=[[1, 2]]), "whole number of new tokens"),
             (dict(model=tiny_config, generate=2, input_ids=[[1, 2], [3, 4]]), "one row of token ids, not 2"),
             (dict(model=tiny_config, prompt="hello"),
              "has no tokenizer (random weights come from its config alone"),
             (dict(model=with_tokenizer, prompt="t1", input_ids=[[1]]), "not both"),
             (dict(model=with_tokenizer, prompt="  "), "the prompt is empty"),
             (dict(model=tiny_config, dtype="int8"), "must be one of: auto, float32")]
    for kwargs, match in cases:
        with pytest.raises(LiveError, match=re.escape(match)) as e:
            verify(kwargs.pop("model"), 2, device="cpu", **kwargs)
        assert "\n" not in str(e.value)


@pytest.mark.slow
def test_cli_prompt_and_generate_print_both_texts(with_tokenizer, capsys):
    code = main([str(with_tokenizer), "--tp", "2", "--device", "cpu", "--prompt", "t1 t2 t3 t4 t5",
                 "--generate", "3"])
    out, err = capsys.readouterr()
    assert code == 0 and err == ""
    assert '    prompt "t1 t2 t3 t4 t5"' in out and "generated 3 new tokens greedily" in out
    tp_line = next(line for line in out.splitlines() if line.startswith("    tp=2 "))
    ref_line = next(line for line in out.splitlines() if line.startswith("    tp=1 "))
    assert tp_line.split(None, 1)[1] == ref_line.split(None, 1)[1] and "Identical for all 3 new tokens" in out


def test_without_a_tokenizer_a_prompt_of_token_ids_is_taken_as_ids(tiny):
    folder = tiny["qwen3"][0]  # the shared tiny checkpoint has no tokenizer
    result, _ = verify(folder, 2, device="cpu", prompt="5, 17 42", generate=2)
    assert (result.passed and result.generation.prompt_ids == [5, 17, 42]
            and result.generation.prompt_text is None)
    assert len(result.generation.tp_tokens) == 2


def test_cli_bad_generation_flags_exit_2(tiny_config, capsys):
    for argv, match in [(["--generate", "0"], "--generate 0 must be a positive number"),
                        (["--generate", "-2"], "--generate -2 must be a positive number"),
                        (["--generate", "4"],
                         "generating text needs --prompt TEXT (a model with a tokenizer) or "
                                              "--input-ids to continue"),
                        (["--generate", "999", "--prompt", "x"], "has no tokenizer"),
                        (["--prompt", "hi"], "give token ids such as 1 2 3 instead of text")]:
        code = main([str(tiny_config), "--tp", "2", "--device", "cpu", *argv])
        out, err = capsys.readouterr()
        assert code == 2 and err.count("\n") == 1 and match in err, (argv, err)


def _bf16_copy(src, dst):
    shutil.copytree(src, dst)
    tensors = load_file(str(dst / "model.safetensors"))
    save_file({k: v.to(torch.bfloat16) for k, v in tensors.items()}, str(dst / "model.safetensors"),
              metadata={"format": "pt"})
    return dst


@pytest.mark.slow
def test_a_bf16_checkpoint_at_tp2_holds_about_half_per_rank_in_its_own_dtype(tiny, tmp_path):
    folder = _bf16_copy(tiny["qwen2"][0], tmp_path / "bf16")  # untied: embedding and lm_head both split
    result, _ = verify(folder, 2, device="cpu", seq_len=4)  # the run upcasts to float32 (the default)
    assert result.checkpoint_dtype == "bfloat16" and result.dtype == "float32"
    for r in result.ranks:
        assert r.stored_dtype == "bfloat16" and 0.45 < r.stored_bytes / r.checkpoint_bytes < 0.6
        assert r.param_bytes == 2 * r.stored_bytes  # the same parameters, in float32
        row = r.row()
        assert (row["held MiB (bfloat16)"] < row["held MiB (float32, as run)"]
                and 45 < row["held % of checkpoint"] < 60)
    fig = rank_figure(result)
    assert [t.name for t in fig.data] == ["read from checkpoint (bfloat16)", "held, in bfloat16",
                                          "held, in the run's float32"]
    total = result.ranks[0].checkpoint_bytes / 2**20
    assert all(0.45 * total < y < 0.6 * total for y in fig.data[1].y)  # each rank: about half the line
    assert "2x the bytes" in fig.layout.title.subtitle.text
    auto, _ = verify(folder, 2, device="cpu", seq_len=4, dtype="auto")  # auto: the checkpoint's own dtype
    assert auto.dtype == "bfloat16" and auto.noise_floor is not None
    assert any(n.startswith("dtype auto: bfloat16") for n in auto.notes)
    assert auto.ranks[0].param_bytes == auto.ranks[0].stored_bytes
    assert [t.name for t in rank_figure(auto).data] == ["read from checkpoint (bfloat16)",
                                                        "held, in bfloat16"]

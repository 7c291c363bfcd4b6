"""Generation stops at the checkpoint's EOS token(s), on TP and on tp=1, each on its own picks."""
import json
import shutil

import pytest

from tpviz.live import verify
from tpviz.live.check.generate import eos_token_ids

from tests.live.checks import add_tokenizer

PROMPT = "t1 t2 t3 t4 t5"


@pytest.fixture
def folder(tiny, tmp_path):
    """A copy of the tiny Qwen3 checkpoint with a tokenizer; its config names no EOS until a test says one."""
    out = tmp_path / "qwen3"
    shutil.copytree(tiny["qwen3"][0], out)
    add_tokenizer(out, tiny["qwen3"][1].config.vocab_size)
    return out


def _set(folder, name: str, **fields) -> None:
    path = folder / name
    path.write_text(json.dumps({**(json.loads(path.read_text()) if path.is_file() else {}), **fields}))


def test_eos_ids_come_from_generation_config_then_config_json(tmp_path):
    assert eos_token_ids(tmp_path) == [] and eos_token_ids(None) == []
    _set(tmp_path, "config.json", text_config={"eos_token_id": 7})  # multimodal: the text decoder's
    assert eos_token_ids(tmp_path) == [7]
    _set(tmp_path, "config.json", eos_token_id=[2, "x", True, -1, 3])
    assert eos_token_ids(tmp_path) == [2, 3]
    (tmp_path / "generation_config.json").write_text("{not json")  # unreadable: config.json still says it
    assert eos_token_ids(tmp_path) == [2, 3]
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": 5}))
    assert eos_token_ids(tmp_path) == [5]


def _first_new(tokens: list[int]) -> int:
    """The first step (after step 0) whose token was not picked before: an EOS there stops the run there."""
    return next(s for s in range(1, len(tokens)) if tokens[s] not in tokens[:s])


@pytest.mark.parametrize("tp", [1, pytest.param(2, marks=pytest.mark.slow)])
def test_both_runs_stop_at_eos_and_say_so(folder, tp):
    free, _ = verify(folder, 1, device="cpu", prompt=PROMPT, generate=6)  # no EOS yet: all 6 tokens
    tokens = free.generation.ref_tokens
    stop = _first_new(tokens)
    _set(folder, "generation_config.json", eos_token_id=[tokens[stop], 1000])
    result, _ = verify(folder, tp, device="cpu", prompt=PROMPT, generate=6)
    g = result.generation
    assert g.eos_token_ids == [tokens[stop], 1000] and g.new_tokens == 6
    assert g.tp_tokens == g.ref_tokens == tokens[:stop + 1] and g.tp_stopped_at_eos and g.ref_stopped_at_eos
    assert g.diverged_at is None and len(g.steps) == stop + 1 and result.passed
    assert g.explanation.startswith(f'Identical for all {stop + 1} new tokens (both stopped at '
                                    f'EOS "t{tokens[stop]}")')
    assert g.divergence(result.layout) == f"identical for all {stop + 1} new tokens (both stopped at EOS)"
    text = result.summary()
    assert f"generated up to 6 new tokens greedily (stopping at EOS #{tokens[stop]}, #1000)" in text
    assert f'    tp=1   "{g.ref_text}" (stopped at EOS after {stop + 1} tokens)' in text.splitlines()
    assert json.loads(json.dumps(result.to_dict()))["generation"]["tp_stopped_at_eos"] is True


@pytest.mark.slow
def test_one_run_stopping_where_the_other_goes_on_is_the_divergence(folder):
    """Every token outside tp=1's own continuation is EOS (config.json's, the fallback): tp=1 never stops, and
    the buggy TP stops at its first pick that leaves tp=1's text."""
    free, _ = verify(folder, 1, device="cpu", prompt="t7 t100 t3", generate=4)
    ref = free.generation.ref_tokens
    vocab = json.loads((folder / "config.json").read_text())["vocab_size"]
    _set(folder, "config.json", eos_token_id=[i for i in range(vocab) if i not in ref])
    result, _ = verify(folder, 2, device="cpu", prompt="t7 t100 t3", generate=4, inject=["skip-allreduce"])
    g = result.generation
    d = g.diverged_at
    assert d is not None and g.ref_tokens == ref and g.tp_tokens[:d] == ref[:d] and len(g.tp_tokens) == d + 1
    assert g.tp_stopped_at_eos and not g.ref_stopped_at_eos
    assert g.divergence("tp=2").endswith(f'tp=2 "t{g.tp_tokens[d]}" #{g.tp_tokens[d]} vs tp=1 "t{ref[d]}" '
                                         f"#{ref[d]}, where tp=2 stopped at EOS")
    assert "NOT explained by float noise" in g.explanation
    if d:  # the diverging step was re-run on tp=1 and compared stage by stage
        assert [x.name for x in g.layers][-1] == "logits" and g.first_stage is not None

"""The rule sets as objects: divide, KV split/replication, vocab padding, tp and rules checks, error
classes."""
import pytest

from tpviz.errors import ConfigError, HubError, SourceError, TPSizeError, TpvizError, WeightsError
from tpviz.rules import RULE_SETS, RULES, RuleSet, check_tp, divide, ruleset


def one_line(e: BaseException) -> str:
    msg = str(e)
    assert msg and "\n" not in msg, repr(msg)
    return msg


def test_error_classes_are_value_errors_with_one_line():
    for cls in (TpvizError, TPSizeError, ConfigError, SourceError, HubError, WeightsError):
        assert issubclass(cls, ValueError)
        assert str(cls("two\nlines  and\ttabs")) == "two lines and tabs"
    assert issubclass(HubError, SourceError) and issubclass(WeightsError, SourceError)


def test_divide():
    assert divide(4096, 8) == 512
    with pytest.raises(TPSizeError) as err:
        divide(14, 4, "num_attention_heads")
    assert one_line(err.value) == "num_attention_heads=14 is not divisible by tp_size=4"


@pytest.mark.parametrize("kv, tp, expected", [(8, 1, (8, 1)), (8, 2, (4, 1)), (8, 8, (1, 1)), (8, 16, (1, 2)),
                                              (4, 16, (1, 4)), (1, 8, (1, 8)), (2, 2, (1, 1))])
def test_kv_split_vllm(kv, tp, expected):
    assert ruleset("vllm").kv_split(kv, tp) == expected


def test_kv_split_messages():
    with pytest.raises(TPSizeError) as err:
        ruleset("vllm").kv_split(8, 3)
    assert one_line(err.value) == (
        "num_key_value_heads=8 is not divisible by tp_size=3, and tp_size is not a multiple of it")
    with pytest.raises(TPSizeError) as err:
        ruleset("vllm").kv_split(8, 12)  # 12 is neither a divisor nor a multiple of 8
    assert "num_key_value_heads=8" in one_line(err.value) and "tp_size=12" in str(err.value)
    with pytest.raises(TPSizeError) as err:
        ruleset("nano-vllm").kv_split(8, 16)
    msg = one_line(err.value)
    assert msg.startswith("num_key_value_heads=8 is not divisible by tp_size=16") and "nano-vllm" in msg
    assert "replicate" in msg
    with pytest.raises(TPSizeError) as err:
        ruleset("nano-vllm").kv_split(8, 3)
    assert "num_key_value_heads=8" in one_line(err.value) and "tp_size=3" in str(err.value)
    assert ruleset("nano-vllm").kv_split(8, 4) == (2, 1)


@pytest.mark.parametrize("vocab, padded", [(32000, 32000), (32064, 32064), (128256, 128256), (151936, 151936),
                                           (1000, 1024), (1, 64), (65, 128), (64, 64)])
def test_padded_vocab(vocab, padded):
    assert ruleset("vllm").padded_vocab(vocab) == padded
    assert ruleset("nano-vllm").padded_vocab(vocab) == vocab


def test_rule_sets_are_looked_up_by_name():
    assert RULES == ("vllm", "vllm-0.28", "sglang", "nano-vllm")
    for r in RULES:
        assert isinstance(ruleset(r), RuleSet) and ruleset(r).name == r and ruleset(ruleset(r)) is ruleset(r)
    assert [r.label for r in RULE_SETS.values()] == ["vLLM 0.33", "vLLM 0.28", "SGLang 0.5.23", "nano-vllm"]
    for bad in ("VLLM", "", "trtllm", None, 3):
        with pytest.raises(TpvizError) as err:
            ruleset(bad)
        assert "vllm" in one_line(err.value) and "nano-vllm" in str(err.value)


@pytest.mark.parametrize("tp", [0, -1, -8, 2.0, "2", None, True, False, [2]])
def test_check_tp_rejects(tp):
    with pytest.raises(TPSizeError) as err:
        check_tp(tp)
    assert "tp_size" in one_line(err.value)


def test_check_tp_huge_and_ranks():
    check_tp(1)
    check_tp(64, 63)
    with pytest.raises(TPSizeError) as err:
        check_tp(10**20)
    assert "tp_size" in one_line(err.value)
    for rank in (-1, 4, 1.0, True):
        with pytest.raises(TPSizeError) as err:
            check_tp(4, rank)
        assert "tp_rank" in one_line(err.value)


def test_errors_carry_structured_fields():
    with pytest.raises(TPSizeError) as e:
        divide(14336, 3, "intermediate_size")
    assert (e.value.quantity, e.value.value, e.value.tp,
            e.value.generic) == ("intermediate_size", 14336, 3, False)
    from tpviz import shard_map
    from tpviz.errors import MissingFieldError, NotJSONError
    from tpviz.config.files import parse_config
    # a layer's own 'output_size' is renamed to the config key behind it
    with pytest.raises(TPSizeError) as e:
        shard_map("Qwen/Qwen3-8B", 3)
    assert ((e.value.quantity, e.value.value, e.value.tp) == ("num_attention_heads", 32, 3)
            and not e.value.generic)
    with pytest.raises(MissingFieldError) as e:
        shard_map({"model_type": "llama", "num_attention_heads": 8, "num_hidden_layers": 2,
                   "intermediate_size": 64, "vocab_size": 100}, 1)
    assert e.value.field == "hidden_size" and isinstance(e.value, ConfigError)
    with pytest.raises(NotJSONError):
        parse_config(b"{nope")


def test_nano_vllm_engine_runs_at_most_8_gpus_and_qwen3_alone(capsys):
    """nanovllm/config.py asserts 1 <= tensor_parallel_size <= 8 and its ModelRunner builds Qwen3ForCausalLM
    whatever the checkpoint: the maps stay (they are the layer classes'), and say what the engine would not
    run."""
    from tpviz import shard_map
    from tpviz.cli.main import main
    from tpviz.config.sources import presets
    qwen3 = dict(presets()["Qwen/Qwen3-8B"], num_key_value_heads=32)  # 32 KV heads: tp 16 splits them
    assert not shard_map(qwen3, 8, "nano-vllm").warnings
    warning, = shard_map(qwen3, 16, "nano-vllm").warnings
    assert warning.startswith("nano-vllm's engine runs at most 8 GPUs")
    assert not shard_map(qwen3, 16, "vllm").warnings
    only = ("nano-vllm's engine builds Qwen3ForCausalLM only, so for llama this shows its layer "
            "classes' rules, not a model it can serve")
    assert shard_map("meta-llama/Llama-2-7b-hf", 2, "nano-vllm").warnings == [only]
    # per tp: the GPU limit; for the model: the engine note
    assert main(["valid", "meta-llama/Llama-2-7b-hf"]) == 0
    out = capsys.readouterr().out
    assert "valid (warning below)" in out and "warning: nano-vllm's engine runs at most 8 GPUs" in out
    assert out.endswith(f"note (nano-vllm column): {only}\n")
    assert main(["plan", "meta-llama/Llama-2-7b-hf", "--gpus", "2", "--gpu-mem", "80", "--rules", "nano-vllm",
                 "--context", "4096"]) == 0
    assert capsys.readouterr().out.endswith(f"note: {only}\n")
    assert main(["valid", "Qwen/Qwen3-8B"]) == 0 and "Qwen3ForCausalLM" not in capsys.readouterr().out

"""explorer.tables: the collectives and valid-tp tables as the explorer shows them."""
from explorer.tables import collective_rows, valid_tp_rows
from tpviz import shard_map
from tpviz.trace.validity import valid_table


def test_collective_rows_in_readable_units():
    rows = collective_rows(shard_map("Qwen/Qwen3-8B", 4))
    assert rows[0]["per forward"] == 36 and rows[0]["size / token"] == "8.00 KiB"
    # 151936 x 2 bytes
    assert rows[-1]["collective"] == "all-gather" and rows[-1]["size / token"] == "296.75 KiB"
    assert rows[-1]["sent per GPU / token"] == "222.56 KiB"  # 3/4 of it: the ring all-gather


def test_valid_tp_rows_mark_each_rule_set():
    shown = valid_tp_rows(valid_table("Qwen/Qwen3-8B", 8)[1])
    assert shown[3] == {"tp": 4, "vLLM 0.33": "✓", "vLLM 0.28": "✓", "SGLang 0.5.23": "✓", "nano-vllm": "✓"}
    assert shown[2]["vLLM 0.33"].startswith("✗ num_attention_heads=32")

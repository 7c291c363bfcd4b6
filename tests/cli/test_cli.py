"""The CLI: `python -m tpviz map/valid`, in-process through tpviz.cli.main.main and once as a real
subprocess."""
import json
import os
import subprocess
import sys

import pytest

from tpviz import shard_map
from tpviz.cli.main import main
from tests.paths import ROOT

TINY = {"model_type": "llama", "hidden_size": 256, "num_attention_heads": 8, "num_key_value_heads": 4,
        "intermediate_size": 512, "vocab_size": 1000, "num_hidden_layers": 2}


@pytest.fixture(autouse=True)
def offline_env(tmp_path, monkeypatch):
    """No hub access and no local-path confinement for any CLI test."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-hf-cache"))
    monkeypatch.delenv("TPVIZ_LOCAL_ROOT", raising=False)


def run_main(capsys, *argv):
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def test_map_prints_summary_and_writes_json(tmp_path, capsys):
    path = tmp_path / "out" / "map.json"
    path.parent.mkdir()
    rc, out, err = run_main(capsys, "map", "meta-llama/Llama-3.1-8B", "--tp", "8", "--json", str(path))
    assert rc == 0 and err == ""
    lines = out.splitlines()
    assert lines[0].startswith("meta-llama/Llama-3.1-8B") and "tp=8" in lines[0] and "rules=vllm" in lines[0]
    m = shard_map("meta-llama/Llama-3.1-8B", 8)
    for t in m.tensors:
        assert any(line.startswith(t.name + " ") for line in lines), t.name
    q_line = next(line for line in lines if line.startswith("model.layers.*.self_attn.q_proj.weight"))
    assert "r0:0-511" in q_line and "r7:3584-4095" in q_line
    assert sum(line.startswith("rank ") for line in lines) == 8
    assert f"wrote {path}" in out
    d = json.loads(path.read_text())
    assert d["schema"] == "tpviz.shardmap/4" and d["tp_size"] == 8 and d["rules"] == "vllm"
    assert d == m.to_dict()


def test_map_nano_vllm_rules(tmp_path, capsys):
    path = tmp_path / "m.json"
    rc, out, _ = run_main(capsys, "map", "Qwen/Qwen3-8B", "--tp", "4", "--rules", "nano-vllm",
                          "--json", str(path))
    assert rc == 0 and "rules=nano-vllm" in out.splitlines()[0]
    assert json.loads(path.read_text()) == shard_map("Qwen/Qwen3-8B", 4, rules="nano-vllm").to_dict()


def test_map_local_config(tmp_path, capsys):
    f = tmp_path / "tiny" / "config.json"
    f.parent.mkdir()
    f.write_text(json.dumps(TINY))
    rc, out, _ = run_main(capsys, "map", str(f.parent), "--tp", "8", "--json", str(tmp_path / "t.json"))
    assert rc == 0 and out.startswith("tiny  tp=8")
    assert json.loads((tmp_path / "t.json").read_text()) == shard_map(str(f), 8).to_dict()


def test_valid_lists_both_rule_sets(capsys):
    rc, out, err = run_main(capsys, "valid", "meta-llama/Llama-3.1-8B", "--max-tp", "16")
    assert rc == 0 and err == ""
    lines = out.splitlines()
    # Llama
    assert lines[-1].startswith("note (nano-vllm column): nano-vllm's engine builds Qwen3ForCausalLM only")
    rows = {int(line.split()[0]): line for line in lines[2:-1]}
    assert sorted(rows) == list(range(1, 17))
    assert rows[8].split()[1:] == ["valid", "valid", "valid", "valid"]
    # vLLM replicates
    assert rows[16].split()[1:3] == ["valid", "valid"] and "num_key_value_heads=8" in rows[16]
    assert rows[3].count("num_attention_heads=32 is not divisible by tp_size=3") == 4
    assert out.splitlines()[1].split()[1:] == ["vLLM", "0.33", "vLLM", "0.28", "SGLang",
                                               "0.5.23", "nano-vllm"]


def test_valid_says_what_vllm_does_beyond_the_verdicts(capsys):
    """Step-3.7-Flash's layout is valid under vLLM 0.33 rules, but the released vLLM 0.33.0 cannot read its
    config: the table says so under its column (the wrapper record's note), beside the decoder's own."""
    rc, out, _ = run_main(capsys, "valid", "stepfun-ai/Step-3.7-Flash", "--max-tp", "2")
    notes = [line for line in out.splitlines() if line.startswith("note (vLLM 0.33 column): ")]
    assert rc == 0 and any("vLLM 0.33.0 as released stops while reading this config" in n for n in notes)
    assert any("MTP layers" in n for n in notes)
    rc, out, _ = run_main(capsys, "valid", "stepfun-ai/Step-3.7-Flash", "--max-tp", "2", "--json")
    assert any("as released stops" in n for n in json.loads(out)["notes"]["vllm"])


def test_valid_default_max_tp(capsys):
    rc, out, _ = run_main(capsys, "valid", "Qwen/Qwen3-0.6B")
    assert rc == 0 and out.splitlines()[-1].split()[0] == "64"


BAD = {
    "unknown model": ["map", "no-such-model", "--tp", "2"],
    "tp not dividing heads": ["map", "Qwen/Qwen3-8B", "--tp", "3"],
    "tp 0": ["map", "Qwen/Qwen3-8B", "--tp", "0"],
    "tp negative": ["map", "Qwen/Qwen3-8B", "--tp", "-4"],
    "tp not a number": ["map", "Qwen/Qwen3-8B", "--tp", "two"],
    "tp huge": ["map", "Qwen/Qwen3-8B", "--tp", "99999999999999999999"],
    "bad rules": ["map", "Qwen/Qwen3-8B", "--tp", "2", "--rules", "trtllm"],
    "no tp": ["map", "Qwen/Qwen3-8B"],
    "malformed JSON": ["map", "{tmp}/malformed.json", "--tp", "2"],
    "missing fields": ["map", "{tmp}/missing.json", "--tp", "2"],
    "wrong type": ["map", "{tmp}/wrong.json", "--tp", "2"],
    "JSON list": ["map", "{tmp}/list.json", "--tp", "2"],
    "folder without config.json": ["map", "{tmp}/empty-folder", "--tp", "2"],
    "absent file": ["map", "{tmp}/absent.json", "--tp", "2"],
    "offline hub id": ["map", "someone-unknown/some-model", "--tp", "2"],
    "unwritable --json": ["map", "Qwen/Qwen3-8B", "--tp", "2", "--json", "{tmp}/no-dir/x.json"],
    "valid unknown model": ["valid", "no-such-model"],
    "valid max-tp 0": ["valid", "Qwen/Qwen3-8B", "--max-tp", "0"],
    "valid malformed JSON": ["valid", "{tmp}/malformed.json"],
    "unknown command": ["frobnicate"],
    "no command": [],
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_exits_2_with_one_line(case, tmp_path, capsys):
    (tmp_path / "malformed.json").write_text("{\"hidden_size\": 4096,")
    (tmp_path / "missing.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 4096}))
    (tmp_path / "wrong.json").write_text(json.dumps({**TINY, "num_attention_heads": "eight"}))
    (tmp_path / "list.json").write_text("[1, 2]")
    (tmp_path / "empty-folder").mkdir()
    argv = [a.replace("{tmp}", str(tmp_path)) for a in BAD[case]]
    rc, _, err = run_main(capsys, *argv)
    assert rc == 2, argv
    assert err.endswith("\n") and err.count("\n") == 1 and err.startswith("error: "), (argv, err)
    assert "Traceback" not in err, argv


OUTPUT_FIRST = {  # refused before any map is printed, with what would work
    ("--json", "{tmp}"): "--json {tmp} is a folder; give a file name, such as {tmp}/map.json",
    ("--json", "{tmp}/no-dir/x.json"): "--json {tmp}/no-dir/x.json: the folder {tmp}/no-dir does not exist",
    ("--png", "{tmp}/a-file"): "--png {tmp}/a-file is a file; give a folder to write the PNGs into",
    ("--util", "0.8"): "--util only apply with --gpu-mem GIB (they size the KV cache on a GPU)",
    ("--placement",
     "round_robin"): "--placement places whole experts under --ep: add --ep, or drop --placement",
    ("--dp", "1000"): "tp × pp × dp = 2000 GPUs; tpviz maps deployments of up to 1024",
}


@pytest.mark.parametrize("flag, value", list(OUTPUT_FIRST))
def test_flags_that_cannot_apply_are_refused_before_any_output(flag, value, tmp_path, capsys):
    (tmp_path / "a-file").write_text("")
    rc, out, err = run_main(capsys, "map", "Qwen/Qwen3-30B-A3B", "--tp", "2", flag,
                            value.replace("{tmp}", str(tmp_path)))
    assert (rc == 2 and out == ""
            and err == f"error: {OUTPUT_FIRST[flag, value]}\n".replace("{tmp}", str(tmp_path)))


def test_a_layout_names_its_own_figures(capsys):
    """The plain tp rows are labelled as such; the fit line follows the layout's GPUs, whose fullest it sizes;
    a tp x dp cut of the experts that fails says so, not a tp the user never typed."""
    rc, out, _ = run_main(capsys, "map", "Qwen/Qwen3-30B-A3B", "--tp", "2", "--pp", "2", "--gpu-mem", "80")
    lines = out.splitlines()
    tp_only = next(i for i, line in enumerate(lines) if line.startswith("tp only, every layer on each rank"))
    assert rc == 0 and lines[tp_only + 1].startswith("rank 0: weights")
    assert max(i for i, line in enumerate(lines) if line.startswith("GPU ")) < next(
        i for i, line in enumerate(lines) if line.startswith("fit: "))
    rc, out, _ = run_main(capsys, "plan", "Qwen/Qwen3-235B-A22B-FP8", "--gpus", "8",
                          "--gpu-mem", "80", "--rules", "vllm-0.28")
    row = next(line for line in out.splitlines() if line.startswith("TP 1 × PP 1 × DP 8  "))
    assert "rejected: without expert parallelism the experts are cut tp × dp = 8 ways: " in row


def test_offline_hub_message(tmp_path, capsys):
    rc, _, err = run_main(capsys, "map", "someone-unknown/some-model", "--tp", "2")
    assert rc == 2 and "someone-unknown/some-model" in err and "HF_HUB_OFFLINE" in err


def subprocess_env(tmp_path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(tmp_path / "hf")}
    env.pop("TPVIZ_LOCAL_ROOT", None)
    return env


def test_subprocess_map_and_bad_input(tmp_path):
    env = subprocess_env(tmp_path)
    path = tmp_path / "map.json"
    ok = subprocess.run([sys.executable, "-m", "tpviz", "map", "Qwen/Qwen3-30B-A3B", "--tp", "8",
                         "--json", str(path)],
                        capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120)
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.startswith("Qwen/Qwen3-30B-A3B  tp=8") and ok.stderr == ""
    assert json.loads(path.read_text()) == shard_map("Qwen/Qwen3-30B-A3B", 8).to_dict()
    bad = subprocess.run([sys.executable, "-m", "tpviz", "map", "Qwen/Qwen3-8B", "--tp", "3"],
                         capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120)
    assert bad.returncode == 2 and bad.stdout == ""
    assert (bad.stderr
            == "error: num_attention_heads=32 is not divisible by tp_size=3. Valid tp sizes under vLLM 0.33 "
               "rules: 1, 2, 4, 8, 16, 32.\n")

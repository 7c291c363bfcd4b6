"""`tpviz verify`: exit 0 on pass, 1 on mismatch, 2 on bad input with one line on stderr; also under
torchrun."""
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from tpviz.cli.verify import main
from tests.paths import ROOT



def test_pass_writes_json_and_logits(tiny, tmp_path, capsys):
    folder, hf_model = tiny["qwen3"]
    ids = tmp_path / "ids.safetensors"
    save_file({"input_ids": torch.tensor([[1, 2, 3, 1000], [4, 5, 6, 7]])}, str(ids))
    out_json, out_logits = tmp_path / "r.json", tmp_path / "logits.safetensors"
    code = main([str(folder), "--tp", "1", "--device", "cpu", "--input-ids", str(ids),
                 "--json", str(out_json), "--dump-logits", str(out_logits), "--inject", "wrong-kv-head"])
    out, err = capsys.readouterr()
    assert code == 0 and err == "" and out.startswith("PASS")
    assert "NO EFFECT" in out  # tp=1 cannot be affected by an injected TP bug
    report = json.loads(out_json.read_text())
    assert (report["schema"] == "tpviz.verify/4" and report["verdict"] == "PASS"
            and report["input_shape"] == [2, 4])
    logits = load_file(str(out_logits))["logits"]
    assert logits.dtype == torch.float32 and list(logits.shape) == [2, 4, hf_model.config.vocab_size]
    with torch.no_grad():
        assert (logits - hf_model(torch.tensor([[1, 2, 3, 1000], [4, 5, 6, 7]])).logits).abs().max() < 1e-4


@pytest.mark.slow
def test_mismatch_exits_1(tiny_config, tmp_path, capsys):
    ids = tmp_path / "ids.json"
    ids.write_text("[[1, 2, 3, 4, 5, 6]]")
    code = main([str(tiny_config), "--tp", "2", "--device", "cpu", "--input-ids", str(ids), "--inject",
                 "skip-allreduce", "--quiet"])
    out, err = capsys.readouterr()
    assert code == 1 and out.startswith("MISMATCH") and "diverges at layer 0" in out and err == ""


def _bad_inputs(cfg: Path, tmp: Path) -> list[tuple[list[str], str]]:
    (tmp / "bad.json").write_text("[[1, 2], [3]]")
    (tmp / "far.json").write_text("[[1, 99999]]")
    (tmp / "ids.txt").write_text("1 2 3")
    save_file({"tokens": torch.tensor([[1, 2]])}, str(tmp / "noids.safetensors"))
    (tmp / "broken.json").write_text("{not json")
    (tmp / "empty.json").write_text("[]")
    return [([str(cfg), "--tp", "3"], "not divisible by tp_size=3"),
            ([str(cfg), "--tp", "0"], "must be a positive integer"),
            ([str(cfg)], "--tp N is required"),
            ([str(cfg), "--tp", "2", "--dtype", "int8"], "invalid choice"),
            ([str(cfg), "--tp", "2", "--inject", "nope"], "invalid choice"),
            ([str(cfg), "--tp", "2", "--device", "cuda"] if not torch.cuda.is_available()
             else [str(cfg), "--tp", "x"], "no CUDA GPU" if not torch.cuda.is_available() else "invalid int"),
            ([str(cfg), "--tp", "2", "--input-ids", str(tmp / "bad.json")], "equal-length rows"),
            ([str(cfg), "--tp", "2", "--input-ids", str(tmp / "far.json")], "outside the vocabulary"),
            ([str(cfg), "--tp", "2", "--input-ids", str(tmp / "ids.txt")],
             "must end in .safetensors or .json"),
            ([str(cfg), "--tp", "2", "--input-ids", str(tmp / "noids.safetensors")], "no input_ids tensor"),
            ([str(cfg), "--tp", "2", "--input-ids", str(tmp / "missing.json")], "does not exist"),
            ([str(tmp / "broken.json"), "--tp", "2"], "not valid JSON"),
            (["no-such-org/no-such-model-anywhere", "--tp", "2"], "no-such-org/no-such-model-anywhere"),
            (["google/gemma-4-31B-it", "--tp", "2"], "model_type 'gemma4_text'"),
            ([str(cfg), "--tp", "2", "--timeout", "0"],
             "--timeout 0.0 must be a number of seconds from 1 to 86400"),
            ([str(cfg), "--tp", "2", "--timeout", "nan"], "--timeout nan must be a number of seconds"),
            ([str(cfg), "--tp", "2", "--timeout", "inf"], "--timeout inf must be a number of seconds"),
            ([str(cfg), "--tp", "2", "--layers", "0"], "positive integer"),
            ([str(cfg), "--tp", "2", "--dump-logits", str(tmp)],
             f"is a folder; give a file name, such as {tmp}/"),
            ([str(cfg), "--tp", "2", "--json", str(tmp / "no" / "x.json")],
             f"the folder {tmp / 'no'} does not exist"),
            ([str(cfg), "--tp", "2", "--prompt", "1 2", "--input-ids", str(tmp / "ids.txt")], "not both"),
            ([str(cfg), "--tp", "2", "--placement", "round_robin"], "add --ep, or drop --placement"),
            ([str(cfg), "--tp", "2", "--input-ids", str(tmp)], "is a folder"),
            ([str(cfg), "--tp", "2", "--input-ids", str(tmp / "empty.json")], "input ids are empty")]


def test_bad_input_exits_2_with_one_line(tiny_config, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # the unknown hub id must fail fast, offline
    for argv, match in _bad_inputs(tiny_config, tmp_path):
        code = main(argv)
        out, err = capsys.readouterr()
        assert code == 2, (argv, out, err)
        assert err.count("\n") == 1 and err.startswith("error: ") and match in err, (argv, err)


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}


def test_module_entry_points(tiny_config):
    """`python -m tpviz.cli.verify` and the lead's `python -m tpviz verify` both reach main()."""
    proc = subprocess.run([sys.executable, "-m", "tpviz", "verify", str(tiny_config), "--tp",
                           "1", "--device", "cpu",
                           "--quiet"], capture_output=True, text=True, cwd=ROOT, env=_env(), timeout=120)
    assert proc.returncode == 0 and proc.stdout.startswith("PASS") and proc.stderr == "", proc.stderr
    proc = subprocess.run([sys.executable, "-m", "tpviz", "verify", str(tiny_config), "--tp", "5"],
                          capture_output=True, text=True, cwd=ROOT, env=_env(), timeout=120)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr


@pytest.mark.slow
def test_runs_as_ranks_under_torchrun(tiny_config, tmp_path):
    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent)) or shutil.which("torchrun")
    if torchrun is None:
        pytest.skip("torchrun is not installed next to this python")
    out_json = tmp_path / "r.json"
    # --standalone: torchrun picks a free rendezvous port; a new session lets a timeout kill every rank
    proc = subprocess.Popen([torchrun, "--standalone", "--nproc-per-node", "2", "-m", "tpviz", "verify",
                             str(tiny_config), "--device", "cpu", "--seq-len", "8", "--json", str(out_json)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=_env(),
                            start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0, stdout + stderr
    assert stdout.count("PASS: tp=2") == 1  # only rank 0 reports
    report = json.loads(out_json.read_text())
    assert report["environment"]["launcher"] == "torchrun" and len(report["ranks"]) == 2

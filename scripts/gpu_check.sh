#!/usr/bin/env bash
# GPU check for `tpviz verify`: a Qwen3-0.6B-shaped model with random weights at tp=2 on CUDA, in bf16 and fp32
# (gloo ranks sharing one GPU, or NCCL when there are at least tp GPUs), plus one injected bug in bf16.
# Prints each verdict and its wall time. Target: a verdict within 60 s (random checkpoint made once, timed apart).
#
#   scripts/gpu_check.sh     # env: PYTHON (default .venv/bin/python, else python3), MODEL, TP, SEQ, OUT, DEVICE
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
MODEL=${MODEL:-Qwen/Qwen3-0.6B}
TP=${TP:-2}
DEVICE=${DEVICE:-cuda}  # DEVICE=cpu dry-runs the script without a GPU
SEQ=${SEQ:-64}
OUT=${OUT:-$(mktemp -d)}
export PYTHONPATH=$PWD HF_HUB_OFFLINE=1
export TPVIZ_CACHE=${TPVIZ_CACHE:-$OUT/cache}
mkdir -p "$OUT"

elapsed() { awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }'; }

command -v nvidia-smi >/dev/null && nvidia-smi -L
"$PY" -c "import torch; print('torch', torch.__version__, '| CUDA available:', torch.cuda.is_available(), '| GPUs:', torch.cuda.device_count())"

start=$EPOCHREALTIME
"$PY" -c "from tpviz.live import resolve_model; print('random checkpoint:', resolve_model('$MODEL', random_weights=True).checkpoint)" || exit 2
echo "random checkpoint ready in $(elapsed "$start") s (once; cached in $TPVIZ_CACHE)"

status=0
run() {  # run NAME EXPECTED_EXIT ARGS...
  local name=$1 expected=$2; shift 2
  local t=$EPOCHREALTIME
  "$PY" -m tpviz.verify "$MODEL" --tp "$TP" --device "$DEVICE" --batch 2 --seq-len "$SEQ" --timeout 300 \
    --random-weights --json "$OUT/$name.json" "$@" > "$OUT/$name.txt" 2>&1
  local rc=$?
  echo "== $name: exit $rc (expected $expected), $(elapsed "$t") s"
  head -n 3 "$OUT/$name.txt"
  grep -E "phases:|per rank" -A0 "$OUT/$name.txt" | grep phases
  [ "$rc" = "$expected" ] || status=1
}

run bf16 0 --dtype bfloat16
run fp32 0 --dtype float32
run bf16-skip-allreduce 1 --dtype bfloat16 --inject skip-allreduce
echo "full reports: $OUT/*.txt, JSON: $OUT/*.json"
[ $status = 0 ] && echo "GPU CHECK OK" || echo "GPU CHECK FAILED"
exit $status

#!/usr/bin/env bash
# GPU check for `tpviz verify` (docs/gpu_check.md): a Qwen3-0.6B-shaped model with seeded random weights
# (HF_HUB_OFFLINE=1: nothing is downloaded) through every backend the live check picks, ending in ONE table:
#
#   case | backend | device | dtype | verdict | expected | wall s
#
#   nccl fp32 / bf16 / bf16 + generate   tp=2, NCCL with one GPU per rank (skipped below 2 GPUs)
#   gloo shared GPU fp32 / bf16 + gen    tp=2 on one GPU (CUDA_VISIBLE_DEVICES=<first>): NCCL refuses that, gloo runs
#   skip-allreduce bf16                  tp=2, an injected bug: must be caught (MISMATCH)
#   wrong-kv-head bf16                   the same shapes with 2 KV heads at tp=4 (each KV head on 2 ranks): caught
#
# Target: <= 5 minutes end to end on a GPU machine (random checkpoints made once, timed apart).
#   scripts/gpu_check.sh                    # env: PYTHON, DEVICE (cuda), LAYERS (all), TP (2), SEQ (64), OUT
#   DEVICE=cpu scripts/gpu_check.sh         # dry run of the script itself on CPU (LAYERS defaults to 2 there)
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
MODEL=Qwen/Qwen3-0.6B
DEVICE=${DEVICE:-cuda}
if [ "$DEVICE" = cpu ]; then LAYERS=${LAYERS:-2}; else LAYERS=${LAYERS:-}; fi
TP=${TP:-2}
SEQ=${SEQ:-64}
OUT=${OUT:-$(mktemp -d)}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} HF_HUB_OFFLINE=1 TPVIZ_LIVE_MAX_PARAMS=${TPVIZ_LIVE_MAX_PARAMS:-off}
export TPVIZ_CACHE=${TPVIZ_CACHE:-$OUT/cache}
mkdir -p "$OUT"
LAYER_ARGS=()
[ -n "$LAYERS" ] && LAYER_ARGS=(--layers "$LAYERS")
ROWS=$OUT/rows.tsv
: > "$ROWS"

elapsed() { awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }'; }

echo "gpu_check: $(date -u '+%Y-%m-%d %H:%M UTC'), $(hostname), DEVICE=$DEVICE, layers ${LAYERS:-all}, output in $OUT"
command -v nvidia-smi >/dev/null && nvidia-smi -L
GPUS=$("$PY" -c "import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)") || exit 2
"$PY" -c "import torch; print('torch', torch.__version__, '| CUDA', torch.version.cuda, '| GPUs visible:', $GPUS)"
if [ "$DEVICE" != cpu ] && [ "$GPUS" -lt 1 ]; then
  echo "gpu_check: DEVICE=$DEVICE but torch sees no GPU; DEVICE=cpu dry-runs the script" >&2
  exit 2
fi

# the 0.6B shapes with 2 KV heads, so tp=4 replicates each KV head on 2 ranks (wrong-kv-head has an effect)
KV2=$OUT/qwen3-0.6b-kv2.json
"$PY" -c "import json, sys; from tpviz.config.sources import presets
c = dict(presets()['$MODEL'], num_key_value_heads=2); json.dump(c, open(sys.argv[1], 'w'))" "$KV2" || exit 2
echo "[[$(seq -s ', ' 1 16)]]" > "$OUT/ids.json"  # random weights have no tokenizer: generation continues ids

start=$EPOCHREALTIME
for m in "$MODEL" "$KV2"; do
  "$PY" -c "import sys; from tpviz.live import resolve_model
print('random checkpoint:', resolve_model(sys.argv[1], int(sys.argv[2]) if sys.argv[2] else None,
                                          random_weights=True).checkpoint)" "$m" "$LAYERS" || exit 2
done
echo "random checkpoints ready in $(elapsed "$start") s (once; cached in $TPVIZ_CACHE)"

skip() {  # skip NAME DTYPE EXPECTED REASON
  printf '%s\tSKIP\tSKIP: %s\t%s\t%s\t-\n' "$1" "$4" "$2" "$3" >> "$ROWS"
}

run() {  # run NAME EXPECTED MODEL TP DTYPE [ENV=VALUE ...] -- [verify args ...]
  local name=$1 expected=$2 model=$3 tp=$4 dtype=$5; shift 5
  local envs=()
  while [ $# -gt 0 ] && [ "$1" != -- ]; do envs+=("$1"); shift; done
  shift
  local t=$EPOCHREALTIME
  env ${envs[@]+"${envs[@]}"} "$PY" -m tpviz verify "$model" --tp "$tp" --device "$DEVICE" --dtype "$dtype" --batch 2 \
    --seq-len "$SEQ" --timeout 240 --random-weights ${LAYER_ARGS[@]+"${LAYER_ARGS[@]}"} --json "$OUT/$name.json" "$@" \
    > "$OUT/$name.txt" 2>&1
  local rc=$?
  printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$name" "$OUT/$name.json" "$rc" "$dtype" "$expected" "$(elapsed "$t")" >> "$ROWS"
  echo "  ran $name: exit $rc in $(elapsed "$t") s" >&2
}

FIRST_GPU=0
if [ "$DEVICE" = cpu ]; then
  for dt in float32 bfloat16; do skip "nccl $dt" $dt PASS "DEVICE=cpu dry run (NCCL needs GPUs)"; done
  skip "nccl bf16 generate 8" bfloat16 PASS "DEVICE=cpu dry run (NCCL needs GPUs)"
elif [ "$GPUS" -lt "$TP" ]; then
  for dt in float32 bfloat16; do skip "nccl $dt" $dt PASS "$GPUS GPU(s) for $TP ranks: NCCL needs one GPU per rank"; done
  skip "nccl bf16 generate 8" bfloat16 PASS "$GPUS GPU(s) for $TP ranks: NCCL needs one GPU per rank"
else
  run "nccl float32" PASS "$MODEL" "$TP" float32 --
  run "nccl bfloat16" PASS "$MODEL" "$TP" bfloat16 --
  run "nccl bf16 generate 8" PASS "$MODEL" "$TP" bfloat16 -- --input-ids "$OUT/ids.json" --generate 8
fi
# one visible GPU: tp ranks share it, NCCL refuses two ranks on one GPU, so gloo carries CUDA tensors
SHARED=()
if [ "$DEVICE" != cpu ]; then
  first=${CUDA_VISIBLE_DEVICES:-$FIRST_GPU}
  SHARED=("CUDA_VISIBLE_DEVICES=${first%%,*}")
fi
run "gloo shared GPU float32" PASS "$MODEL" "$TP" float32 ${SHARED[@]+"${SHARED[@]}"} --
run "gloo shared GPU bf16 generate 8" PASS "$MODEL" "$TP" bfloat16 ${SHARED[@]+"${SHARED[@]}"} -- \
  --input-ids "$OUT/ids.json" --generate 8
run "skip-allreduce bf16" MISMATCH "$MODEL" "$TP" bfloat16 -- --inject skip-allreduce
run "wrong-kv-head bf16 tp=4" MISMATCH "$KV2" 4 bfloat16 -- --inject wrong-kv-head

"$PY" - "$ROWS" <<'EOF'
import json, sys
rows, ok = [], True
for line in open(sys.argv[1]):
    name, path, rc, dtype, expected, wall = line.rstrip("\n").split("\t")
    if path == "SKIP":  # a case that cannot run here, with the reason in place of an exit code
        rows.append((name, "-", "-", dtype, rc, expected, "-"))
        continue
    backend = device = "?"
    try:
        r = json.load(open(path))
        backend, device, verdict = r["environment"]["backend"], r["environment"]["device"], r["verdict"]
        if r.get("generation"):
            g = r["generation"]
            verdict += (", gen identical" if g["diverged_at"] is None else
                        f", gen differs at #{g['diverged_at'] + 1} ({'noise' if g['noise_explained'] else 'NOT noise'})")
    except (OSError, ValueError, KeyError):
        verdict = f"ERROR (exit {rc}; see {path[:-5]}.txt)"
    good = verdict.split(",")[0] == expected and (expected != "PASS" or rc == "0") and (
        expected != "MISMATCH" or rc == "1")
    ok &= good
    rows.append((name, backend, device, dtype, verdict + ("" if good else "  <-- UNEXPECTED"), expected, wall))
head = ("case", "backend", "device", "dtype", "verdict", "expected", "wall s")
widths = [max(len(str(r[i])) for r in [head, *rows]) for i in range(len(head))]
fmt = lambda r: " | ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip()
print("\n" + fmt(head) + "\n" + "-+-".join("-" * w for w in widths))
print("\n".join(fmt(r) for r in rows))
print("\nGPU CHECK OK" if ok else "\nGPU CHECK FAILED")
sys.exit(0 if ok else 1)
EOF
status=$?
echo "full reports: $OUT/*.txt, JSON: $OUT/*.json"
exit $status

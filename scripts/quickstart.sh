#!/usr/bin/env bash
# Cairn's main job, end to end on this machine:
#   1. installs what is missing and builds cairnd, cairn and the example job;
#   2. starts cairnd on the embedded default (local storage + RocksDB catalog
#      in a data directory);
#   3. runs an example training job: 4 rank processes holding ~1 GB of sharded
#      state (FSDP x TP on a 2x2 mesh; bf16, fp32, int64 tensors; bytes
#      entries) that save three checkpoints;
#   4. reloads the latest one into 3 ranks with a different layout and checks
#      every byte;
#   5. shows `cairn ls`, `cairn show` and `cairn verify`;
#   6. runs the PyTorch example (client/python/examples/train.py: 2 ranks
#      train a small transformer with FSDP2, saving with dcp.async_save
#      through Cairn's DCP storage layer), kills its ranks with SIGKILL
#      mid-run and restarts it: it resumes from its latest committed
#      checkpoint; then resumes it into 3 ranks (resharded);
#   7. stops cairnd.
set -euo pipefail
cd "$(dirname "$0")/.."

BUILD_DIR=${BUILD_DIR:-build}
DATA_DIR=${CAIRN_DATA_DIR:-$BUILD_DIR/quickstart-data}
MODEL=${CAIRN_QUICKSTART_MODEL:-llm:1e9}

scripts/install_deps.sh
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=${CMAKE_BUILD_TYPE:-RelWithDebInfo} >/dev/null
cmake --build "$BUILD_DIR" -j "$(nproc)" --target cairnd cairn cairn_train_example \
  cairn_python

CAIRND=$BUILD_DIR/server/coordinator/cairnd
CAIRN=$BUILD_DIR/client/cli/cairn
RANK=$BUILD_DIR/client/examples/cairn_train_example

rm -rf "$DATA_DIR"
mkdir -p "$DATA_DIR"
echo
echo "== starting cairnd (data in $DATA_DIR)"
"$CAIRND" --listen 127.0.0.1:0 --data-dir "$DATA_DIR" --port-file "$DATA_DIR/port" \
  --keep-last 2 >"$DATA_DIR/cairnd.log" 2>&1 &
CAIRND_PID=$!
trap 'kill $CAIRND_PID 2>/dev/null || true' EXIT
for _ in $(seq 100); do [[ -s "$DATA_DIR/port" ]] && break; sleep 0.1; done
[[ -s "$DATA_DIR/port" ]] || { cat "$DATA_DIR/cairnd.log"; exit 1; }
ADDR=127.0.0.1:$(cat "$DATA_DIR/port")
echo "cairnd serving on $ADDR"

run_ranks() {  # world layout args...
  local world=$1 layout=$2; shift 2
  local pids=()
  for ((r = 0; r < world; r++)); do
    "$RANK" --coordinator "$ADDR" --job quickstart --rank "$r" --world-size "$world" \
      --model "$MODEL" --layout "$layout" "$@" &
    pids+=($!)
  done
  local rc=0
  for p in "${pids[@]}"; do wait "$p" || rc=1; done
  return $rc
}

echo
echo "== training job: 4 ranks, mesh 2x2 (FSDP x TP), saving steps 100, 200, 300"
run_ranks 4 2x2:S0,S1 --save-steps 100,200,300

echo
echo "== reloading the latest checkpoint into 3 ranks sharded by columns, verifying every byte"
run_ranks 3 3:S1 --load latest

echo
echo "== cairn ls   (retention --keep-last 2 removed step 100)"
"$CAIRN" --coordinator "$ADDR" ls
echo
echo "== cairn show quickstart latest"
"$CAIRN" --coordinator "$ADDR" show quickstart latest
echo
echo "== cairn verify quickstart latest"
"$CAIRN" --coordinator "$ADDR" verify quickstart latest

echo
echo "== PyTorch example: 2 ranks train a transformer (FSDP2, AdamW), async_save every 10 steps; kill -9 once step 10 is committed"
# The staged cairn package and the project environment's interpreter (.venv,
# made by install_deps.sh with the pinned torch).
PY_ENV=(env "PYTHONPATH=$(cd "$BUILD_DIR" && pwd)/python" CAIRN_COORDINATOR="$ADDR"
  CAIRN_JOB=quickstart-python)
PY_TRAIN=(.venv/bin/python client/python/examples/train.py --steps 40 --save-every 10)
PY_LOG=$DATA_DIR/train-python.log
"${PY_ENV[@]}" "${PY_TRAIN[@]}" --world-size 2 > >(tee "$PY_LOG") 2>&1 &
PY_PID=$!
until grep -qs "step 10 committed" "$PY_LOG"; do
  kill -0 "$PY_PID" 2>/dev/null || { echo "quickstart: the PyTorch example ended early"; exit 1; }
  sleep 0.05
done
# Each rank printed its pid ("rank R of W: pid P"): a lost node, as kill -9.
kill -KILL $(sed -n 's/^train\.py: rank [0-9]* of [0-9]*: pid \([0-9]*\)$/\1/p' "$PY_LOG")
rc=0
wait "$PY_PID" || rc=$?
[[ $rc -eq 137 ]] || { echo "quickstart: the killed PyTorch example exited $rc, not 137"; exit 1; }
echo
echo "== PyTorch example restarted: resumes from its latest committed checkpoint and trains to 40"
"${PY_ENV[@]}" "${PY_TRAIN[@]}" --world-size 2
echo
echo "== PyTorch example resumed into 3 ranks: step 40's checkpoint resharded, trained to 50"
"${PY_ENV[@]}" "${PY_TRAIN[@]}" --world-size 3 --steps 50

echo
echo "== stopping cairnd"
kill -TERM "$CAIRND_PID"
wait "$CAIRND_PID"
trap - EXIT
echo "quickstart: OK"

#!/usr/bin/env bash
# Cairn posix ShardStore throughput vs. this machine's limit, side by side in
# one run (issue 4 item 10). Prints a ratio table (markdown) on stdout.
#
# Usage: bench/storage_bench.sh [--smoke] [DIR] [TOTAL_BYTES]
#   --smoke      a quick check that everything runs (ctest label bench-smoke):
#                32 MiB in 1 MiB objects, threads 1 2, one round, no page-cache
#                drop (it would disturb everything else running); the
#                environment below still overrides. Numbers are meaningless.
#   DIR          where data goes (default: $TMPDIR or /tmp; a fresh subdirectory)
#   TOTAL_BYTES  bytes per measurement (default 4 GiB = 4294967296)
# Environment:
#   BENCH=path     the storage_bench binary (default: first of build-storage/,
#                  build/, bazel-bin/ that has bench/storage_bench)
#   THREADS="1 2 3 4"   writer/reader thread counts
#   MODES="buffered direct"
#   REPEAT=4       rounds; each round runs fio then Cairn for every (mode, T),
#                  and the table shows the best of the rounds for both
#   IO_THREADS=4   StoreOptions.io_threads for Cairn
#   ITEM_BYTES=67108864  bytes per Cairn object
#   DROP_CACHES=1  0: never drop the page cache (reads are then warm)
#
# The machine's limit, per thread count T, is the better of two fio runs in
# the same round (GB = 1e9 bytes):
#   fio buffered: T jobs, each writes TOTAL/T bytes to its own file in 1 MiB
#     psync writes with an fsync at the end (--end_fsync=1, inside fio's
#     time); then, after sync + echo 3 > /proc/sys/vm/drop_caches, reads them
#     back in 1 MiB psync reads.
#   fio O_DIRECT: the same with --direct=1, 8 MiB blocks, libaio iodepth 4
#     per job (Cairn's piece size and roughly its depth), fsync at the end.
# Cairn: storage_bench with T threads writes TOTAL as 64 MiB objects, each
#   NewWriter/Append/Close (fdatasync + rename + directory fsync), drops the
#   page cache, then Read()s every object whole -- once with buffered writes
#   (default StoreOptions) and once with use_odirect. Ratios are Cairn / limit.
# Everything written is deleted at the end (also on failure).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
SMOKE=false
if [[ ${1:-} == --smoke ]]; then SMOKE=true; shift; fi
DIR=${1:-${TMPDIR:-/tmp}}
if $SMOKE; then
  TOTAL=${2:-33554432}
  THREADS=${THREADS:-"1 2"}
  REPEAT=${REPEAT:-1}
  ITEM_BYTES=${ITEM_BYTES:-1048576}
  DROP_CACHES=${DROP_CACHES:-0}
fi
TOTAL=${2:-${TOTAL:-4294967296}}
THREADS=${THREADS:-"1 2 3 4"}
MODES=${MODES:-"buffered direct"}
REPEAT=${REPEAT:-4}
IO_THREADS=${IO_THREADS:-4}
ITEM_BYTES=${ITEM_BYTES:-67108864}
DROP_CACHES=${DROP_CACHES:-1}
PY=/usr/bin/python3

log() { echo "[storage_bench] $*" >&2; }

if [[ -z "${BENCH:-}" ]]; then
  for cand in "$ROOT/build-storage/bench/storage_bench" "$ROOT/build/bench/storage_bench" \
              "$ROOT/bazel-bin/bench/storage_bench"; do
    if [[ -x $cand ]]; then BENCH=$cand; break; fi
  done
fi
[[ -n "${BENCH:-}" && -x $BENCH ]] || {
  echo "storage_bench not built: cmake --build build --target storage_bench (or set BENCH=)" >&2
  exit 1
}
for tool in fio "$PY"; do
  command -v "$tool" >/dev/null || { echo "$tool not found (apt-get install fio python3)" >&2; exit 1; }
done

mkdir -p "$DIR"
WORK=$(mktemp -d "$DIR/storage-bench.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
RESULTS=$WORK/results.jsonl
: > "$RESULTS"

COLD=true
drop_caches() {
  sync
  if [[ $DROP_CACHES == 0 ]]; then
    COLD=false
  elif ! (echo 3 > /proc/sys/vm/drop_caches) 2>/dev/null; then
    log "WARNING: cannot drop the page cache (not root?): reads are NOT cold"
    COLD=false
  fi
}

# fio_json FILE read|write -> GB/s (fio's aggregate bw over the group)
fio_gbps() {
  "$PY" -c '
import json, sys
j = json.load(open(sys.argv[1]))["jobs"][0][sys.argv[2]]
assert j["io_bytes"] > 0, "fio moved no bytes"
print(j["bw_bytes"] / 1e9)' "$@"
}

record() {  # record MODE T TOOL PHASE GBPS
  printf '{"mode":"%s","threads":%s,"tool":"%s","phase":"%s","GBps":%s}\n' "$@" >> "$RESULTS"
}

run_fio() {  # run_fio MODE T
  local mode=$1 t=$2 dir=$WORK/fio
  local per_job=$((TOTAL / t / 1048576 * 1048576))
  local opts=(--bs=1M --ioengine=psync --direct=0)
  if [[ $mode == direct ]]; then
    opts=(--bs=8M --ioengine=libaio --iodepth=4 --direct=1)
  fi
  rm -rf "$dir"; mkdir -p "$dir"; sync
  fio --name=seq --directory="$dir" --rw=write --size="$per_job" --numjobs="$t" \
      --end_fsync=1 --group_reporting --output-format=json "${opts[@]}" > "$WORK/fw.json"
  local w; w=$(fio_gbps "$WORK/fw.json" write)
  drop_caches
  fio --name=seq --directory="$dir" --rw=read --size="$per_job" --numjobs="$t" \
      --group_reporting --output-format=json "${opts[@]}" > "$WORK/fr.json"
  local r; r=$(fio_gbps "$WORK/fr.json" read)
  rm -rf "$dir"
  record "$mode" "$t" fio write "$w"; record "$mode" "$t" fio read "$r"
  log "  fio   $mode T=$t write $(printf %.3f "$w") read $(printf %.3f "$r") GB/s"
}

run_cairn() {  # run_cairn MODE T
  local mode=$1 t=$2 flags=()
  [[ $mode == direct ]] && flags=(--odirect)
  local line
  [[ $DROP_CACHES == 0 ]] && flags+=(--drop_caches=false)
  line=$("$BENCH" --dir "$WORK/cairn" --total_bytes "$TOTAL" --item_bytes "$ITEM_BYTES" \
         --threads "$t" --io_threads "$IO_THREADS" "${flags[@]}" 2>/dev/null)
  local w r c
  read -r w r c < <("$PY" -c '
import json, sys
j = json.loads(sys.argv[1]); assert j["errors"] == 0, j
print(j["write_GBps"], j["read_GBps"], j["cold"])' "$line")
  [[ $c == True ]] || COLD=false
  record "$mode" "$t" cairn write "$w"; record "$mode" "$t" cairn read "$r"
  log "  cairn $mode T=$t write $(printf %.3f "$w") read $(printf %.3f "$r") GB/s"
}

log "bench=$BENCH dir=$WORK total=$TOTAL threads=[$THREADS] modes=[$MODES] repeat=$REPEAT"
log "load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
for ((round = 1; round <= REPEAT; round++)); do
  log "round $round/$REPEAT"
  for mode in $MODES; do
    for t in $THREADS; do
      run_fio "$mode" "$t"
      run_cairn "$mode" "$t"
    done
  done
done

$SMOKE || cp "$RESULTS" "$DIR/storage_bench_last.jsonl"
"$PY" - "$RESULTS" "$TOTAL" "$REPEAT" "$COLD" "$(cut -d' ' -f1-3 /proc/loadavg)" "$ITEM_BYTES" <<'EOF'
import collections, json, sys
path, total, repeat, cold, load, item = sys.argv[1:]
best = collections.defaultdict(float)
for line in open(path):
    j = json.loads(line)
    k = (j["mode"], j["threads"], j["tool"], j["phase"])
    best[k] = max(best[k], j["GBps"])
threads = sorted({k[1] for k in best})
modes = [m for m in ("buffered", "direct") if any(k[0] == m for k in best)]
name = {"buffered": "buffered", "direct": "O_DIRECT"}
print(f"{int(total) / 2**30:g} GiB per run in {int(item) / 2**20:g} MiB objects; best of {repeat} "
      f"interleaved rounds; GB/s = 1e9 B/s; cold reads: {cold}; "
      f"load average at end: {load}")
print()
cols = []
for m in modes:
    cols += [f"fio {name[m]}", f"Cairn {name[m]}", "ratio"]
print("| write: threads | " + " | ".join(cols) + " | best Cairn / best fio |")
print("|---:" * (len(cols) + 2) + "|")
for t in threads:
    cells = [str(t)]
    for m in modes:
        f, c = best[(m, t, "fio", "write")], best[(m, t, "cairn", "write")]
        cells += [f"{f:.2f}", f"{c:.2f}", f"{100 * c / f:.0f}%"]
    bf = max(best[(m, t, "fio", "write")] for m in modes)
    bc = max(best[(m, t, "cairn", "write")] for m in modes)
    cells.append(f"**{100 * bc / bf:.0f}%**")
    print("| " + " | ".join(cells) + " |")
print()
# Cairn reads the same way in both modes (buffered preads after dropping the
# cache); its best run is compared with the better fio read.
print("| read: threads | " + " | ".join(f"fio {name[m]}" for m in modes) +
      " | Cairn | Cairn / best fio |")
print("|---:" * (len(modes) + 3) + "|")
for t in threads:
    f = [best[(m, t, "fio", "read")] for m in modes]
    c = max(best[(m, t, "cairn", "read")] for m in modes)
    print("| " + " | ".join([str(t)] + [f"{v:.2f}" for v in f] +
                            [f"{c:.2f}", f"**{100 * c / max(f):.0f}%**"]) + " |")
EOF

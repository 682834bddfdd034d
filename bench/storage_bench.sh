#!/usr/bin/env bash
# Cairn posix ShardStore throughput vs. this machine's limit, side by side in
# one run (issue 4 item 10). Prints a ratio table (markdown) on stdout.
#
# Usage: bench/storage_bench.sh [--smoke] [--limit-sweep=quick|full] [DIR] [TOTAL_BYTES]
#   --smoke      a quick check that everything runs (ctest label bench-smoke):
#                32 MiB in 1 MiB objects, threads 1 2, one round, no page-cache
#                drop (it would disturb everything else running), the tiny
#                "smoke" limit sweep; the environment below still overrides.
#                Numbers are meaningless.
#   --limit-sweep=quick|full   the limit sweep run every round (default full)
#   DIR          where data goes (default: $TMPDIR or /tmp; a fresh subdirectory)
#   TOTAL_BYTES  bytes per measurement (default 4 GiB = 4294967296)
# Environment:
#   BENCH=path     the storage_bench binary (default: first of build-storage/,
#                  build/, bazel-bin/ that has bench/storage_bench)
#   THREADS="1 2 3 4"   writer/reader thread counts
#   MODES="buffered direct"
#   REPEAT=4       rounds; each round runs the limit sweep, then Cairn for
#                  every (mode, T); the table shows the best of the rounds
#   IO_THREADS=4   StoreOptions.io_threads for Cairn
#   ITEM_BYTES=67108864  bytes per Cairn object
#   DROP_CACHES=1  0: never drop the page cache (reads are then warm)
#
# The machine's limit is the best point of bench/baselines/limit_sweep.py
# (the sweep e2e_bench.py uses too), run in DIR with TOTAL_BYTES in every
# round: fio O_DIRECT over jobs x iodepth x block size, fio buffered with an
# fsync at the end, dd; each point a durable write of fresh files, then a cold
# read of them (GB = 1e9 bytes). The winning points are printed.
# Cairn: storage_bench with T threads writes TOTAL as 64 MiB objects, each
#   NewWriter/Append/Close (fdatasync + rename + directory fsync), drops the
#   page cache, then Read()s every object whole -- once with buffered writes
#   (default StoreOptions) and once with use_odirect. Ratios are Cairn / limit.
# Everything written is deleted at the end (also on failure).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
SMOKE=false
SWEEP=full
while [[ ${1:-} == --* ]]; do
  case $1 in
    --smoke) SMOKE=true; SWEEP=smoke ;;
    --limit-sweep=quick|--limit-sweep=full) SWEEP=${1#--limit-sweep=} ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
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
LIMITS=$WORK/limits.jsonl
: > "$RESULTS"
: > "$LIMITS"

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

record() {  # record MODE T TOOL PHASE GBPS
  printf '{"mode":"%s","threads":%s,"tool":"%s","phase":"%s","GBps":%s}\n' "$@" >> "$RESULTS"
}

run_limit() {  # the limit sweep: one JSON line appended to $LIMITS
  local drop=()
  [[ $DROP_CACHES == 0 ]] && drop=(--no-drop-caches)
  "$PY" "$ROOT/bench/baselines/limit_sweep.py" "$WORK" "$TOTAL" --sweep "$SWEEP" \
      "${drop[@]}" >> "$LIMITS"
  local cold
  cold=$("$PY" -c '
import json, sys
j = json.loads(open(sys.argv[1]).read().splitlines()[-1])
print("[storage_bench]   limit: write %.3f GB/s (%s), read %.3f GB/s (%s)" % (
    j["write_GBps"], j["write_point"], j["read_GBps"], j["read_point"]), file=sys.stderr)
print(j["cold"])' "$LIMITS")
  [[ $cold == True ]] || COLD=false
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

log "bench=$BENCH dir=$WORK total=$TOTAL threads=[$THREADS] modes=[$MODES] repeat=$REPEAT sweep=$SWEEP"
log "load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
for ((round = 1; round <= REPEAT; round++)); do
  log "round $round/$REPEAT (load average $(cut -d' ' -f1 /proc/loadavg))"
  run_limit
  for mode in $MODES; do
    for t in $THREADS; do
      run_cairn "$mode" "$t"
    done
  done
done

$SMOKE || cp "$RESULTS" "$DIR/storage_bench_last.jsonl"
$SMOKE || cp "$LIMITS" "$DIR/storage_bench_limits_last.jsonl"
"$PY" - "$RESULTS" "$LIMITS" "$TOTAL" "$REPEAT" "$COLD" "$(cut -d' ' -f1-3 /proc/loadavg)" \
    "$ITEM_BYTES" "$SWEEP" <<'EOF'
import collections, json, sys
path, limits_path, total, repeat, cold, load, item, sweep = sys.argv[1:]
best = collections.defaultdict(float)
per_round = collections.defaultdict(list)  # (mode, T, phase) -> Cairn GB/s per round
for line in open(path):
    j = json.loads(line)
    k = (j["mode"], j["threads"], j["tool"], j["phase"])
    best[k] = max(best[k], j["GBps"])
    per_round[(j["mode"], j["threads"], j["phase"])].append(j["GBps"])
limits = [json.loads(line) for line in open(limits_path)]
lim = {d: max(x[d + "_GBps"] for x in limits) for d in ("write", "read")}
threads = sorted({k[1] for k in best})
modes = [m for m in ("buffered", "direct") if any(k[0] == m for k in best)]
name = {"buffered": "buffered", "direct": "O_DIRECT"}
print(f"{int(total) / 2**30:g} GiB per run in {int(item) / 2**20:g} MiB objects; best of {repeat} "
      f"interleaved rounds; GB/s = 1e9 B/s; cold reads: {cold}; "
      f"load average at end: {load}")
print()
print(f"limit: write {lim['write']:.2f} GB/s, read {lim['read']:.2f} GB/s "
      f"(best point of the {sweep} limit sweep, best of {len(limits)} round(s))")
print()
print("| round | write limit GB/s | winning write point | read limit GB/s | winning read point "
      "| dd write / read GB/s | load average |")
print("|---|---|---|---|---|---|---|")
for n, x in enumerate(limits):
    print(f"| {n + 1} | {x['write_GBps']:.2f} | {x['write_point']} | {x['read_GBps']:.2f} "
          f"| {x['read_point']} | {x['dd_write_GBps']:.2f} / {x['dd_read_GBps']:.2f} "
          f"| {x['loadavg']:.2f} |")
print()


def per(mode, t, phase):
    """Cairn / the same round's limit, per round."""
    return ", ".join(f"{100 * v / x[phase + '_GBps']:.0f}%"
                     for v, x in zip(per_round[(mode, t, phase)], limits))


cols = []
for m in modes:
    cols += [f"Cairn {name[m]}", "/ limit", "per round"]
print("| write: threads | " + " | ".join(cols) + " | best Cairn / limit |")
print("|---:" * (len(cols) + 2) + "|")
for t in threads:
    cells = [str(t)]
    for m in modes:
        c = best[(m, t, "cairn", "write")]
        cells += [f"{c:.2f}", f"{100 * c / lim['write']:.0f}%", per(m, t, "write")]
    bc = max(best[(m, t, "cairn", "write")] for m in modes)
    cells.append(f"**{100 * bc / lim['write']:.0f}%**")
    print("| " + " | ".join(cells) + " |")
print()
# Cairn reads the same way in both modes (buffered preads after dropping the
# cache); its best run is compared with the limit.
print("| read: threads | Cairn GB/s | Cairn / limit | per round (first mode's run) |")
print("|---:|---:|---:|---:|")
for t in threads:
    c = max(best[(m, t, "cairn", "read")] for m in modes)
    print(f"| {t} | {c:.2f} | **{100 * c / lim['read']:.0f}%** | {per(modes[0], t, 'read')} |")
EOF

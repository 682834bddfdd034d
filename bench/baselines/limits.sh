#!/usr/bin/env bash
# Measures this machine's physical storage limits, for benchmark ratios (issue 5 item 6).
#
# Usage: bench/baselines/limits.sh DIR BYTES      e.g. limits.sh /tmp 1.6e9
#
#   write: durable sequential write of BYTES to a new file in DIR with fio (1 MiB blocks,
#          buffered psync writes, fsync at the end: --end_fsync=1; fio's runtime, and so
#          its bandwidth, includes that final fsync). Cross-check: dd bs=1M conv=fsync from
#          /dev/zero, timed around the whole dd.
#   also:  the same write and read with O_DIRECT (one job, and 4 parallel jobs);
#          write_GBps / read_GBps are the best of every variant.
#   read:  cold sequential read of the fio file: drop the page cache
#          (echo 3 > /proc/sys/vm/drop_caches, needs root), then fio 1 MiB reads.
#          Cross-check: drop caches, then dd bs=1M to /dev/null, timed around the dd.
#
# Prints one JSON line on stdout (GB = 1e9 bytes):
#   {"tool":"limit","write_GBps":..,"read_GBps":..,"dd_write_GBps":..,"dd_read_GBps":..,
#    "bytes":..,"cold":true|false,"repeat":N,"loadavg":L}   (L: 1-min load average at start)
# Diagnostics go to stderr. Files are created in a fresh subdirectory of DIR and removed on
# exit, also on failure. Set LIMITS_REPEAT=N to run each measurement N times and report the
# best (the limit); default 1. LIMITS_DROP_CACHES=0 never drops the page cache (reads are
# then warm and "cold" is false): for smoke runs that must not disturb the machine.
set -euo pipefail

log() { echo "[limits] $*" >&2; }

if [[ $# -ne 2 ]]; then
  echo "usage: $0 DIR BYTES   (e.g. $0 /tmp 1.6e9)" >&2
  exit 2
fi
DIR=$1
BYTES_ARG=$2
REPEAT=${LIMITS_REPEAT:-1}
DROP=${LIMITS_DROP_CACHES:-1}
PY=/usr/bin/python3

for tool in fio dd "$PY"; do
  command -v "$tool" >/dev/null || { echo "$tool not found: run bench/baselines/install.sh" >&2; exit 1; }
done
[[ -d $DIR ]] || { echo "DIR $DIR is not a directory" >&2; exit 2; }
[[ $REPEAT =~ ^[1-9][0-9]*$ ]] || { echo "LIMITS_REPEAT must be a positive integer" >&2; exit 2; }

# BYTES may be written as 1.6e9; round down to whole MiB (at least 1 MiB).
MIB=$("$PY" -c 'import sys; b=int(float(sys.argv[1])); print(max(1, b // 1048576))' "$BYTES_ARG") ||
  { echo "BYTES must be a number, got '$BYTES_ARG'" >&2; exit 2; }
BYTES=$((MIB * 1048576))

LOADAVG=$(cut -d' ' -f1 /proc/loadavg)  # 1-min load before we start: a disturbance hint
WORK=$(mktemp -d "$DIR/cairn-limits.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
FILE=$WORK/seq.dat
DDFILE=$WORK/dd.dat

COLD=true
drop_caches() {
  sync
  if [[ $DROP == 0 ]]; then
    COLD=false
  elif ! (echo 3 > /proc/sys/vm/drop_caches) 2>/dev/null; then
    log "WARNING: could not drop the page cache; the read is NOT cold"
    COLD=false
  fi
}

now() { date +%s.%N; }
# rate BYTES T0 T1 -> GB/s
rate() { "$PY" -c 'import sys; b,t0,t1=map(float,sys.argv[1:]); print(round(b/(t1-t0)/1e9, 4))' "$@"; }
# fio_bw JSONFILE read|write -> GB/s from fio's bw_bytes
fio_bw() {
  "$PY" -c '
import json, sys
j = json.load(open(sys.argv[1]))["jobs"][0][sys.argv[2]]
assert j["io_bytes"] > 0, "fio moved no bytes"
print(round(j["bw_bytes"] / 1e9, 4))' "$@"
}
best() { printf '%s\n' "$@" | sort -g | tail -1; }

FIO_COMMON=(--name=limit --filename="$FILE" --bs=1M --size="$BYTES" --ioengine=psync
            --direct=0 --output-format=json)

# The O_DIRECT variant (8 MiB blocks, libaio, queue depth 4) is often the
# faster way to this disk; so is the parallel one: 4 jobs (one file each,
# BYTES/4 per job, the shape of a 4-rank save), O_DIRECT, queue depth 4 each.
# The limit reported is the best of all three.
FIO_DIRECT=(--name=limit --filename="$FILE" --bs=8M --size="$BYTES" --ioengine=libaio
            --iodepth=4 --direct=1 --output-format=json)
FIO_PARALLEL=(--name=limit --directory="$WORK" --filename_format='par.$jobnum' --bs=8M
              --size=$((BYTES / 4)) --numjobs=4 --group_reporting --ioengine=libaio
              --iodepth=4 --direct=1 --output-format=json)

# write_then_read LABEL W R FIO_ARGS...: a durable fio write, then a cold fio
# read of the same file(s); appends the two GB/s to the arrays named W and R.
write_then_read() {
  local label=$1
  local -n w_out=$2 r_out=$3
  shift 3
  log "run $i/$REPEAT: fio $label write"
  fio "$@" --rw=write --end_fsync=1 > "$WORK/w2.json"
  w_out+=("$(fio_bw "$WORK/w2.json" write)")
  drop_caches
  log "run $i/$REPEAT: fio $label read"
  fio "$@" --rw=read > "$WORK/r2.json"
  r_out+=("$(fio_bw "$WORK/r2.json" read)")
}

fio_w=(); dd_w=(); fio_r=(); dd_r=(); fio_dw=(); fio_dr=(); fio_pw=(); fio_pr=()
for ((i = 1; i <= REPEAT; i++)); do
  rm -f "$FILE" "$DDFILE"
  sync
  log "run $i/$REPEAT: fio durable write of $BYTES bytes to $FILE"
  fio "${FIO_COMMON[@]}" --rw=write --end_fsync=1 > "$WORK/w.json"
  fio_w+=("$(fio_bw "$WORK/w.json" write)")

  log "run $i/$REPEAT: dd conv=fsync write of $BYTES bytes"
  t0=$(now)
  dd if=/dev/zero of="$DDFILE" bs=1M count="$MIB" conv=fsync status=none
  t1=$(now)
  dd_w+=("$(rate "$BYTES" "$t0" "$t1")")
  rm -f "$DDFILE"

  rm -f "$FILE"
  write_then_read "O_DIRECT" fio_dw fio_dr "${FIO_DIRECT[@]}"
  rm -f "$WORK"/par.*
  sync
  write_then_read "O_DIRECT, 4 jobs" fio_pw fio_pr "${FIO_PARALLEL[@]}"
  rm -f "$WORK"/par.*

  drop_caches
  log "run $i/$REPEAT: fio cold read"
  fio "${FIO_COMMON[@]}" --rw=read > "$WORK/r.json"
  fio_r+=("$(fio_bw "$WORK/r.json" read)")

  drop_caches
  log "run $i/$REPEAT: dd cold read"
  t0=$(now)
  dd if="$FILE" of=/dev/null bs=1M status=none
  t1=$(now)
  dd_r+=("$(rate "$BYTES" "$t0" "$t1")")
  log "run $i/$REPEAT: fio write ${fio_w[-1]} dd write ${dd_w[-1]} fio read ${fio_r[-1]} dd read ${dd_r[-1]} GB/s"
done

printf '{"tool":"limit","write_GBps":%s,"read_GBps":%s,"buffered_write_GBps":%s,"buffered_read_GBps":%s,"direct_write_GBps":%s,"direct_read_GBps":%s,"parallel_write_GBps":%s,"parallel_read_GBps":%s,"dd_write_GBps":%s,"dd_read_GBps":%s,"bytes":%s,"cold":%s,"repeat":%s,"loadavg":%s}\n' \
  "$(best "${fio_w[@]}" "${fio_dw[@]}" "${fio_pw[@]}")" "$(best "${fio_r[@]}" "${fio_dr[@]}" "${fio_pr[@]}")" \
  "$(best "${fio_w[@]}")" "$(best "${fio_r[@]}")" "$(best "${fio_dw[@]}")" "$(best "${fio_dr[@]}")" \
  "$(best "${fio_pw[@]}")" "$(best "${fio_pr[@]}")" \
  "$(best "${dd_w[@]}")" "$(best "${dd_r[@]}")" \
  "$BYTES" "$COLD" "$REPEAT" "$LOADAVG"

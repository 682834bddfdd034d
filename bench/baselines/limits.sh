#!/usr/bin/env bash
# Measures this machine's storage limits, for benchmark ratios: the best of the sweep in
# limit_sweep.py (fio O_DIRECT over jobs x iodepth x block size, fio buffered + fsync, dd),
# each point a durable write of BYTES to fresh files in DIR, then a cold read of them.
#
# Usage: bench/baselines/limits.sh DIR BYTES      e.g. limits.sh /tmp 1.6e9
#
# Prints limit_sweep.py's one JSON line on stdout (write_GBps, read_GBps, the winning
# write_point / read_point, every point's figures, dd_write_GBps, dd_read_GBps, bytes,
# cold, loadavg, ...); diagnostics go to stderr. Environment:
#   LIMITS_SWEEP=full|quick|smoke   which sweep (default full)
#   LIMITS_REPEAT=N                 run the sweep N times, keep the best (default 1)
#   LIMITS_DROP_CACHES=0            never drop the page cache (fio still invalidates its
#                                   own files' cached pages before reading; dd is warm)
#   LIMITS_RUNTIME=S                seconds per point and direction (fio --runtime)
set -euo pipefail
if [[ $# -ne 2 ]]; then
  echo "usage: $0 DIR BYTES   (e.g. $0 /tmp 1.6e9)" >&2
  exit 2
fi
args=("$1" "$2" --sweep "${LIMITS_SWEEP:-full}" --repeat "${LIMITS_REPEAT:-1}")
[[ ${LIMITS_DROP_CACHES:-1} == 0 ]] && args+=(--no-drop-caches)
[[ -n ${LIMITS_RUNTIME:-} ]] && args+=(--runtime "$LIMITS_RUNTIME")
exec /usr/bin/python3 "$(dirname "$0")/limit_sweep.py" "${args[@]}"

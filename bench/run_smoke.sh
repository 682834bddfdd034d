#!/usr/bin/env bash
# Runs one benchmark's smoke mode for ctest (label bench-smoke): passes only if
# the command exits 0 and printed every expected result line. Numbers are
# never checked; ctest's TIMEOUT turns a hang into a failure.
#
# Usage: bench/run_smoke.sh REGEX... -- COMMAND [ARGS...]
#   REGEX  an extended regular expression (grep -E) that some line of the
#          command's stdout or stderr must match
set -uo pipefail

patterns=()
while (($# > 0)) && [[ $1 != -- ]]; do
  patterns+=("$1")
  shift
done
if (($# < 2)) || ((${#patterns[@]} == 0)); then
  echo "usage: $0 REGEX... -- COMMAND [ARGS...]" >&2
  exit 2
fi
shift

out=$(mktemp)
trap 'rm -f "$out"' EXIT
"$@" 2>&1 | tee "$out"
rc=${PIPESTATUS[0]}
if ((rc != 0)); then
  echo "run_smoke: FAILED: '$*' exited $rc" >&2
  exit 1
fi
for p in "${patterns[@]}"; do
  if ! grep -Eq -- "$p" "$out"; then
    echo "run_smoke: FAILED: '$*' exited 0 but printed no line matching '$p'" >&2
    exit 1
  fi
done
echo "run_smoke: ok: $1 ran to completion and printed its ${#patterns[@]} expected result line(s)"

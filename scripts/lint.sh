#!/usr/bin/env bash
# Checks clang-format on every C++/CUDA file in the tree (no changes made).
# With --fix, reformats them in place.
set -euo pipefail
cd "$(dirname "$0")/.."
mapfile -t files < <(git ls-files '*.h' '*.cc' '*.cu')
if [[ "${1:-}" == "--fix" ]]; then
  clang-format -i "${files[@]}"
  exit 0
fi
clang-format --dry-run -Werror "${files[@]}"
echo "lint: ${#files[@]} files formatted correctly"

# Layering, as //:BUILD.bazel enforces it with Bazel visibility (so a
# CMake-only change cannot break it either): production sources (not tests,
# test fixtures or testing/ libraries) of a package include no header of a
# package above it, but the headers the third argument allows.
layering_errors=0
check_layer() {  # check_layer DIR REGEX-OF-FORBIDDEN-INCLUDES [ALLOWED-HEADERS]
  local hits
  hits=$(git ls-files "$1" | grep -E '\.(h|cc|cu)$' |
    grep -vE '(_test\.cc|_test_fixture\.h|/testing/)' |
    xargs -r grep -nE "^#include \"($2)/" || true)
  if [[ -n "${3:-}" && -n "$hits" ]]; then
    hits=$(grep -vE ":#include \"($3)\"" <<<"$hits" || true)
  fi
  if [[ -n "$hits" ]]; then
    echo "lint: $1 may not include $2:"
    echo "$hits"
    layering_errors=1
  fi
}
check_layer common 'proto|planner|storage|client|server'
check_layer planner 'proto|storage|client|server'
# planner:geometry (box, overlap_index) sits below the rest of planner/.
check_layer 'planner/box.*' 'common|proto|planner|storage|client|server' \
  'planner/box\.h'
check_layer 'planner/overlap_index.*' \
  'common|proto|planner|storage|client|server' 'planner/(box|overlap_index)\.h'
check_layer proto 'storage|client|server'
# Storage uses the planner's box geometry (planner:geometry), nothing else.
check_layer storage 'planner|client|server' 'planner/(box|overlap_index)\.h'
check_layer client 'server'
check_layer server/coordinator 'client'
check_layer server/agent 'client/(agent|cli|examples)|client/[a-z_]+\.h'
# Inside server/coordinator: the parts the Coordinator facade is composed of
# (save_session, load_rounds, retention, recovery, request_bounds, ...) sit
# below it: only the facade's own files (coordinator*) and the daemon above
# it (cairnd*, main.cc) include its headers.
hits=$(git ls-files server/coordinator | grep -E '\.(h|cc)$' |
  grep -vE '(_test\.cc|_test_fixture\.h|/(coordinator|cairnd)[a-z_]*\.(h|cc)|/main\.cc)$' |
  xargs -r grep -nE '^#include "server/coordinator/coordinator(_internal|_server|_service)?\.h"' || true)
if [[ -n "$hits" ]]; then
  echo "lint: a part of server/coordinator includes the facade above it:"
  echo "$hits"
  layering_errors=1
fi
if [[ $layering_errors != 0 ]]; then exit 1; fi
echo "lint: layering respected"

# CMake and Bazel are kept by hand side by side: the same targets from the
# same sources (scripts/build_parity_allowlist.txt: the few in one only).
python3 scripts/check_build_parity.py

#!/usr/bin/env bash
# Checks clang-format on every C++/CUDA file in the tree (no changes made),
# the layering rules and the CMake/Bazel parity. With --fix, reformats them in
# place.
#
# lint.sh --tidy [BUILD_DIR]: clang-tidy with the allowlist in .clang-tidy
# over the production sources (not tests, benchmarks or fuzzers), from
# BUILD_DIR's compile_commands.json (default build/). Every finding is an
# error. The clang-analyzer-* checks of .clang-tidy take ~4x longer and run
# with --tidy-full.
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ "${1:-}" == "--tidy" || "${1:-}" == "--tidy-full" ]]; then
  build=${2:-build}
  if [[ ! -f "$build/compile_commands.json" ]]; then
    echo "lint: no $build/compile_commands.json: build first (scripts/build.sh)" >&2
    exit 2
  fi
  checks=""
  if [[ "$1" == "--tidy" ]]; then checks="--checks=-clang-analyzer-*"; fi
  mapfile -t sources < <(git ls-files '*.cc' |
    grep -vE '(_test\.cc|/testing/|^(tests|bench|fuzz|third_party)/)')
  report=$(mktemp)
  trap 'rm -f "$report"' EXIT
  # One clang-tidy per file, as many at once as there are cores; a header's
  # findings (HeaderFilterRegex) repeat across files and are listed once.
  printf '%s\n' "${sources[@]}" |
    xargs -P "$(nproc)" -I{} sh -c \
      'clang-tidy -p "$0" --quiet '"$checks"' "$1" 2>&1 || true' \
      "$build" {} | grep -E '(warning|error):|Error while processing' |
    sort -u > "$report" || true
  if [[ -s "$report" ]]; then
    cat "$report"
    echo "lint: clang-tidy: $(wc -l < "$report") findings in ${#sources[@]} files"
    exit 1
  fi
  echo "lint: clang-tidy clean on ${#sources[@]} files"
  exit 0
fi
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
# protocol/ (the ranks' side of save and load, shared by libcairn and
# cairn-agent) sits below both.
check_layer protocol 'client|server'
check_layer client 'server'
check_layer server/coordinator 'client|protocol'
check_layer server/agent 'client'
# check_below_facade DIR ABOVE_RE FACADE_RE WHAT: no file of DIR except
# those matching ABOVE_RE (the facade's own, the daemon's, tests) includes a
# header matching FACADE_RE.
check_below_facade() {
  local hits
  hits=$(git ls-files "$1" | grep -E '\.(h|cc)$' | grep -vE "$2" |
    xargs -r grep -nE "^#include \"$3\"" || true)
  if [[ -n "$hits" ]]; then
    echo "lint: $4:"
    echo "$hits"
    layering_errors=1
  fi
}
# Inside server/coordinator: the parts the Coordinator facade is composed of
# (save_session, load_rounds, retention, recovery, request_bounds, ...) sit
# below it: only the facade's own files (coordinator*) and the daemon above
# it (cairnd*, main.cc) include its headers.
check_below_facade server/coordinator \
  '(_test\.cc|_test_fixture\.h|/(coordinator|cairnd)[a-z_]*\.(h|cc)|/main\.cc)$' \
  'server/coordinator/coordinator(_internal|_server|_service)?\.h' \
  "a part of server/coordinator includes the facade above it"
# Inside server/agent the same: its components (staging_pool, memory_tier,
# persister, streaming_save, peer_*, replicator, transport/, copier/) sit
# below the Agent that composes them; only the agent's own files (agent*),
# the daemon's (node_identity, main.cc) and tests include agent.h or
# agent_server.h.
check_below_facade server/agent \
  '(_test\.cc|/testing/.*|/agent[a-z_]*\.(h|cc)|/node_identity\.(h|cc)|/main\.cc)$' \
  'server/agent/agent(_server|_daemon|_flags)?\.h' \
  "a component of server/agent includes the agent above it"
if [[ $layering_errors != 0 ]]; then exit 1; fi
echo "lint: layering respected"

# CMake and Bazel are kept by hand side by side: the same targets from the
# same sources (scripts/build_parity_allowlist.txt: the few in one only).
python3 scripts/check_build_parity.py

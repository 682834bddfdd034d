#!/usr/bin/env bash
# Builds Cairn's libFuzzer targets (fuzz/) with clang-14, ASan and UBSan in
# their own build directory, then runs each for a bounded time. The rest of
# the project builds with gcc (scripts/build.sh); this build shares only the
# sources (Debian's gcc-built C++ libraries link fine: clang uses libstdc++).
#
# Usage: scripts/fuzz.sh [--time SECONDS | --runs N] [--build-only]
#                        [--regen-corpus] [TARGET...]
#   --time S        run each target for S seconds (default: $FUZZ_TIME or 20)
#   --runs N        run each target for N executions instead
#   --build-only    build, do not run
#   --regen-corpus  rewrite the seed corpus fuzz/corpus/*/seed-* and exit
#   TARGET          manifest_fuzzer plan_convert_fuzzer catalog_record_fuzzer
#                   (default: all three)
# Environment: FUZZ_BUILD_DIR (default build-fuzz), FUZZ_JOBS (default nproc).
#
# Each target reads its checked-in corpus fuzz/corpus/<target>/ (seeds and
# the regression input of every fixed finding, so those run first, every
# time) and writes new inputs to $FUZZ_BUILD_DIR/corpus/<target>/. Limits make
# an allocation bomb or a hang a finding: -rss_limit_mb=2048
# -malloc_limit_mb=2048 -timeout=10. A crash, leak, UB report or limit hit
# fails the script; the input is saved in $FUZZ_BUILD_DIR/artifacts/<target>/
# (reproduce: $FUZZ_BUILD_DIR/fuzz/<target> <that file>). The last line
# per target reports its executions.
set -euo pipefail
cd "$(dirname "$0")/.."

TIME=${FUZZ_TIME:-20}
RUNS=""
BUILD_ONLY=false
REGEN=false
TARGETS=()
while (($# > 0)); do
  case $1 in
    --time) TIME=$2; shift 2 ;;
    --runs) RUNS=$2; shift 2 ;;
    --build-only) BUILD_ONLY=true; shift ;;
    --regen-corpus) REGEN=true; shift ;;
    -h|--help) sed -n '2,25p' "$0"; exit 0 ;;
    -*) echo "fuzz.sh: unknown flag $1" >&2; exit 2 ;;
    *) TARGETS+=("$1"); shift ;;
  esac
done
((${#TARGETS[@]} > 0)) || TARGETS=(manifest_fuzzer plan_convert_fuzzer catalog_record_fuzzer)

BUILD_DIR=${FUZZ_BUILD_DIR:-build-fuzz}
CC_BIN=$(command -v clang-14 || true)
CXX_BIN=$(command -v clang++-14 || true)
if [[ -z $CC_BIN || -z $CXX_BIN ]]; then
  echo "fuzz.sh: clang-14 not found (scripts/install_deps.sh installs clang-14 libclang-rt-14-dev)" >&2
  exit 1
fi
LAUNCHER=()
if command -v ccache >/dev/null; then LAUNCHER=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache); fi

echo "fuzz.sh: building ${TARGETS[*]} in $BUILD_DIR with $CXX_BIN"
start=$SECONDS
CC=$CC_BIN CXX=$CXX_BIN cmake -S . -B "$BUILD_DIR" -G Ninja \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g" \
  -DCAIRN_FUZZ=ON -DCAIRN_BUILD_BENCH=OFF -DCAIRN_WITH_CUDA=OFF "${LAUNCHER[@]}" >/dev/null
BUILD=("${TARGETS[@]}")
$REGEN && BUILD+=(fuzz_seed_corpus)
cmake --build "$BUILD_DIR" -j "${FUZZ_JOBS:-$(nproc)}" --target "${BUILD[@]}"
echo "fuzz.sh: built in $((SECONDS - start)) s"

if $REGEN; then
  # Regression inputs (crash-*) stay; seeds are rewritten.
  rm -f fuzz/corpus/*/seed-*
  "$BUILD_DIR/fuzz/fuzz_seed_corpus" fuzz/corpus
  exit 0
fi
$BUILD_ONLY && exit 0

export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:allocator_may_return_null=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
failed=()
for t in "${TARGETS[@]}"; do
  corpus=$BUILD_DIR/corpus/$t
  artifacts=$BUILD_DIR/artifacts/$t/
  mkdir -p "$corpus" "$artifacts"
  limit=(-max_total_time="$TIME")
  [[ -n $RUNS ]] && limit=(-runs="$RUNS")
  dict=()
  [[ $t != catalog_record_fuzzer ]] && dict=(-dict=fuzz/proto.dict)
  log=$BUILD_DIR/$t.log
  echo "fuzz.sh: running $t (${limit[*]})"
  t0=$SECONDS
  rc=0
  "$BUILD_DIR/fuzz/$t" "${limit[@]}" -rss_limit_mb=2048 -malloc_limit_mb=2048 \
    -timeout=10 -print_final_stats=1 -artifact_prefix="$artifacts" "${dict[@]}" \
    "$corpus" "fuzz/corpus/$t" > "$log" 2>&1 || rc=$?
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  if ((rc != 0)); then
    tail -60 "$log"
    echo "fuzz.sh: $t FAILED (exit $rc) after ${execs:-?} executions; input in $artifacts (log $log)"
    failed+=("$t")
  else
    echo "fuzz.sh: $t: ${execs:-?} executions in $((SECONDS - t0)) s, no crash, leak, UB or limit hit ($(ls "$corpus" | wc -l) new corpus inputs)"
  fi
done
if ((${#failed[@]} > 0)); then
  echo "fuzz.sh: FAILED: ${failed[*]}"
  exit 1
fi

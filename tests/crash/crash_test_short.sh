#!/usr/bin/env bash
# Bazel entry point of the crash test's short mode (tests/crash/README.md):
# the binaries' paths come as arguments.
# Under Bazel $0 is tests/crash_test_short in the runfiles; from the source
# tree it is tests/crash/crash_test_short.sh.
here=$(dirname "$0")
script=$here/crash/crash_test.py
[[ -f $script ]] || script=$here/crash_test.py
exec /usr/bin/python3 "$script" --mode short "$@"

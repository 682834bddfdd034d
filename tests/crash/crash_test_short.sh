#!/usr/bin/env bash
# Bazel entry point of the crash test's short mode (tests/crash/README.md):
# the binaries' paths come as arguments.
exec /usr/bin/python3 "$(dirname "$0")/crash_test.py" --mode short "$@"

#!/usr/bin/env bash
# Prints a hash of the source tree an image is built from: every file the
# build context holds (tracked or new, not ignored), by content. build.sh
# labels images with it (dev.cairn.source-hash); tests compare it with the
# tree they run in, so a stale image fails instead of testing old code.
set -euo pipefail
cd "$(dirname "$0")/../.."
git ls-files -z --cached --others --exclude-standard |
  grep -zvE '^(build[^/]*|bazel-[^/]*)/|(^|/)(node_modules|__pycache__)/|\.pyc$' |
  xargs -0 -r sha256sum 2>/dev/null | sha256sum | cut -c1-16

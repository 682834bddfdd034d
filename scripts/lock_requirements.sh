#!/usr/bin/env bash
# Regenerates scripts/requirements.lock from scripts/requirements.in: every
# package the direct needs pull in, pinned, with the hashes of its files on
# PyPI (pip installs with --require-hashes). Resolved for the interpreter the
# project environment is made from (Debian's /usr/bin/python3). Run after
# editing requirements.in, commit both files.
set -euo pipefail
cd "$(dirname "$0")"
TOOLS=$(mktemp -d)
trap 'rm -rf "$TOOLS"' EXIT
/usr/bin/python3 -m venv "$TOOLS"
"$TOOLS/bin/pip" install -q pip-tools==7.6.2
"$TOOLS/bin/pip-compile" --quiet --generate-hashes --allow-unsafe --strip-extras \
  --no-emit-index-url --no-emit-find-links \
  --output-file requirements.lock requirements.in
echo "lock_requirements: scripts/requirements.lock written"

#!/usr/bin/env bash
# Cairn's main job. Installs what is missing and builds; the coordinator issue
# turns this into the full demo (cairnd + a sharded training job + reload).
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/install_deps.sh
scripts/build.sh

echo
echo "Built:"
find "${BUILD_DIR:-build}" -maxdepth 3 -type f -perm -u+x \
  \( -name 'cairn*' -o -name '*_test' -o -name '*_bench' \) | sort | sed 's/^/  /'

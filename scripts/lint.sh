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

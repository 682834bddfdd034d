#!/usr/bin/env bash
# Installs what the baseline benchmarks need: fio and coreutils from Debian
# (the limit sweep), and the project environment (.venv: the pinned torch of
# scripts/requirements.lock, whose DCP dcp_bench.py measures), which
# scripts/install_deps.sh makes from PyPI.
# Idempotent: packages already installed are skipped; apt-get update runs only when
# something is missing. Must run as root (or with sudo available).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"

PACKAGES=(
  fio              # durable-write / cold-read limits (limits.sh)
  coreutils        # dd cross-check (limits.sh)
  procps           # sysctl / vm tools
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

SUDO=""
if [[ $(id -u) -ne 0 ]]; then
  SUDO="sudo"
fi

if [[ ${#missing[@]} -gt 0 ]]; then
  echo "bench/baselines/install.sh: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# The project environment (torch and its DCP), from scripts/requirements.lock.
"$ROOT/scripts/install_deps.sh" >/dev/null
"${CAIRN_VENV:-$ROOT/.venv}/bin/python" -c \
  "import torch, torch.distributed; assert torch.distributed.is_available()"
echo "bench/baselines/install.sh: done"

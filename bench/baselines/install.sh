#!/usr/bin/env bash
# Installs what the baseline benchmarks need, from Debian only (there is no PyPI here).
# Idempotent: packages already installed are skipped; apt-get update runs only when
# something is missing. Must run as root (or with sudo available).
set -euo pipefail

PACKAGES=(
  python3          # /usr/bin/python3 runs dcp_bench.py
  python3-torch    # PyTorch 1.13: torch.distributed._shard.checkpoint + gloo
  python3-numpy    # torch's numpy interop (imported by torch helpers)
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

if [[ ${#missing[@]} -eq 0 ]]; then
  echo "bench/baselines/install.sh: all packages present (${PACKAGES[*]})"
  exit 0
fi

SUDO=""
if [[ $(id -u) -ne 0 ]]; then
  SUDO="sudo"
fi

echo "bench/baselines/install.sh: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"

# Smoke check: the modules the benchmark imports exist.
/usr/bin/python3 -c "import torch, torch.distributed; assert torch.distributed.is_available()"
echo "bench/baselines/install.sh: done"

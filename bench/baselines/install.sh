#!/usr/bin/env bash
# Installs what the baseline benchmarks need: fio and coreutils from Debian
# (the limit sweep), and the project environment (.venv: the pinned torch of
# scripts/requirements.lock, whose DCP dcp_bench.py measures), which
# scripts/install_deps.sh makes from PyPI.
# Then the peers (bench/baselines/<peer>_bench.py), each in its own
# environment .venv-peers/<peer> from PyPI, pinned with hashes by
# bench/baselines/requirements-<peer>.txt (bench/baselines/lock_peers.sh):
#   s3torchconnector  s3torchconnector[dcp] 1.5.0 on the project's torch
#   megatron-core     megatron-core 0.16.1 on the project's torch
#   bytecheckpoint    bytecheckpoint 0.0.2 with the torch 2.5.0 it requires
#                     (it refuses torch >= 2.6): a whole environment, ~5 GB
# "On the project's torch": the peer's venv sees the project environment's
# site-packages through a .pth file (no second torch) and gets only what the
# peer adds. Each environment is made again when its requirements file (or,
# for those on the project's torch, scripts/requirements.lock) changed.
# Idempotent: packages already installed are skipped; apt-get update runs only when
# something is missing. Must run as root (or with sudo available).
#
# Usage: bench/baselines/install.sh [--peers all|none|NAME,...]   (default all)
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
HERE="$ROOT/bench/baselines"
PEERS=all
while (($#)); do
  case "$1" in
    --peers) PEERS=$2; shift 2 ;;
    *) echo "install.sh: unknown argument '$1' (usage: install.sh [--peers all|none|NAME,...])" >&2; exit 2 ;;
  esac
done

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

# The peers. name|environment (torch: on the project's torch; own)|import check
PEER_LIST=(
  "s3torchconnector|torch|from s3torchconnector.dcp import S3StorageWriter, S3StorageReader"
  "megatron-core|torch|from megatron.core.dist_checkpointing import ShardedTensor, save, load; import psutil"
  "bytecheckpoint|own|import torch, bytecheckpoint; assert torch.__version__.startswith('2.5.0')"
)
PROJECT_PY="${CAIRN_VENV:-$ROOT/.venv}/bin/python"
TORCH_SITE=$("$PROJECT_PY" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
PEER_ROOT="$ROOT/.venv-peers"
mkdir -p "$PEER_ROOT"
# The peers' environments are build outputs: git ignores them (as venv does
# for itself since Python 3.13).
echo '*' >"$PEER_ROOT/.gitignore"
for entry in "${PEER_LIST[@]}"; do
  IFS='|' read -r name env check <<<"$entry"
  if [[ $PEERS == none ]] || { [[ $PEERS != all ]] && [[ ",$PEERS," != *",$name,"* ]]; }; then
    continue
  fi
  venv="$PEER_ROOT/$name"
  req="$HERE/requirements-$name.txt"
  hashed=("$req")
  [[ $env == torch ]] && hashed+=("$ROOT/scripts/requirements.lock")
  want=$(cat "${hashed[@]}" | sha256sum | cut -d' ' -f1)
  stamp="$venv/.cairn-requirements.sha256"
  if [[ -x $venv/bin/python && -f $stamp && "$(cat "$stamp")" == "$want" ]]; then
    echo "bench/baselines/install.sh: $venv matches $(basename "$req")"
    continue
  fi
  echo "bench/baselines/install.sh: making $venv from $(basename "$req") (PyPI)"
  start=$SECONDS
  rm -rf "$venv"
  /usr/bin/python3 -m venv "$venv"
  if [[ $env == torch ]]; then
    site=$("$venv/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
    echo "$TORCH_SITE" >"$site/project-torch.pth"
  fi
  "$venv/bin/python" -m pip install --quiet --no-input --require-hashes --no-deps \
    --progress-bar off -r "$req"
  "$venv/bin/python" -W ignore -c "$check"
  echo "$want" >"$stamp"
  echo "bench/baselines/install.sh: $name installed in $((SECONDS - start)) s"
done
echo "bench/baselines/install.sh: done"

#!/usr/bin/env bash
# Runs the cairn package's torch suites (DCP entry points, DTensor, FSDP2,
# import, interop) against another torch from PyPI: the way the supported
# range's older end is tested. A long mode, not part of scripts/test.sh (each
# torch is a few GB the first time; pip's cache keeps it for the next run).
#
#   scripts/test_torch.sh 2.6.0            # every torch suite
#   scripts/test_torch.sh 2.6.0 -k async   # extra arguments go to pytest
#
# Needs a build (scripts/build.sh; BUILD_DIR, default build): the extension
# and libcairn do not link torch, so one build serves every torch. The torch
# gets an environment of its own, .venv-torch/VERSION (CAIRN_TORCH_VENVS
# moves it), with numpy, pytest, safetensors and boto3 at the versions
# scripts/requirements.lock pins.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
VERSION=${1:?usage: scripts/test_torch.sh TORCH_VERSION [pytest args...]}
shift
BUILD=$(realpath "${BUILD_DIR:-build}")
[[ -d "$BUILD/python/cairn" ]] || {
  echo "test_torch: no staged package in $BUILD/python: run scripts/build.sh first" >&2
  exit 2
}
VENV="${CAIRN_TORCH_VENVS:-$ROOT/.venv-torch}/$VERSION"
pinned() { grep -oE "^$1==[^ ]+" scripts/requirements.lock; }
if [[ ! -x "$VENV/bin/python" ]] ||
   ! "$VENV/bin/python" -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '$VERSION')"; then
  echo "test_torch: making $VENV with torch $VERSION from PyPI"
  rm -rf "$VENV"
  /usr/bin/python3 -m venv "$VENV"
  "$VENV/bin/pip" install --quiet --disable-pip-version-check \
    "torch==$VERSION" "$(pinned numpy)" "$(pinned pytest)" \
    "$(pinned safetensors)" "$(pinned boto3)"
fi
"$VENV/bin/python" -c "import torch; print('test_torch: torch', torch.__version__)"
cd client/python/tests
PYTHONPATH="$BUILD/python" CAIRN_BUILD_DIR="$BUILD" PYTHONDONTWRITEBYTECODE=1 \
  "$VENV/bin/python" -m pytest -q -p no:cacheprovider \
  test_dcp.py test_dcp_entry_points.py test_dcp_errors.py \
  test_checkpointer_dtensor.py test_fsdp2.py test_state.py \
  test_import_dcp.py test_interop.py test_async.py "$@"

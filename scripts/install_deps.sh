#!/usr/bin/env bash
# Installs what Cairn needs to build and test: Debian bookworm's packages
# (apt), and the Python side (torch, pytest, safetensors, kubernetes-validate,
# ...) from PyPI into the project environment, .venv at the root of the
# checkout (or $CAIRN_VENV), pinned with hashes by scripts/requirements.lock.
# Idempotent: installs only what is missing or what the lock changed.
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build pkg-config git
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev librocksdb-dev libgtest-dev libgmock-dev libbenchmark-dev
  libisal-dev libspdlog-dev libcli11-dev nlohmann-json3-dev liburing-dev
  libxxhash-dev  # XXH3, compiled in from its header (planner/plan_cache.cc)
  libgoogle-perftools-dev  # cairnd's allocator, tcmalloc (docs/design.md)
  bazel-bootstrap bazel-rules-java
  clang-format fio python3-grpcio
  iproute2  # tests/netns: ip netns, veth, tc
  clang-14 libclang-rt-14-dev  # scripts/fuzz.sh: clang + libFuzzer/ASan/UBSan runtimes
  # The Python package (client/python): Debian's interpreter and headers
  # and pybind11 build the extension; venv and pip make the project
  # environment (.venv, below) its torch and tests come from.
  python3 python3-dev pybind11-dev python3-pybind11 python3-venv python3-pip
  python3-setuptools
  # S3 storage (storage/s3): libcurl (SigV4 signing) and tinyxml2 (S3's XML
  # bodies); a single-node Ceph with radosgw as the real S3 server the tests
  # run against (scripts/ceph/ceph.sh); boto3 and s3cmd as reference clients
  # in bench/.
  libcurl4-openssl-dev libtinyxml2-dev
  ceph-mon ceph-osd radosgw ceph-common python3-boto3 s3cmd openssl curl
  # The daemons' Prometheus endpoint (--metrics-listen): cpp-httplib; the
  # tests check it with promtool and scrape it with a real Prometheus.
  libcpp-httplib-dev prometheus
  # The container image (deploy/image/build.sh: podman with runc, a base made
  # with mmdebstrap) and the test that runs the Kubernetes manifests'
  # containers in it (tests/deploy/); python3-yaml reads the manifests.
  podman buildah runc catatonit uidmap skopeo mmdebstrap python3-yaml ccache
  util-linux
)
# kubectl (for `kubectl kustomize`): Debian's kubernetes-client, unless a
# kubectl is already installed (e.g. a newer one from the Google Cloud SDK).
if ! command -v kubectl >/dev/null; then PACKAGES+=(kubernetes-client); fi

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if ((${#missing[@]} > 0)); then
  echo "install_deps: installing ${missing[*]}"
  SUDO=""
  if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "install_deps: all ${#PACKAGES[@]} packages present"
fi

# The project environment: a venv of Debian's /usr/bin/python3 (the
# interpreter the extension is built against) holding exactly the lock's
# packages. Made again from scratch when the lock changed (a stamp holds the
# lock's hash) or a previous install did not finish; pip's own cache
# (~/.cache/pip) makes that a local unpack after the first download.
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
LOCK="$ROOT/scripts/requirements.lock"
VENV="${CAIRN_VENV:-$ROOT/.venv}"
STAMP="$VENV/.cairn-requirements.sha256"
want=$(sha256sum "$LOCK" | cut -d' ' -f1)
if [[ -x "$VENV/bin/python" && -f "$STAMP" && "$(cat "$STAMP")" == "$want" ]]; then
  echo "install_deps: $VENV matches scripts/requirements.lock"
else
  echo "install_deps: making $VENV from scripts/requirements.lock (PyPI; torch is a few GB the first time)"
  rm -rf "$VENV"
  /usr/bin/python3 -m venv "$VENV"
  "$VENV/bin/python" -m pip install --quiet --no-input --require-hashes --no-deps \
    --progress-bar off -r "$LOCK"
  "$VENV/bin/python" -m pip check
  echo "$want" > "$STAMP"
fi

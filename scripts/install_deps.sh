#!/usr/bin/env bash
# Installs what Cairn needs to build and test from Debian bookworm's packages.
# Idempotent: installs only what is missing; needs no network beyond apt.
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build pkg-config git
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev librocksdb-dev libgtest-dev libgmock-dev libbenchmark-dev
  libisal-dev libspdlog-dev libcli11-dev nlohmann-json3-dev liburing-dev
  libxxhash-dev  # XXH3, compiled in from its header (planner/plan_cache.cc)
  libgoogle-perftools-dev  # cairnd's allocator, tcmalloc (README "Memory")
  bazel-bootstrap bazel-rules-java
  clang-format fio python3-grpcio
  clang-14 libclang-rt-14-dev  # scripts/fuzz.sh: clang + libFuzzer/ASan/UBSan runtimes
  # The Python package (client/python): pybind11 binding, PyTorch 1.13 (DCP,
  # ShardedTensor, gloo), pytest, and pip/venv for its documented install.
  python3 python3-dev pybind11-dev python3-pybind11 python3-numpy python3-torch
  python3-pytest python3-venv python3-pip python3-setuptools
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
# node and npm (schema validation below): Debian's, unless already installed.
if ! command -v npm >/dev/null; then PACKAGES+=(nodejs npm); fi

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

# Offline schema validation of the Kubernetes manifests: npm kubernetes-models
# pinned by deploy/kubernetes/validate/package-lock.json.
VALIDATE_DIR="$(dirname "$0")/../deploy/kubernetes/validate"
if [[ ! -f "$VALIDATE_DIR/node_modules/.package-lock.json" ||
      "$VALIDATE_DIR/package-lock.json" -nt "$VALIDATE_DIR/node_modules/.package-lock.json" ]]; then
  echo "install_deps: npm ci in deploy/kubernetes/validate"
  (cd "$VALIDATE_DIR" && npm ci --no-audit --no-fund --loglevel=error)
fi

#!/usr/bin/env bash
# Builds Cairn's container images from the source tree:
#   cairn:<version>        cairnd, cairn-agent, cairn (target `runtime`)
#   cairn-train:<version>  the same plus Python, PyTorch and the cairn package
#                          (target `train`, for training pods and the example Job)
# both also tagged :latest.
#
# Usage: deploy/image/build.sh [--base IMAGE] [--engine podman|docker]
#                              [--only runtime|train] [--save DIR]
#   --base    bookworm base image. Default: localhost/debian:bookworm-min, made
#             here with mmdebstrap from this machine's Debian mirror when it
#             does not exist yet (no container registry needed). With registry
#             access, --base docker.io/library/debian:bookworm-slim works too.
#   --engine  default: podman if installed, else docker.
#   --save    also writes DIR/cairn-<version>.oci.tar (OCI archive) for loading
#             into a registry or a node (skopeo copy oci-archive:... docker://...).
# Environment: CAIRN_IMAGE_CCACHE (podman only) host directory for the build
# stage's ccache (default: the host's ccache directory, so objects
# scripts/build.sh compiled are reused); CONTAINERS_CONF as
# podman reads it (default here: deploy/image/containers.conf, runc+cgroupfs).
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
VERSION=$(head -n1 VERSION)

BASE=localhost/debian:bookworm-min
ENGINE=""
ONLY=""
SAVE_DIR=""
while (($#)); do
  case "$1" in
    --base) BASE=$2; shift 2 ;;
    --engine) ENGINE=$2; shift 2 ;;
    --only) ONLY=$2; shift 2 ;;
    --save) SAVE_DIR=$2; shift 2 ;;
    -h|--help) sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "build.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done

if [[ -z "$ENGINE" ]]; then
  if command -v podman >/dev/null; then ENGINE=podman
  elif command -v docker >/dev/null; then ENGINE=docker
  else
    echo "build.sh: neither podman nor docker is installed (Debian: apt-get install podman runc)" >&2
    exit 1
  fi
fi
command -v "$ENGINE" >/dev/null || { echo "build.sh: $ENGINE is not installed" >&2; exit 1; }
if [[ "$ENGINE" == podman && -z "${CONTAINERS_CONF:-}" ]]; then
  export CONTAINERS_CONF="$ROOT/deploy/image/containers.conf"
fi

# The base: made locally when it is the default and missing.
if [[ "$BASE" == localhost/debian:bookworm-min ]] &&
   ! "$ENGINE" image exists "$BASE" 2>/dev/null &&
   ! "$ENGINE" image inspect "$BASE" >/dev/null 2>&1; then
  command -v mmdebstrap >/dev/null || {
    echo "build.sh: base $BASE is missing and mmdebstrap is not installed to make it" \
         "(apt-get install mmdebstrap, or pass --base debian:bookworm-slim with registry access)" >&2
    exit 1
  }
  MIRROR=$(grep -hoE '^(URIs:|deb) *https?://[^ ]+/debian/?' \
             /etc/apt/sources.list.d/*.sources /etc/apt/sources.list 2>/dev/null |
           grep -oE 'https?://[^ ]+' | head -n1 || true)
  MIRROR=${MIRROR:-http://deb.debian.org/debian}
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  echo "build.sh: making $BASE with mmdebstrap from $MIRROR"
  mmdebstrap --quiet --variant=minbase --include=ca-certificates \
    --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr \
    --aptopt='APT::Install-Recommends "false"' \
    --dpkgopt='path-exclude=/usr/share/man/*' \
    --dpkgopt='path-exclude=/usr/share/locale/*' \
    --dpkgopt='path-exclude=/usr/share/doc/*' \
    --dpkgopt='path-exclude=/usr/share/info/*' \
    bookworm "$tmp/base.tar" "$MIRROR"
  "$ENGINE" import "$tmp/base.tar" "$BASE" >/dev/null
fi

CACHE_ARGS=()
if [[ "$ENGINE" == podman ]]; then
  # The host's ccache (scripts/build.sh fills it): most objects are hits.
  CCACHE_HOST=${CAIRN_IMAGE_CCACHE:-}
  if [[ -z "$CCACHE_HOST" ]] && command -v ccache >/dev/null; then
    CCACHE_HOST=$(ccache -k cache_dir)
  fi
  CCACHE_HOST=${CCACHE_HOST:-$HOME/.cache/cairn-image-ccache}
  mkdir -p "$CCACHE_HOST"
  CACHE_ARGS=(-v "$CCACHE_HOST:/ccache")
fi

# Tests compare this label with the tree they run in (stale images fail).
SOURCE_HASH=$(deploy/image/source-hash.sh)
echo "$SOURCE_HASH" > deploy/image/.source-hash  # git-ignored; see Containerfile

build() {  # build TARGET IMAGE
  echo "build.sh: building $2:$VERSION (target $1) from $BASE with $ENGINE"
  "$ENGINE" build --network=host --build-arg "BASE=$BASE" "${CACHE_ARGS[@]}" \
    --build-arg "SOURCE_HASH=$SOURCE_HASH" \
    --target "$1" -f deploy/image/Containerfile \
    -t "$2:$VERSION" -t "$2:latest" .
}
[[ "$ONLY" == train ]] || build runtime localhost/cairn
[[ "$ONLY" == runtime ]] || build train localhost/cairn-train

if [[ -n "$SAVE_DIR" ]]; then
  mkdir -p "$SAVE_DIR"
  "$ENGINE" save --format oci-archive -o "$SAVE_DIR/cairn-$VERSION.oci.tar" \
    "localhost/cairn:$VERSION"
  echo "build.sh: wrote $SAVE_DIR/cairn-$VERSION.oci.tar"
fi
echo "build.sh: done: localhost/cairn:$VERSION localhost/cairn-train:$VERSION"

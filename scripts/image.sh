#!/usr/bin/env bash
# Build and run the sidecar's container image for real, with podman (rootful,
# from Debian's packages) and no container registry:
#
#   scripts/image.sh build   (make image)        the local base (debootstrap, cached
#       outside the repo), then the project's Dockerfile for the CPU variant, with
#       and without baked models; prints sizes and the largest layers and fails
#       over the size budget.
#   scripts/image.sh check   (make image-check)  runs the built image the way the
#       Helm chart runs it: scripts/image/check.py.
#
# Podman's settings for these machines are in scripts/image/containers.conf.
# The Dockerfile is the same one `docker build` uses with python:3.11-slim: only
# PYTHON_IMAGE points at the local stand-in here.
set -euo pipefail

# shellcheck source-path=SCRIPTDIR source=lib/deploy-tools.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/deploy-tools.sh"
# shellcheck source-path=SCRIPTDIR source=image/base.sh
source "$(dirname "${BASH_SOURCE[0]}")/image/base.sh"

export CONTAINERS_CONF="$ROOT/scripts/image/containers.conf"
IMAGE_REPO="${IMAGE_REPO:-localhost/rag-guardrail-sidecar}"
# The CPU image with its models must stay under this (MB, as podman counts:
# the uncompressed layers). What it holds is listed by `build` (largest layers).
IMAGE_SIZE_BUDGET_MB="${IMAGE_SIZE_BUDGET_MB:-600}"
# The host's CA bundle (Debian's path), mounted read-only into RUN steps so pip
# trusts what the host trusts; never copied into a layer.
CA_BUNDLE="/etc/ssl/certs/ca-certificates.crt"
PYTHON="${PYTHON:-python3}"
# The project's environment (make setup): the check drives a real broker from the host.
VENV_PYTHON="${VENV_PYTHON:-$ROOT/.venv/bin/python}"

project_version() {
  "$PYTHON" -c 'import sys, tomllib; print(tomllib.load(open(sys.argv[1], "rb"))["project"]["version"])' \
    "$ROOT/pyproject.toml"
}

# build_variant <tag> <build args...>
build_variant() {
  local tag="$1"; shift
  local mounts=()
  [[ -f "$CA_BUNDLE" ]] && mounts+=(--volume "$CA_BUNDLE:$CA_BUNDLE:ro")
  local start=$SECONDS
  log "podman build $tag $*"
  nice -n 5 podman build --format docker --network host --layers --skip-unused-stages=false \
    "${mounts[@]}" \
    --build-arg "PYTHON_IMAGE=$BASE_IMAGE" --build-arg "VERSION=$(project_version)" \
    "$@" --tag "$tag" "$ROOT" >&2
  log "built $tag in $((SECONDS - start))s: $(image_mb "$tag") MB"
}

image_mb() {
  podman image inspect --format '{{.Size}}' "$1" | awk '{printf "%d", $1 / 1000000}'
}

# largest_layers <image>: the layers that hold most of the image, and inside it
# the largest installed packages and the models.
largest_layers() {
  podman history --no-trunc --format json "$1" | "$PYTHON" -c '
import json, re, sys
layers = sorted((l for l in json.load(sys.stdin) if l["size"] > 0), key=lambda l: -l["size"])
for layer in layers[:5]:
    what = re.sub(r"^/bin/sh -c (#\(nop\) )?", "", layer["CreatedBy"])
    print("%8.1f MB  %s" % (layer["size"] / 1e6, re.sub(r"(dir|file):[0-9a-f]{64}", r"\1", what)[:100]))
'
  log "largest parts of $1"
  podman run --rm --network none --health-interval=disable --entrypoint sh "$1" -c \
    'du -sk /opt/venv/lib/python3*/site-packages/* /models /usr/lib/python3* /usr/lib/x86_64-linux-gnu 2>/dev/null | sort -rn | head -n 10' \
    | awk '{ printf "%8.1f MB  %s\n", $1 / 1000, $2 }'
}

# podman, runc and debootstrap from Debian's packages, installed when missing
# (these machines run as root; elsewhere install them yourself).
ensure_packages() {
  local missing=()
  for tool in podman runc debootstrap; do
    command -v "$tool" >/dev/null || missing+=("$tool")
  done
  ((${#missing[@]} == 0)) && return
  if [[ "$(id -u)" != 0 ]] || ! command -v apt-get >/dev/null; then
    die "${missing[*]} missing: install them (Debian: apt-get install podman runc debootstrap)"
  fi
  log "apt-get install ${missing[*]}"
  apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq podman runc debootstrap >&2
}

cmd_build() {
  local version
  version="$(project_version)"
  ensure_packages
  base_image
  build_variant "$IMAGE_REPO:$version"
  build_variant "$IMAGE_REPO:$version-no-models" --build-arg BAKE_MODELS=false
  log "sizes (uncompressed, as podman counts)"
  printf '%-50s %6s MB\n' "$IMAGE_REPO:$version" "$(image_mb "$IMAGE_REPO:$version")" \
    "$IMAGE_REPO:$version-no-models" "$(image_mb "$IMAGE_REPO:$version-no-models")" \
    "$BASE_IMAGE (base)" "$(image_mb "$BASE_IMAGE")"
  log "largest layers of $IMAGE_REPO:$version"
  largest_layers "$IMAGE_REPO:$version"
  local size
  size="$(image_mb "$IMAGE_REPO:$version")"
  ((size <= IMAGE_SIZE_BUDGET_MB)) \
    || die "$IMAGE_REPO:$version is $size MB, over the budget of $IMAGE_SIZE_BUDGET_MB MB"
  log "image: OK ($size MB <= $IMAGE_SIZE_BUDGET_MB MB budget; ${SECONDS}s)"
}

cmd_check() {
  local version image rendered
  version="$(project_version)"
  image="$IMAGE_REPO:$version"
  podman image exists "$image" || die "no image $image: run make image first"
  [[ -x "$VENV_PYTHON" ]] || die "no $VENV_PYTHON: run make setup kafka-jars first"
  tools_init
  helm_tool
  rendered="$(mktemp --suffix=.yaml)"
  # shellcheck disable=SC2064  # expand now: the path is fixed
  trap "rm -f '$rendered'" EXIT
  # the chart's kubeVersion floor, as scripts/helm-check.sh renders it
  helm template guardrail "$ROOT/charts/guardrail-sidecar" --namespace rag --kube-version 1.29.0 >"$rendered"
  log "image-check: $image as the chart's defaults run it (helm template charts/guardrail-sidecar)"
  (cd "$ROOT" && PYTHONPATH="$ROOT" "$VENV_PYTHON" scripts/image/check.py \
    --image "$image" --version "$version" --rendered "$rendered")
  log "image-check: OK (${SECONDS}s)"
}

case "${1:-}" in
  build) cmd_build ;;
  check) cmd_check ;;
  *) die "usage: $0 build|check" ;;
esac

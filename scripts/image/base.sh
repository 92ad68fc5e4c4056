#!/usr/bin/env bash
# The local stand-in for python:3.11-slim, built without a container registry:
# Debian 12 (bookworm) minbase with Python 3.11 from Debian's packages via
# debootstrap, trimmed, imported into podman as $BASE_IMAGE.
#
# Cached outside the repository ($IMAGE_CACHE, default ~/.cache/guardrail/image):
# the trimmed root filesystem as a tarball, keyed by a hash of this recipe, so
# the slow part (debootstrap: minutes) runs once per machine; a missing podman
# image is re-imported from the tarball in seconds.
#
# The Debian mirror is the host's own (its apt sources), or $DEBIAN_MIRROR.
# Sourced by scripts/image.sh; `base_image` is the entry point.

BASE_IMAGE="${BASE_IMAGE:-localhost/python:3.11-bookworm}"
BASE_SUITE="bookworm"
# What the Dockerfile needs from its base: python3 (3.11) with venv (ensurepip,
# for the builder's own pip), CA certificates for pip. The two python3-* packages
# complete the standard library Debian splits off.
BASE_PACKAGES="python3.11,python3.11-venv,python3-distutils,python3-lib2to3,ca-certificates"
IMAGE_CACHE="${IMAGE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/guardrail/image}"

# The first URI of the host's apt sources that serves $BASE_SUITE (deb822 or
# one-line format); $DEBIAN_MIRROR overrides it.
debian_mirror() {
  if [[ -n "${DEBIAN_MIRROR:-}" ]]; then
    printf '%s\n' "$DEBIAN_MIRROR"
    return
  fi
  local mirror
  mirror="$(
    awk -v suite="$BASE_SUITE" '
      /^URIs:/   { uri = $2 }
      /^Suites:/ { for (i = 2; i <= NF; i++) if ($i == suite && uri != "") { print uri; exit } }
      /^deb / && $3 == suite { print $2; exit }
    ' /etc/apt/sources.list.d/*.sources /etc/apt/sources.list 2>/dev/null | head -n 1
  )"
  [[ -n "$mirror" ]] || die "no Debian mirror for $BASE_SUITE in /etc/apt/sources*: set DEBIAN_MIRROR"
  printf '%s\n' "$mirror"
}

# Everything that changes the base's contents: rebuilt when this changes.
base_recipe_hash() {
  printf '%s\n' "$BASE_SUITE" "$BASE_PACKAGES" "$(declare -f trim_rootfs)" | sha256sum | cut -c1-16
}

# Drop what a runtime image never reads: apt's state and caches, docs, man
# pages, locales, logs. Python's standard library stays whole.
trim_rootfs() {
  local root="$1"
  rm -rf "$root"/var/cache/apt/* "$root"/var/lib/apt/lists/* "$root"/var/log/* \
    "$root"/usr/share/doc/* "$root"/usr/share/man/* "$root"/usr/share/info/* \
    "$root"/usr/share/locale/* "$root"/usr/share/lintian "$root"/tmp/* \
    "$root"/var/cache/debconf/*-old "$root"/var/lib/dpkg/*-old
}

base_image() {
  command -v podman >/dev/null || die "podman is required (apt-get install podman runc debootstrap)"
  local hash tarball
  hash="$(base_recipe_hash)"
  tarball="$IMAGE_CACHE/base-$BASE_SUITE-$hash.tar"
  if [[ "$(podman image inspect --format '{{index .Labels "io.guardrail.base-recipe"}}' "$BASE_IMAGE" 2>/dev/null)" == "$hash" ]]; then
    log "base image $BASE_IMAGE (recipe $hash): already imported"
    return
  fi
  if [[ ! -f "$tarball" ]]; then
    command -v debootstrap >/dev/null || die "debootstrap is required (apt-get install debootstrap)"
    [[ "$(id -u)" == 0 ]] || die "debootstrap needs root"
    local mirror root start=$SECONDS
    mirror="$(debian_mirror)"
    mkdir -p "$IMAGE_CACHE"
    root="$(mktemp -d "$IMAGE_CACHE/rootfs.XXXXXX")"
    log "debootstrap $BASE_SUITE minbase + $BASE_PACKAGES (once per machine; minutes)"
    if ! nice -n 5 debootstrap --variant=minbase --include="$BASE_PACKAGES" \
        "$BASE_SUITE" "$root" "$mirror" >"$IMAGE_CACHE/debootstrap.log" 2>&1; then
      tail -n 20 "$IMAGE_CACHE/debootstrap.log" >&2
      rm -rf "$root"
      die "debootstrap failed (log: $IMAGE_CACHE/debootstrap.log)"
    fi
    trim_rootfs "$root"
    tar -C "$root" --numeric-owner -cf "$tarball.tmp" .
    mv "$tarball.tmp" "$tarball"
    rm -rf "$root"
    log "base root filesystem: $(du -h "$tarball" | cut -f1) in $((SECONDS - start))s ($tarball)"
  fi
  podman import --quiet \
    --change 'ENV LANG=C.UTF-8' \
    --change 'CMD ["python3"]' \
    --change "LABEL io.guardrail.base-recipe=$hash" \
    "$tarball" "$BASE_IMAGE" >/dev/null
  log "imported $BASE_IMAGE (recipe $hash)"
}

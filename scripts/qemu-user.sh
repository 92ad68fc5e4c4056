#!/usr/bin/env bash
# qemu-user (qemu-x86_64) from Debian's packages, installed when missing: the golden-output
# test under an emulated AVX2 CPU (tests/lookback/test_golden_emulated.py) needs it, and it
# skipped on every fresh machine. Where this cannot install it (not root, no apt-get), it
# says so and the test skips with the same words.
set -euo pipefail
command -v qemu-x86_64 >/dev/null && exit 0
if [[ "$(id -u)" != 0 ]] || ! command -v apt-get >/dev/null; then
  echo "qemu-user: qemu-x86_64 missing and not installable here (apt-get install -y qemu-user);" \
    "the emulated-AVX2 golden test will skip" >&2
  exit 0
fi
echo "==> apt-get install qemu-user (once per machine)" >&2
apt-get update -qq >/dev/null
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends qemu-user >/dev/null
command -v qemu-x86_64 >/dev/null

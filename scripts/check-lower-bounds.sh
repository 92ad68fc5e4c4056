#!/usr/bin/env bash
# Install every direct dependency at the lowest version pyproject.toml allows and
# run the tests that need only the serving stack. CI resolves the newest versions,
# so without this the lower bounds are untested claims: a team whose environment
# pins numpy 1.26 or onnxruntime 1.20 gets exactly what this run gets.
#
#   1. a venv in .tools/lower-bounds (git-ignored, as the deploy tools), uv from PyPI;
#   2. `uv pip install --resolution lowest-direct -e ".[dev,train]"` (no torch: the
#      serving path and the client must not need it), and the versions it chose;
#   3. pytest on the unit tests (no real broker, none that import torch);
#      `--connected` runs the real-broker tests (tests/kafka/*_real.py) instead, with
#      --require-connected, which checks the aiokafka / faststream bounds.
#
# Needs PyPI (nothing else). Not part of `make test`: on 2 shared cores the
# install takes ~20 s and the unit tests 25-30 min (1,227 of them took 17 min).
set -euo pipefail

cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
VENV=.tools/lower-bounds

mkdir -p .tools
[[ -f .tools/.gitignore ]] || printf '*\n' >.tools/.gitignore
if [[ ! -x $VENV/bin/uv ]]; then
  "$PY" -m venv "$VENV"
  "$VENV/bin/pip" install --quiet uv
fi
"$VENV/bin/uv" pip install --quiet --python "$VENV/bin/python" \
  --resolution lowest-direct -e ".[dev,train]"
"$VENV/bin/uv" pip list --python "$VENV/bin/python" 2>/dev/null \
  | grep -Ei '^(aiokafka|faststream|pydantic|pydantic-core|pydantic-settings|orjson|numpy|onnxruntime|qdrant-client|tokenizers|opentelemetry-sdk|opentelemetry-exporter-prometheus|prometheus-client|lz4|zstandard|cramjam|pyyaml|tqdm) '

# torch / transformers (the ml extra) and aiohttp (the service extra) are not installed
NEEDS_ML=(
  --ignore=tests/client/test_hf_recorder.py
  --ignore=tests/client/test_hf_recorder_smollm2.py
  --ignore=tests/examples
  --ignore=tests/lab/generator
  --ignore=tests/cli/test_outcomes_key.py
  --ignore=tests/deploy
)
if [[ ${1:-} == --connected ]]; then
  exec env PYTHONPATH="$PWD" "$VENV/bin/pytest" -q -p no:cacheprovider --require-connected \
    "${NEEDS_ML[@]}" tests/kafka/*_real.py tests/client/test_hostile_verdicts_real.py
fi
exec env PYTHONPATH="$PWD" "$VENV/bin/pytest" -q -p no:cacheprovider -m "not connected" \
  "${NEEDS_ML[@]}" tests

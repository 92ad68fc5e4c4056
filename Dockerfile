# syntax=docker/dockerfile:1.7
#
# The guardrail sidecar's runtime image: the project's wheel and its runtime
# dependencies only (no torch, no transformers, no training extras).
#
#   docker build -t guardrail-sidecar:0.1.0 .                                  # CPU, models/ baked in
#   docker build -t guardrail-sidecar:0.1.0-gpu --build-arg VARIANT=gpu .      # CUDA
#   docker build --build-arg BAKE_MODELS=false -t ... .                         # an empty /models
#
# Without a Docker engine or a registry: `make image` builds it with podman on a
# local Debian base (scripts/image.sh); `make image-check` runs it as the chart does.
#
# Runs as uid 10001 on a read-only root filesystem: the only writable path it
# needs is /tmp (an emptyDir in Kubernetes; `docker run --read-only --tmpfs /tmp`).
# Models: the default build bakes the repository's models/ into /models, which
# is where the Helm chart's default values read them (models.dir=/models, no
# models.volume); tests/deploy/test_kubernetes_start.py keeps the two in step.
# With a read-only volume at /models (the chart's models.volume, e.g.
# helm/values-prod.yaml's PVC) build with BAKE_MODELS=false: an empty mount point.
#
# GPU variant: the `gpu` extra (onnxruntime-gpu) replaces onnxruntime, and the
# CUDA / cuDNN user-space libraries come as NVIDIA's wheels from PyPI
# (onnxruntime-gpu[cuda,cudnn]) registered with the dynamic linker, so both
# variants share the same python:3.11-slim base and the same interpreter. The
# host needs the NVIDIA driver and container toolkit (the Kubernetes device
# plugin, which also sets NVIDIA_VISIBLE_DEVICES - the image deliberately does
# not, so a CPU pod never sees GPUs); the driver must support the CUDA major
# version those wheels target (pin ORT_GPU_REQUIREMENT for older drivers).
# Locally: docker run --gpus all --read-only --tmpfs /tmp guardrail-sidecar:0.1.0-gpu

ARG PYTHON_IMAGE=python:3.11-slim
ARG VARIANT=cpu
ARG BAKE_MODELS=true

# Layers, from the least to the most often changed: the runtime dependencies
# (keyed by the dependency list alone), the models, then the project's own code
# (a few hundred kB). A change to sidecar/ rebuilds only the last layer; a change
# to pyproject.toml that leaves [project.dependencies] alone reinstalls nothing.
#
# The base needs python3 (3.11) with venv/ensurepip and nothing else: the
# public python:3.11-slim, or any Debian-like image with Python 3.11
# (scripts/image.sh builds such a base locally with debootstrap).

# ------------------------------------------------------------ requirements
# The runtime dependencies (and the build backend) as plain requirement files,
# read from pyproject.toml. Only this stage sees pyproject.toml: the next
# stage copies the extracted lists, and its cache is keyed by their content.
FROM ${PYTHON_IMAGE} AS requirements
ARG VARIANT
COPY pyproject.toml /src/pyproject.toml
RUN python3 -c 'import sys, tomllib; \
p = tomllib.load(open("/src/pyproject.toml", "rb")); variant = sys.argv[1]; \
variant in ("cpu", "gpu") or sys.exit(f"VARIANT must be cpu or gpu, got {variant!r}"); \
extra = p["project"]["optional-dependencies"]["gpu"] if variant == "gpu" else []; \
open("/runtime.txt", "w").write("\n".join(p["project"]["dependencies"] + extra) + "\n"); \
open("/build.txt", "w").write("\n".join(p["build-system"]["requires"]) + "\n")' "${VARIANT}"

# -------------------------------------------------------------------- deps
# /opt/venv with the runtime dependencies only. It has no pip of its own: a
# separate build venv (/opt/build: pip and the build backend) installs into it.
# pip compiles the .pyc files now, so the read-only image never writes bytecode.
# GPU: onnxruntime (a base dependency) and onnxruntime-gpu install the same
# package directory, so both are removed and the GPU build alone is
# reinstalled, with NVIDIA's CUDA/cuDNN wheels, whose library directories are
# recorded for the dynamic linker. Finally the serving path must not have
# dragged in the training / generator stack.
FROM ${PYTHON_IMAGE} AS deps
ARG VARIANT
ARG ORT_GPU_REQUIREMENT="onnxruntime-gpu[cuda,cudnn]"
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore \
    PYTHONDONTWRITEBYTECODE=1
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
COPY --from=requirements /runtime.txt /build.txt /requirements/
RUN --mount=type=cache,id=guardrail-pip,target=/root/.cache/pip \
    set -eux; \
    python3 -m venv /opt/build; \
    /opt/build/bin/pip install --requirement /requirements/build.txt; \
    python3 -m venv --without-pip /opt/venv; \
    pip_venv() { /opt/build/bin/pip --python /opt/venv/bin/python "$@"; }; \
    pip_venv install --requirement /requirements/runtime.txt; \
    if [ "${VARIANT}" = "gpu" ]; then \
      ort_version="$(pip_venv show onnxruntime-gpu | sed -n 's/^Version: //p')"; \
      pip_venv uninstall --yes onnxruntime onnxruntime-gpu; \
      pip_venv install "${ORT_GPU_REQUIREMENT}==${ort_version}"; \
      find /opt/venv -path '*/site-packages/nvidia/*' -type d -name lib | sort >/opt/venv/nvidia-libs.conf; \
    else \
      : >/opt/venv/nvidia-libs.conf; \
    fi; \
    if pip_venv show torch transformers scikit-learn >/dev/null 2>&1; then \
      echo "torch / transformers / scikit-learn ended up in the runtime venv" >&2; exit 1; \
    fi

# ----------------------------------------------------------------- project
# The project's wheel, built by the build venv and installed into /opt/venv
# without dependencies (`pip check` proves they are all there); then its files
# alone - the package, its dist-info, the `guardrail` script - are collected in
# /project, the runtime's last layer.
FROM deps AS project
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
WORKDIR /
COPY pyproject.toml README.md /src/
COPY sidecar/ /src/sidecar/
COPY guardrail_client/ /src/guardrail_client/
RUN set -eux; \
    pip_venv() { /opt/build/bin/pip --python /opt/venv/bin/python "$@"; }; \
    /opt/build/bin/pip wheel --no-cache-dir --no-deps --no-build-isolation --wheel-dir /wheels /src; \
    pip_venv install --no-cache-dir --no-deps /wheels/*.whl; \
    pip_venv check; \
    site="$(/opt/venv/bin/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')"; \
    mkdir /project; \
    pip_venv show --files rag-guardrail-sidecar | sed '1,/^Files:/d' \
      | while read -r f; do realpath -m --relative-to=/ "${site}/${f}"; done \
      | xargs cp --parents --preserve=mode,timestamps --target-directory=/project; \
    test -x /project/opt/venv/bin/guardrail; \
    /opt/venv/bin/guardrail --help >/dev/null

# ------------------------------------------------------------------ models
# Baked into /models by default (BAKE_MODELS=true) from MODELS_SRC (a directory
# in the build context, default models; let it through .dockerignore).
# --build-arg BAKE_MODELS=false leaves an empty /models for a read-only volume;
# BuildKit then builds only that stage, so MODELS_SRC need not exist (the legacy
# builder builds every stage: use BuildKit). Podman/buildah does not see the
# stage named through the build arg: build with --skip-unused-stages=false
# (scripts/image.sh does).
FROM ${PYTHON_IMAGE} AS models-false
RUN mkdir /models

FROM scratch AS models-true
ARG MODELS_SRC=models
COPY ${MODELS_SRC}/ /models/

# (a stage of this file, selected by the build arg: no registry tag applies)
# hadolint ignore=DL3006
FROM models-${BAKE_MODELS} AS models

# ----------------------------------------------------------------- runtime
FROM ${PYTHON_IMAGE} AS runtime
ARG VARIANT
ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="rag-guardrail-sidecar" \
      org.opencontainers.image.description="Kafka-native guardrail sidecar for RAG services: allow / caveat / block per answer and per claim" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      io.guardrail.variant="${VARIANT}"

ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PYTHONFAULTHANDLER=1 \
    HOME=/tmp \
    TMPDIR=/tmp \
    GUARDRAIL_MODELS__DIR=/models \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility

RUN groupadd --system --gid 10001 guardrail \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin guardrail

COPY --from=deps /opt/venv /opt/venv
# GPU variant: let the dynamic linker find the CUDA / cuDNN libraries shipped
# as wheels (an empty file, and a no-op, for the CPU variant).
RUN cp /opt/venv/nvidia-libs.conf /etc/ld.so.conf.d/zz-guardrail-nvidia.conf && ldconfig
# /models: an empty mount point, or the baked artifacts. GUARDRAIL_MODELS__DIR names it:
# the default, "models", is relative, and the working directory (/tmp) is writable by
# anyone in the container (audit: a models/ folder planted there was served).
COPY --from=models /models /models
# The project itself: the only layer a code change rebuilds.
COPY --from=project /project/ /

USER 10001:10001
WORKDIR /tmp
EXPOSE 8080 9464

# Kubernetes uses the chart's probes; this is for `docker run`.
HEALTHCHECK --interval=30s --timeout=3s --start-period=60s --retries=3 \
  CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/livez' % os.environ.get('GUARDRAIL_HTTP__PORT', '8080'), timeout=2)"]

ENTRYPOINT ["guardrail"]
CMD ["run"]

# syntax=docker/dockerfile:1.7
#
# The guardrail sidecar's runtime image: the project's wheel and its runtime
# dependencies only (no torch, no transformers, no training extras).
#
#   docker build -t guardrail-sidecar:0.1.0 .                                  # CPU, models/ baked in
#   docker build -t guardrail-sidecar:0.1.0-gpu --build-arg VARIANT=gpu .      # CUDA
#   docker build --build-arg BAKE_MODELS=false -t ... .                         # an empty /models
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

# ---------------------------------------------------------------- builder
FROM ${PYTHON_IMAGE} AS builder
ARG VARIANT
ARG ORT_GPU_REQUIREMENT="onnxruntime-gpu[cuda,cudnn]"
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_ROOT_USER_ACTION=ignore \
    PYTHONDONTWRITEBYTECODE=1
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
WORKDIR /src
# Only the packaging inputs: a change to models/ or the chart does not
# invalidate the dependency layer.
COPY pyproject.toml README.md ./
COPY sidecar/ sidecar/
# The venv has no pip of its own: the builder's pip installs into it.
# `pip install /src` builds the project's wheel and installs it with the runtime
# dependencies only; pip compiles the .pyc files now, so the read-only image
# never writes bytecode. GPU: onnxruntime (a base dependency) and
# onnxruntime-gpu install the same package directory, so both are removed and
# the GPU build alone is reinstalled, with NVIDIA's CUDA/cuDNN wheels, whose
# library directories are recorded for the dynamic linker. Finally the serving
# path must not have dragged in the training / generator stack.
RUN set -eux; \
    case "${VARIANT}" in cpu|gpu) ;; *) echo "VARIANT must be cpu or gpu, got '${VARIANT}'" >&2; exit 1;; esac; \
    python -m venv --without-pip /opt/venv; \
    pip_venv() { python -m pip --python /opt/venv/bin/python "$@"; }; \
    if [ "${VARIANT}" = "gpu" ]; then \
      pip_venv install "/src[gpu]"; \
      ort_version="$(pip_venv show onnxruntime-gpu | sed -n 's/^Version: //p')"; \
      pip_venv uninstall --yes onnxruntime onnxruntime-gpu; \
      pip_venv install "${ORT_GPU_REQUIREMENT}==${ort_version}"; \
      find /opt/venv -path '*/site-packages/nvidia/*' -type d -name lib | sort >/opt/venv/nvidia-libs.conf; \
    else \
      pip_venv install /src; \
      : >/opt/venv/nvidia-libs.conf; \
    fi; \
    if pip_venv show torch transformers scikit-learn >/dev/null 2>&1; then \
      echo "torch / transformers / scikit-learn ended up in the runtime venv" >&2; exit 1; \
    fi; \
    /opt/venv/bin/guardrail --help >/dev/null

# ------------------------------------------------------------------ models
# Baked into /models by default (BAKE_MODELS=true) from MODELS_SRC (a directory
# in the build context, default models; let it through .dockerignore).
# --build-arg BAKE_MODELS=false leaves an empty /models for a read-only volume;
# BuildKit then builds only that stage, so MODELS_SRC need not exist (the legacy
# builder builds every stage: use BuildKit).
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
    NVIDIA_DRIVER_CAPABILITIES=compute,utility

RUN groupadd --system --gid 10001 guardrail \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin guardrail

COPY --from=builder /opt/venv /opt/venv
# /models: an empty mount point, or the baked artifacts.
COPY --from=models /models /models
# GPU variant: let the dynamic linker find the CUDA / cuDNN libraries shipped
# as wheels (an empty file, and a no-op, for the CPU variant).
RUN cp /opt/venv/nvidia-libs.conf /etc/ld.so.conf.d/zz-guardrail-nvidia.conf && ldconfig

USER 10001:10001
WORKDIR /tmp
EXPOSE 8080 9464

# Kubernetes uses the chart's probes; this is for `docker run`.
HEALTHCHECK --interval=30s --timeout=3s --start-period=60s --retries=3 \
  CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/livez' % os.environ.get('GUARDRAIL_HTTP__PORT', '8080'), timeout=2)"]

ENTRYPOINT ["guardrail"]
CMD ["run"]

# The mpjob operator image: slim Python, non-root, no torch, installed from uv.lock.
# Build from the repository root: docker build -t mpjob-operator:0.1.0 .
ARG PYTHON_IMAGE=python:3.11.14-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV UV_PROJECT_ENVIRONMENT=/opt/mpjob \
    UV_COMPILE_BYTECODE=1 \
    UV_LINK_MODE=copy \
    UV_PYTHON_DOWNLOADS=never
RUN python -m pip install --no-cache-dir uv==0.13.8
WORKDIR /src
# The whole workspace's metadata is needed to read the lock; only the operator's packages
# (mpjob and mpjob-contract) are installed: --package mpjob never pulls torch.
COPY pyproject.toml uv.lock ./
COPY trainer-image/pyproject.toml trainer-image/pyproject.toml
COPY contract/ contract/
COPY operator/ operator/
RUN uv sync --locked --no-dev --no-editable --package mpjob \
 && ! /opt/mpjob/bin/python -c "import torch" 2>/dev/null

FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="mpjob-operator" \
      org.opencontainers.image.description="Kubernetes operator for mixed-precision training with automatic precision fallback"
COPY --from=build /opt/mpjob /opt/mpjob
ENV PATH=/opt/mpjob/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    MALLOC_ARENA_MAX=2
# (MALLOC_ARENA_MAX: glibc gives every handler thread its own heap arena otherwise, and the
# operator's resident memory grows with the thread count rather than with the jobs.)
# A numeric UID so runAsNonRoot can verify it without /etc/passwd.
USER 65532:65532
EXPOSE 8080 8081
ENTRYPOINT ["mpjob", "operator"]

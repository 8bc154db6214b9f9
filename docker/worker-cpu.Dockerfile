# Worker on CPU: loads a model once and runs block jobs (tests, CPU-only clusters, the built-in toyworld model).
#   docker build -f docker/worker-cpu.Dockerfile -t inferix/worker-cpu .
# PyTorch's CPU build is installed first, from its own index, so no CUDA libraries come in; then the
# ground layer (inferix/) and the worker's package with the `worker` extra of pyproject.toml.
FROM python:3.11.11-slim-bookworm AS build
ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 PATH=/opt/venv/bin:$PATH
RUN python -m venv /opt/venv \
    && pip install --no-cache-dir "torch==${TORCH_VERSION}" --index-url "${TORCH_INDEX_URL}"
WORKDIR /src
COPY pyproject.toml README.md ./
COPY inferix/ inferix/
COPY engine/ engine/
COPY workers/ workers/
RUN pip install --no-cache-dir "./[worker]"

FROM python:3.11.11-slim-bookworm
LABEL org.opencontainers.image.title="inferix-worker-cpu" \
      org.opencontainers.image.description="Inferix worker (CPU)" \
      org.opencontainers.image.licenses="Apache-2.0"
RUN groupadd --system --gid 10001 inferix \
    && useradd --system --uid 10001 --gid inferix --home-dir /home/inferix --create-home inferix
COPY --from=build /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 \
    INFERIX_WORKER_HOST=0.0.0.0 INFERIX_WORKER_PORT=50052 INFERIX_DEVICE=cpu
WORKDIR /home/inferix
USER 10001:10001
EXPOSE 50052
HEALTHCHECK --interval=30s --timeout=5s --start-period=300s --retries=3 \
    CMD ["python", "-m", "inferix.health", "127.0.0.1:50052"]
ENTRYPOINT ["python", "-m", "workers"]

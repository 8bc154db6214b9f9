# Worker on NVIDIA GPUs: loads a model once and runs block jobs; a multi-GPU pod runs one rank per
# GPU under torchrun (see engine/parallel/README.md).
#   docker build -f docker/worker-cuda.Dockerfile -t inferix/worker-cuda .
# The CUDA base image brings the NVIDIA container runtime settings; the PyTorch CUDA wheels bring
# their own CUDA libraries, so the small `base` flavour is enough. The host needs a driver that
# supports the CUDA version of TORCH_INDEX_URL; torch from there satisfies the `worker` extra, which
# brings the rest. Python is a uv-managed CPython (standalone build).
FROM ghcr.io/astral-sh/uv:0.6.14 AS uv

FROM nvidia/cuda:12.8.1-base-ubuntu24.04 AS build
ARG PYTHON_VERSION=3.11.11
ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128
COPY --from=uv /uv /usr/local/bin/uv
ENV UV_PYTHON_INSTALL_DIR=/opt/python UV_PYTHON_PREFERENCE=only-managed UV_NO_CACHE=1 UV_LINK_MODE=copy \
    UV_COMPILE_BYTECODE=1
RUN uv venv --python "${PYTHON_VERSION}" /opt/venv \
    && uv pip install --python /opt/venv/bin/python "torch==${TORCH_VERSION}" --index-url "${TORCH_INDEX_URL}"
WORKDIR /src
COPY pyproject.toml README.md ./
COPY inferix/ inferix/
COPY engine/ engine/
COPY workers/ workers/
RUN uv pip install --python /opt/venv/bin/python "./[worker]"

FROM nvidia/cuda:12.8.1-base-ubuntu24.04
LABEL org.opencontainers.image.title="inferix-worker-cuda" \
      org.opencontainers.image.description="Inferix worker (CUDA)" \
      org.opencontainers.image.licenses="Apache-2.0"
RUN groupadd --system --gid 10001 inferix \
    && useradd --system --uid 10001 --gid inferix --home-dir /home/inferix --create-home inferix
COPY --from=build /opt/python /opt/python
COPY --from=build /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 \
    NVIDIA_VISIBLE_DEVICES=all NVIDIA_DRIVER_CAPABILITIES=compute,utility \
    INFERIX_WORKER_HOST=0.0.0.0 INFERIX_WORKER_PORT=50052 INFERIX_DEVICE=cuda
WORKDIR /home/inferix
USER 10001:10001
EXPOSE 50052
HEALTHCHECK --interval=30s --timeout=5s --start-period=600s --retries=3 \
    CMD ["python", "-m", "inferix.health", "127.0.0.1:50052"]
ENTRYPOINT ["python", "-m", "workers"]

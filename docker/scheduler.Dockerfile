# Scheduler: the client-facing gRPC service (sessions, admission, block dispatch). CPU only.
#   docker build -f docker/scheduler.Dockerfile -t inferix/scheduler .
# No PyTorch: only the ground layer (inferix/) and this service's package, with the base dependencies
# and the `scheduler` extra of pyproject.toml.
FROM python:3.11.11-slim-bookworm AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 PATH=/opt/venv/bin:$PATH
RUN python -m venv /opt/venv
WORKDIR /src
COPY pyproject.toml README.md ./
COPY inferix/ inferix/
COPY scheduler/ scheduler/
RUN pip install --no-cache-dir "./[scheduler]"

FROM python:3.11.11-slim-bookworm
LABEL org.opencontainers.image.title="inferix-scheduler" \
      org.opencontainers.image.description="Inferix scheduler" \
      org.opencontainers.image.licenses="Apache-2.0"
RUN groupadd --system --gid 10001 inferix \
    && useradd --system --uid 10001 --gid inferix --home-dir /home/inferix --create-home inferix
COPY --from=build /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 \
    INFERIX_SCHEDULER_HOST=0.0.0.0 INFERIX_SCHEDULER_PORT=50051 INFERIX_SCHEDULER_INTERNAL_PORT=50055
WORKDIR /home/inferix
USER 10001:10001
EXPOSE 50051
# With TLS (INFERIX_TLS_CERT / _KEY) the API port speaks only TLS; the plaintext internal port answers.
HEALTHCHECK --interval=30s --timeout=5s --start-period=20s --retries=3 \
    CMD ["sh", "-c", "python -m inferix.health 127.0.0.1:50051 || python -m inferix.health 127.0.0.1:50055"]
ENTRYPOINT ["python", "-m", "scheduler"]

# kvcache_svc: worker registry, KV admission control, committed block latents (Redis). CPU only.
#   docker build -f docker/kvcache-svc.Dockerfile -t inferix/kvcache-svc .
# No PyTorch: only the ground layer (inferix/) and this service's package, with the base dependencies
# and the `kvcache` extra of pyproject.toml.
FROM python:3.11.11-slim-bookworm AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 PATH=/opt/venv/bin:$PATH
RUN python -m venv /opt/venv
WORKDIR /src
COPY pyproject.toml README.md ./
COPY inferix/ inferix/
COPY kvcache_svc/ kvcache_svc/
RUN pip install --no-cache-dir "./[kvcache]"

FROM python:3.11.11-slim-bookworm
LABEL org.opencontainers.image.title="inferix-kvcache-svc" \
      org.opencontainers.image.description="Inferix KV-cache placement service" \
      org.opencontainers.image.licenses="Apache-2.0"
RUN groupadd --system --gid 10001 inferix \
    && useradd --system --uid 10001 --gid inferix --home-dir /home/inferix --create-home inferix
COPY --from=build /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 \
    INFERIX_KVCACHE_HOST=0.0.0.0 INFERIX_KVCACHE_PORT=50053
WORKDIR /home/inferix
USER 10001:10001
EXPOSE 50053
HEALTHCHECK --interval=30s --timeout=5s --start-period=20s --retries=3 \
    CMD ["python", "-m", "inferix.health", "127.0.0.1:50053"]
ENTRYPOINT ["python", "-m", "kvcache_svc"]

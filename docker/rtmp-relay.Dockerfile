# RTMP relay: nginx with the RTMP module (Debian's libnginx-mod-rtmp), run as a non-root user.
#   docker build -f docker/rtmp-relay.Dockerfile -t inferix/rtmp-relay .
# Port 1935: RTMP (publish from the streamer, play from OBS / VLC / ffplay); 8080: /healthz, /stat.
FROM debian:12.10-slim
LABEL org.opencontainers.image.title="inferix-rtmp-relay" \
      org.opencontainers.image.description="nginx RTMP relay for Inferix sessions" \
      org.opencontainers.image.licenses="Apache-2.0"
# Debian's security updates replace package versions in place, so apt versions are not pinned; the
# base image is pinned by tag and the image is rebuilt to pick up fixes.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends nginx libnginx-mod-rtmp \
    && rm -rf /var/lib/apt/lists/* /etc/nginx/sites-enabled/* \
    && groupadd --system --gid 10001 relay \
    && useradd --system --uid 10001 --gid relay --no-create-home --home-dir /nonexistent relay
COPY docker/rtmp-relay/nginx.conf /etc/nginx/nginx.conf
USER 10001:10001
EXPOSE 1935 8080
HEALTHCHECK --interval=30s --timeout=5s --start-period=5s --retries=3 \
    CMD ["bash", "-c", "exec 3<>/dev/tcp/127.0.0.1/1935"]
ENTRYPOINT ["nginx", "-g", "daemon off;"]

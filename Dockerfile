# The trainvigil daemon (`vigil up`) as a sidecar image. Training images install the
# light `trainvigil` agent instead; torch is not needed here.
#
#   docker build -t trainvigil .
#   docker compose up -d          # NATS (JetStream) + daemon + Prometheus, see compose.yaml
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /src
# Only what the build backend needs, so unrelated changes (tests, examples) keep the layer cached.
COPY pyproject.toml README.md ./
COPY src/ src/
COPY schemas/ schemas/
COPY agents/ agents/
COPY daemon/ daemon/
RUN pip install '.[daemon]' \
    && useradd --create-home --uid 10001 vigil \
    && mkdir -p /data \
    && chown vigil:vigil /data

# A named volume mounted on /data starts with this directory's owner, so the daemon can
# write its DuckDB file without running as root.
USER vigil
WORKDIR /data
VOLUME /data
EXPOSE 9464

ENTRYPOINT ["vigil"]
CMD ["up", "--data-dir", "/data", "--nats", "nats://nats:4222", "--http-host", "0.0.0.0", "--http-port", "9464"]

# source-backfill daemon image (multi-stage: build the wheel, then a slim Python + JRE runtime).
# Build: docker build -t source-backfill .
# Run:   docker run -p 8080:8080 -p 9108:9108 -e KAFKA_BOOTSTRAP_SERVERS=broker:9092 \
#          -e SOURCE_BACKFILL_API__TOKEN=... -v sb-data:/var/lib/source-backfill source-backfill
# The image's config (deploy/image/config.toml) reads the brokers from KAFKA_BOOTSTRAP_SERVERS and keeps
# state and tables on the volume; the API listens on 0.0.0.0, so it refuses to start without a token (or
# SOURCE_BACKFILL_API__ALLOW_UNAUTHENTICATED=true). tests/integration/deploy/test_image.py installs the
# wheel the way this file does and starts it with this config; `make test-containers` builds this file and
# runs the image (tests/containers/test_image.py).
#
# The base: python:3.11-slim on Debian 12 "bookworm", pinned by its tag, because the JDK/JRE packages below
# (openjdk-17-*) exist in bookworm and not in Debian 13, which the bare `3.11-slim` tag now follows.
# BASE_IMAGE overrides it, for a mirror or a stand-in of the same Debian release (make test-containers
# builds on localhost/python-standin:3.11-slim-bookworm, made with debootstrap: no registry is reachable).
ARG BASE_IMAGE=python:3.11-slim-bookworm

FROM ${BASE_IMAGE} AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY source_backfill ./source_backfill
COPY connectors ./connectors
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

FROM ${BASE_IMAGE} AS jars
# The JVM parts pinned in deploy/jvm/pom.xml (Spark's Kafka connector, delta-spark, the Kafka broker),
# fetched with the same command as `make jars`, so the image runs offline.
RUN apt-get update && apt-get install -y --no-install-recommends maven openjdk-17-jdk-headless \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl
COPY deploy/jvm/pom.xml /opt/source-backfill/deploy/jvm/pom.xml
RUN SOURCE_BACKFILL_JARS=/opt/source-backfill/jvm SOURCE_BACKFILL_JVM_POM=/opt/source-backfill/deploy/jvm/pom.xml \
    python -m source_backfill.runtime.jvm fetch

FROM ${BASE_IMAGE}
# java from Debian's package (any architecture: amd64 and arm64), found on PATH
RUN apt-get update && apt-get install -y --no-install-recommends openjdk-17-jre-headless procps \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels
COPY --from=jars /opt/source-backfill/jvm /opt/source-backfill/jvm
COPY deploy/image/config.toml /etc/source-backfill/config.toml
# State and tables on the volume whatever config is mounted (the environment overrides the file).
ENV PYTHONUNBUFFERED=1 \
    SOURCE_BACKFILL_JARS=/opt/source-backfill/jvm \
    SOURCE_BACKFILL_DAEMON__STATE_ROOT=/var/lib/source-backfill/state \
    SOURCE_BACKFILL_DAEMON__DATA_ROOT=/var/lib/source-backfill \
    SOURCE_BACKFILL_API__HOST=0.0.0.0

# An unprivileged user with a passwd entry (uid 10001): Hadoop's login inside Spark fails for a uid without
# a name, and Kubernetes' runAsNonRoot (deploy/k8s/deployment.yaml) needs a numeric non-root USER. The data
# folder belongs to it, so a new named volume does too (Docker copies the owner).
RUN useradd --system --uid 10001 --user-group --home-dir /var/lib/source-backfill --no-create-home source-backfill \
 && mkdir -p /var/lib/source-backfill && chown 10001:10001 /var/lib/source-backfill
USER 10001:10001

VOLUME ["/var/lib/source-backfill"]
EXPOSE 8080 9108
HEALTHCHECK --interval=15s --timeout=5s --start-period=120s --retries=3 \
  CMD ["python", "-c", "import sys, urllib.request; sys.exit(urllib.request.urlopen('http://127.0.0.1:8080/health', timeout=4).status != 200)"]
STOPSIGNAL SIGTERM
ENTRYPOINT ["source-backfill"]
CMD ["run", "--config", "/etc/source-backfill/config.toml"]

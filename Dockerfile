# source-backfill daemon image. Build: docker build -t source-backfill .
# Run:   docker run -p 8080:8080 -p 9108:9108 -e SOURCE_BACKFILL_API__TOKEN=... \
#          -v $PWD/deploy/config.toml:/etc/source-backfill/config.toml -v sb-state:/var/lib/source-backfill \
#          source-backfill
# The API listens on 0.0.0.0 in the image, so it refuses to start without a token (or with
# SOURCE_BACKFILL_API__ALLOW_UNAUTHENTICATED=true).
FROM python:3.11-slim

RUN apt-get update \
 && apt-get install -y --no-install-recommends openjdk-17-jre-headless procps \
 && rm -rf /var/lib/apt/lists/*
# java comes from PATH (any architecture); the JVM jars are baked in below (runtime/jvm.py finds them)
ENV PYTHONUNBUFFERED=1 \
    SOURCE_BACKFILL_JARS=/opt/source-backfill/jvm \
    SOURCE_BACKFILL_DAEMON__STATE_ROOT=/var/lib/source-backfill \
    SOURCE_BACKFILL_DAEMON__DATA_ROOT=/var/lib/source-backfill \
    SOURCE_BACKFILL_API__HOST=0.0.0.0

WORKDIR /opt/source-backfill
COPY pyproject.toml README.md ./
COPY source_backfill ./source_backfill
COPY connectors ./connectors
RUN pip install --no-cache-dir .

# The JVM parts pinned in deploy/jvm/pom.xml (Spark's Kafka connector, delta-spark, the Kafka broker),
# fetched at build time with the same command as `make jars`, so the image runs offline. (Not built here:
# the development machines have no Docker engine.)
COPY deploy/jvm/pom.xml ./deploy/jvm/pom.xml
RUN apt-get update && apt-get install -y --no-install-recommends maven \
 && SOURCE_BACKFILL_JVM_POM=/opt/source-backfill/deploy/jvm/pom.xml python -m source_backfill.runtime.jvm fetch \
 && apt-get purge -y maven && apt-get autoremove -y && rm -rf /var/lib/apt/lists/* /root/.m2

# Runs as an unprivileged user with a passwd entry (uid 10001): Hadoop's login inside Spark fails for a uid
# without a name, and Kubernetes' runAsNonRoot (deploy/k8s/deployment.yaml) needs a numeric non-root USER.
# The state folder belongs to it, so a new named volume does too (Docker copies the owner).
RUN useradd --system --uid 10001 --user-group --home-dir /var/lib/source-backfill --no-create-home source-backfill \
 && mkdir -p /var/lib/source-backfill && chown 10001:10001 /var/lib/source-backfill
USER 10001:10001

VOLUME ["/var/lib/source-backfill"]
EXPOSE 8080 9108
STOPSIGNAL SIGTERM
ENTRYPOINT ["source-backfill"]
CMD ["run", "--config", "/etc/source-backfill/config.toml"]

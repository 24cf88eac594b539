# source-backfill daemon image. Build: docker build -t source-backfill .
# Run:   docker run -p 8080:8080 -p 9108:9108 -v $PWD/deploy/config.toml:/etc/source-backfill/config.toml \
#          -v sb-state:/var/lib/source-backfill source-backfill
FROM python:3.11-slim

RUN apt-get update \
 && apt-get install -y --no-install-recommends openjdk-17-jre-headless procps \
 && rm -rf /var/lib/apt/lists/*
ENV JAVA_HOME=/usr/lib/jvm/java-17-openjdk-amd64 \
    PYTHONUNBUFFERED=1 \
    SOURCE_BACKFILL_DAEMON__STATE_ROOT=/var/lib/source-backfill \
    SOURCE_BACKFILL_API__HOST=0.0.0.0

WORKDIR /opt/source-backfill
COPY pyproject.toml README.md ./
COPY source_backfill ./source_backfill
COPY connectors ./connectors
RUN pip install --no-cache-dir .

# Where a registry with Maven access is available, bake delta-spark's and spark-sql-kafka's jars so the
# delta-spark writer (and the JVM Kafka connector) can be used:  --build-arg SPARK_PACKAGES=1
ARG SPARK_PACKAGES=0
RUN if [ "$SPARK_PACKAGES" = "1" ]; then \
      python -c "from delta import configure_spark_with_delta_pip as c; from pyspark.sql import SparkSession as S; \
c(S.builder.master('local[1]')).getOrCreate().stop()"; \
    fi

VOLUME ["/var/lib/source-backfill"]
EXPOSE 8080 9108
STOPSIGNAL SIGTERM
ENTRYPOINT ["source-backfill"]
CMD ["run", "--config", "/etc/source-backfill/config.toml"]

#!/bin/bash
# kafka-producer-perf-test.sh: as Apache Kafka's script of this name.
exec /opt/kafka/bin/kafka-run-class.sh org.apache.kafka.tools.ProducerPerformance "$@"

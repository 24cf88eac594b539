#!/bin/bash
# kafka-topics.sh: as Apache Kafka's script of this name.
exec /opt/kafka/bin/kafka-run-class.sh org.apache.kafka.tools.TopicCommand "$@"

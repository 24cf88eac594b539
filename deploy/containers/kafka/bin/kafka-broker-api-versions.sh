#!/bin/bash
# kafka-broker-api-versions.sh: as Apache Kafka's script of this name.
exec /opt/kafka/bin/kafka-run-class.sh org.apache.kafka.tools.BrokerApiVersionsCommand "$@"

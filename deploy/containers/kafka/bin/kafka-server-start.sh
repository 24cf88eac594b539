#!/bin/bash
# kafka-server-start.sh server.properties: the broker (kafka.Kafka), logging to the console.
export KAFKA_LOG4J_OPTS=${KAFKA_LOG4J_OPTS:--Dlog4j2.configurationFile=/opt/kafka/config/log4j2.yaml}
exec /opt/kafka/bin/kafka-run-class.sh kafka.Kafka "$@"

#!/bin/bash
# kafka-run-class.sh CLASS [ARGS]: the JVM with the broker's jars (as Apache Kafka's script of this name).
# KAFKA_HEAP_OPTS (default -Xmx512m -Xms128m), KAFKA_JVM_PERFORMANCE_OPTS, KAFKA_OPTS, KAFKA_LOG4J_OPTS.
class=$1; shift
heap=${KAFKA_HEAP_OPTS:--Xmx512m -Xms128m}
perf=${KAFKA_JVM_PERFORMANCE_OPTS:--XX:+UseG1GC -XX:MaxGCPauseMillis=20 -Djava.awt.headless=true}
log4j=${KAFKA_LOG4J_OPTS:--Dlog4j2.configurationFile=/opt/kafka/config/tools-log4j2.yaml}
# shellcheck disable=SC2086 # the *_OPTS are word lists
exec java $heap $perf $log4j ${KAFKA_OPTS:-} -cp '/opt/kafka/libs/*' "$class" "$@"

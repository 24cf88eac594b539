#!/bin/bash
# kafka-storage.sh: as Apache Kafka's script of this name.
exec /opt/kafka/bin/kafka-run-class.sh kafka.tools.StorageTool "$@"

#!/usr/bin/env bash
# A single-node Kafka broker (KRaft: broker and controller in one JVM) on
# 127.0.0.1, from jars Maven resolves (deploy/kafka/pom.xml): the source the
# streaming collector reads on Flink (kvldp stream --kafka-bootstrap).
#
#   kafka.sh build                           resolve the broker's classpath into the cache
#   kafka.sh start [--port 9092] [--controller-port PORT] [--partitions 2]
#                                            a broker on 127.0.0.1:PORT, detached; returns once it
#                                            serves clients (prints the bootstrap address)
#   kafka.sh stop [--port 9092]              stop it (its data is kept until the next start)
#   kafka.sh status [--port 9092]            running or not, and where its log is
#
# Brokers are told apart by their port, so several can run side by side.
# Everything lives under $KVLDP_KAFKA_CACHE (default deploy/kafka/.cache):
# the classpath, and per port the configuration, data, log and pid.
# Each start formats a fresh log directory: topics of an earlier start are gone.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CACHE=${KVLDP_KAFKA_CACHE:-$HERE/.cache}
pom_property() { sed -n "s:.*<$1>\(.*\)</$1>.*:\1:p" "$HERE/pom.xml" | head -1; }
KAFKA_VERSION=$(pom_property kafka.version)
POM_HASH=$(sha256sum "$HERE/pom.xml" | cut -c1-12)      # a changed pom.xml builds afresh
LIB=$CACHE/kafka-$KAFKA_VERSION-$POM_HASH/lib
START_TIMEOUT_S=${KVLDP_KAFKA_START_TIMEOUT:-90}

die() { echo "kafka.sh: $*" >&2; exit 2; }
# shellcheck source=../maven_classpath.sh
. "$HERE/../maven_classpath.sh"

build() { resolve_classpath "$HERE" "$CACHE" "$LIB" "the Kafka broker (kafka_2.13 $KAFKA_VERSION)"; }

run_dir() { echo "$CACHE/broker-$1"; }

pid_of() {   # the broker's pid on port $1, if it is alive
  local pidfile
  pidfile=$(run_dir "$1")/broker.pid
  [ -f "$pidfile" ] || return 1
  local pid
  pid=$(cat "$pidfile")
  kill -0 "$pid" 2>/dev/null || return 1
  echo "$pid"
}

port_free() {
  ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

start() {
  local port=9092 controller_port="" partitions=2
  while [ $# -gt 0 ]; do
    case $1 in
      --port) port=$2; shift 2 ;;
      --controller-port) controller_port=$2; shift 2 ;;
      --partitions) partitions=$2; shift 2 ;;
      *) die "start: unknown option $1" ;;
    esac
  done
  controller_port=${controller_port:-$((port + 1))}
  build
  if pid_of "$port" >/dev/null; then
    die "a broker already runs on port $port (kafka.sh stop --port $port)"
  fi
  port_free "$port" || die "port $port is taken by another process: choose --port"
  port_free "$controller_port" || die "controller port $controller_port is taken: choose --controller-port"
  local dir
  dir=$(run_dir "$port")
  rm -rf "$dir" && mkdir -p "$dir/data"
  # Loopback only: the broker takes anything written to it.
  cat > "$dir/server.properties" <<EOF
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:$controller_port
listeners=PLAINTEXT://127.0.0.1:$port,CONTROLLER://127.0.0.1:$controller_port
advertised.listeners=PLAINTEXT://127.0.0.1:$port
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
log.dirs=$dir/data
num.partitions=$partitions
offsets.topic.replication.factor=1
offsets.topic.num.partitions=4
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
EOF
  local java_opts=(-Xms256m -Xmx512m -XX:+UseG1GC -Dorg.slf4j.simpleLogger.logFile="$dir/broker.log"
                   -Dorg.slf4j.simpleLogger.defaultLogLevel=info -Dorg.slf4j.simpleLogger.showDateTime=true
                   -Dorg.slf4j.simpleLogger.log.org.apache.kafka=warn -Dorg.slf4j.simpleLogger.log.kafka=warn
                   -Dorg.slf4j.simpleLogger.log.kafka.server.KafkaRaftServer=info)
  local began=$SECONDS cluster_id
  cluster_id=$(java -cp "$LIB/*" "${java_opts[@]}" kafka.tools.StorageTool random-uuid)
  java -cp "$LIB/*" "${java_opts[@]}" kafka.tools.StorageTool format -t "$cluster_id" \
    -c "$dir/server.properties" >"$dir/format.log" 2>&1 || die "formatting the log directory failed: $dir/format.log"
  # detached from this shell: its own session, so a Ctrl-C here does not stop it
  setsid java -cp "$LIB/*" "${java_opts[@]}" kafka.Kafka "$dir/server.properties" \
    >"$dir/stdout.log" 2>&1 < /dev/null &
  echo $! > "$dir/broker.pid"
  local deadline=$((SECONDS + START_TIMEOUT_S))
  while [ $SECONDS -lt $deadline ]; do
    pid_of "$port" >/dev/null || die "the broker exited while starting; see $dir/broker.log and $dir/stdout.log"
    if grep -q "Kafka Server started" "$dir/broker.log" 2>/dev/null && ! port_free "$port"; then
      echo "kafka.sh: Kafka $KAFKA_VERSION broker on 127.0.0.1:$port (KRaft, $partitions partitions per new" \
           "topic), up in $((SECONDS - began)) s; log $dir/broker.log" >&2
      echo "127.0.0.1:$port"
      return
    fi
    sleep 0.5
  done
  stop --port "$port"
  die "the broker did not start in $START_TIMEOUT_S s; see $dir/broker.log"
}

stop() {
  local port=9092
  [ "${1:-}" = --port ] && port=$2
  local pid
  if ! pid=$(pid_of "$port"); then
    echo "kafka.sh: no broker runs on port $port" >&2
    return
  fi
  kill "$pid"
  for _ in $(seq 60); do
    kill -0 "$pid" 2>/dev/null || { rm -f "$(run_dir "$port")/broker.pid"; echo "kafka.sh: stopped the broker on port $port" >&2; return; }
    sleep 0.5
  done
  kill -9 "$pid" 2>/dev/null || true
  rm -f "$(run_dir "$port")/broker.pid"
  echo "kafka.sh: killed the broker on port $port (it did not stop in 30 s)" >&2
}

status() {
  local port=9092
  [ "${1:-}" = --port ] && port=$2
  local pid
  if pid=$(pid_of "$port"); then
    echo "running: pid $pid, 127.0.0.1:$port, log $(run_dir "$port")/broker.log"
  else
    echo "stopped: no broker on port $port"
    return 1
  fi
}

case ${1:-} in
  build) build ;;
  start) shift; start "$@" ;;
  stop) shift; stop "$@" ;;
  status) shift; status "$@" ;;
  versions) echo "kafka_2.13 $KAFKA_VERSION" ;;
  *) sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac

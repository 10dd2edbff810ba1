#!/usr/bin/env bash
# kvldp on Apache Flink: Beam's portable Flink job server, built from Maven
# Central (deploy/flink/pom.xml), and a local standalone Flink cluster.
#
#   flink.sh build                         resolve the job server's classpath (Maven) and the Flink
#                                          distribution (the apache-flink wheels) into the cache
#   flink.sh job-server [--port 8099] [--expansion-port 8097] [--flink-master '[local]' | HOST:PORT]
#                       [--parallelism N]  run the job server in the foreground (Ctrl-C stops it); its
#                                          expansion service (KafkaIO for kvldp stream on Kafka) listens on
#                                          127.0.0.1:EXPANSION-PORT
#   flink.sh cluster start [--rest-port 8081] [--rpc-port REST+1] [--slots 2]
#                                          a JobManager and a TaskManager on this machine, detached;
#                                          returns once the TaskManager has registered
#   flink.sh cluster stop [--rest-port 8081]
#   flink.sh cluster add-taskmanager [--rest-port 8081]
#                                          one more TaskManager (e.g. after one died)
#   flink.sh cluster kill-taskmanager [--rest-port 8081]
#                                          SIGKILL the cluster's TaskManagers (fault injection)
#   flink.sh versions                      the Beam runner and Flink versions this script serves
#
# Clusters are told apart by their REST port: each has its own configuration,
# logs and pids under the cache, so two run side by side.
#
# Then, with the job server on port 8099:
#   kvldp simulate ... --runner PortableRunner --job_endpoint localhost:8099 \
#       --environment_type LOOPBACK --parallelism 2
#
# Everything downloaded or built lives under $KVLDP_FLINK_CACHE (default
# deploy/flink/.cache): nothing in $HOME, so a fresh clone builds its own.
# PYTHON (default python3) must have pip: it downloads the Flink distribution.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CACHE=${KVLDP_FLINK_CACHE:-$HERE/.cache}
PYTHON=${PYTHON:-python3}
pom_property() { sed -n "s:.*<$1>\(.*\)</$1>.*:\1:p" "$HERE/pom.xml" | head -1; }
BEAM_RUNNER_VERSION=$(pom_property beam.version)
FLINK_MINOR=$(pom_property flink.minor)
POM_HASH=$(sha256sum "$HERE/pom.xml" | cut -c1-12)      # a changed pom.xml builds afresh
LIB=$CACHE/job-server-$BEAM_RUNNER_VERSION-flink-$FLINK_MINOR-$POM_HASH/lib

die() { echo "flink.sh: $*" >&2; exit 2; }
# shellcheck source=../maven_classpath.sh
. "$HERE/../maven_classpath.sh"

# What Flink's own config.yaml gives every Flink JVM on Java 17 (env.java.opts.all of the 1.19 distribution):
# without it Flink's Kryo cannot snapshot state (a streaming job's first checkpoint fails on java.util).
JAVA_MODULE_OPTS="--add-exports=java.base/sun.net.util=ALL-UNNAMED --add-exports=java.rmi/sun.rmi.registry=ALL-UNNAMED --add-exports=jdk.compiler/com.sun.tools.javac.api=ALL-UNNAMED --add-exports=jdk.compiler/com.sun.tools.javac.file=ALL-UNNAMED --add-exports=jdk.compiler/com.sun.tools.javac.parser=ALL-UNNAMED --add-exports=jdk.compiler/com.sun.tools.javac.tree=ALL-UNNAMED --add-exports=jdk.compiler/com.sun.tools.javac.util=ALL-UNNAMED --add-exports=java.security.jgss/sun.security.krb5=ALL-UNNAMED --add-opens=java.base/java.lang=ALL-UNNAMED --add-opens=java.base/java.net=ALL-UNNAMED --add-opens=java.base/java.io=ALL-UNNAMED --add-opens=java.base/java.nio=ALL-UNNAMED --add-opens=java.base/sun.nio.ch=ALL-UNNAMED --add-opens=java.base/java.lang.reflect=ALL-UNNAMED --add-opens=java.base/java.text=ALL-UNNAMED --add-opens=java.base/java.time=ALL-UNNAMED --add-opens=java.base/java.util=ALL-UNNAMED --add-opens=java.base/java.util.concurrent=ALL-UNNAMED --add-opens=java.base/java.util.concurrent.atomic=ALL-UNNAMED --add-opens=java.base/java.util.concurrent.locks=ALL-UNNAMED"

build_job_server() {
  resolve_classpath "$HERE" "$CACHE" "$LIB" "the job server (beam-runners-flink-$FLINK_MINOR $BEAM_RUNNER_VERSION)"
}

flink_version() {   # the Flink release the runner was built against = the cluster's
  build_job_server
  local jar
  jar=$(ls "$LIB"/flink-runtime-[0-9]*.jar 2>/dev/null | head -1)
  [ -n "$jar" ] || die "no flink-runtime jar in $LIB"
  basename "$jar" .jar | sed 's/^flink-runtime-//'
}

build_flink_home() {
  local version home
  version=$(flink_version)
  home=$CACHE/flink-$version
  if [ ! -f "$home/.complete" ]; then
    echo "flink.sh: assembling Flink $version in $home (apache-flink wheels from PyPI)" >&2
    local dl=$CACHE/download
    rm -rf "$home" && mkdir -p "$dl" "$home"
    "$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.11 \
      --platform manylinux1_x86_64 "apache-flink==$version" -d "$dl"
    "$PYTHON" -m pip download --quiet --no-deps "apache-flink-libraries==$version" -d "$dl"
    # bin/ and conf/ from the apache-flink wheel; lib/ and bin's jar from apache-flink-libraries
    "$PYTHON" - "$dl" "$home" "$version" <<'PY'
import pathlib, sys, tarfile, zipfile
dl, home, version = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2]), sys.argv[3]
with zipfile.ZipFile(next(dl.glob(f"apache_flink-{version}-*.whl"))) as wheel:
    for name in wheel.namelist():
        for part in ("bin", "conf"):
            if name.startswith(f"pyflink/{part}/") and not name.endswith("/"):
                target = home / part / name.split("/", 2)[2]
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(wheel.read(name))
                target.chmod(0o755 if part == "bin" else 0o644)
with tarfile.open(dl / f"apache-flink-libraries-{version}.tar.gz") as sdist:
    for member in sdist.getmembers():
        parts = member.name.split("/")
        if member.isfile() and len(parts) == 4 and parts[1] == "deps" and parts[2] in ("lib", "bin"):
            target = home / parts[2] / parts[3]
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(sdist.extractfile(member).read())
PY
    ls "$home"/lib/flink-dist-*.jar >/dev/null || die "the Flink distribution has no flink-dist jar"
    touch "$home/.complete"
  fi
  echo "$home"
}

job_server() {
  local port=8099 expansion_port=8097 master='[local]' extra=()
  while [ $# -gt 0 ]; do
    case $1 in
      --port) port=$2; shift 2 ;;
      --expansion-port) expansion_port=$2; shift 2 ;;
      --flink-master) master=$2; shift 2 ;;
      *) extra+=("$1"); shift ;;
    esac
  done
  build_job_server
  # The Job API carries no version: refuse here a runner the installed kvldp SDK was not tested with.
  if "$PYTHON" -c "import kvldp.runtime.portable" 2>/dev/null; then
    "$PYTHON" -m kvldp.runtime.portable check "beam-runners-flink-$FLINK_MINOR" "$BEAM_RUNNER_VERSION" || exit 2
  else
    echo "flink.sh: WARNING: $PYTHON cannot import kvldp (set PYTHON to the interpreter kvldp is installed in):" \
         "the SDK / job server pairing is not checked" >&2
  fi
  echo "flink.sh: job server (beam-runners-flink-$FLINK_MINOR $BEAM_RUNNER_VERSION) on localhost:$port," \
       "expansion service (Java IOs: KafkaIO) on localhost:$expansion_port, Flink master $master" >&2
  local logging=(-Dorg.slf4j.simpleLogger.defaultLogLevel=info -Dorg.slf4j.simpleLogger.log.org.apache.flink=warn
                 -Dorg.slf4j.simpleLogger.showDateTime=true)
  # The expansion service for kvldp stream's Kafka source, beside the job server and stopped with it. Not the
  # job server's own (--expansion-port): that one takes no options, and KafkaIO then expands to its
  # splittable-DoFn read, whose event-time watermark stands still while a partition is idle (a window would
  # never close). With use_deprecated_read Flink runs KafkaIO's UnboundedSource natively: its CreateTime
  # watermark follows the clock when idle, and its reader state (offsets) is part of Flink's checkpoints.
  # EMBEDDED: the Java transforms run in the job's JVM, not in a Java SDK container.
  # shellcheck disable=SC2086
  java $JAVA_MODULE_OPTS "${logging[@]}" ${JAVA_OPTS:-} -cp "$LIB/*" \
    org.apache.beam.sdk.expansion.service.ExpansionService "$expansion_port" \
    --experiments=use_deprecated_read --defaultEnvironmentType=EMBEDDED &
  local children=$!
  trap 'kill $children 2>/dev/null || true' EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
  # INFO from Beam (job submitted, state changes), WARN and up from Flink's own chatter; JAVA_OPTS may override
  # shellcheck disable=SC2086
  java $JAVA_MODULE_OPTS "${logging[@]}" ${JAVA_OPTS:-} -cp "$LIB/*" org.apache.beam.runners.flink.FlinkJobServerDriver \
    --flink-master="$master" --job-host=127.0.0.1 --job-port="$port" --artifact-port=0 \
    --expansion-port=0 "${extra[@]}" &
  children="$children $!"
  wait -n       # either one ending ends both
}

cluster() {
  local action=${1:-}; shift || true
  local rest_port=8081 rpc_port="" slots=2
  while [ $# -gt 0 ]; do
    case $1 in
      --rest-port) rest_port=$2; shift 2 ;;
      --rpc-port) rpc_port=$2; shift 2 ;;
      --slots) slots=$2; shift 2 ;;
      *) die "cluster: unknown option $1" ;;
    esac
  done
  rpc_port=${rpc_port:-$((rest_port + 1))}
  local home here
  home=$(build_flink_home)
  here=$CACHE/cluster-$rest_port          # this cluster's configuration, logs and pids
  # FLINK_IDENT_STRING names the pid files (Flink's default, $USER, is unset in some shells)
  export FLINK_HOME=$home FLINK_CONF_DIR=$here/conf FLINK_LOG_DIR=$here/log FLINK_PID_DIR=$here/pid \
    FLINK_IDENT_STRING=kvldp
  local jm_pids=$FLINK_PID_DIR/flink-kvldp-standalonesession.pid
  local tm_pids=$FLINK_PID_DIR/flink-kvldp-taskexecutor.pid
  case $action in
    start)
      if [ -s "$jm_pids" ] && kill -0 "$(head -1 "$jm_pids")" 2>/dev/null; then
        die "a cluster with REST port $rest_port is running (flink.sh cluster stop --rest-port $rest_port)"
      fi
      rm -rf "$here" && mkdir -p "$FLINK_LOG_DIR" "$FLINK_PID_DIR"
      cp -r "$home/conf" "$FLINK_CONF_DIR"
      # Loopback only: the cluster runs whatever jar is submitted to it.
      cat > "$FLINK_CONF_DIR/config.yaml" <<EOF
jobmanager.rpc.address: localhost
jobmanager.rpc.port: $rpc_port
jobmanager.bind-host: localhost
jobmanager.memory.process.size: 1024m
taskmanager.host: localhost
taskmanager.bind-host: localhost
taskmanager.memory.process.size: 2560m
# A Beam graph is many chained tasks, each with its own network channels:
# Flink's default network memory (10 % of the TaskManager) runs out of buffers.
taskmanager.memory.network.min: 512m
taskmanager.memory.network.max: 512m
taskmanager.numberOfTaskSlots: $slots
parallelism.default: 2
rest.address: localhost
rest.bind-address: localhost
rest.port: $rest_port
env.java.opts.all: $JAVA_MODULE_OPTS
# A TaskManager that dies (kill -9) is noticed when two heartbeat RPCs to it fail: every 2 s here, not
# Flink's 10 s. A hung one still has heartbeat.timeout (50 s).
heartbeat.interval: 2000
# Restarts after a failure: Flink 1.19's default with checkpoints (exponential-delay) grows 1.5x per failure
# up to 1 min and resets only after an hour without one: under repeated TaskManager kills the 10th restart
# would wait 1.5^9 = 38 s, every one from the 11th on 1 min. Capped at 5 s; reset after 5 min running.
restart-strategy.type: exponential-delay
restart-strategy.exponential-delay.initial-backoff: 1 s
restart-strategy.exponential-delay.max-backoff: 5 s
restart-strategy.exponential-delay.reset-backoff-threshold: 5 min
EOF
      "$home/bin/jobmanager.sh" start >/dev/null
      "$home/bin/taskmanager.sh" start >/dev/null
      wait_for_taskmanagers "$rest_port" 1 || die "the cluster did not come up in 120 s; see $FLINK_LOG_DIR"
      echo "flink.sh: Flink $(basename "$home" | sed 's/flink-//') cluster up: JobManager UI" \
           "http://localhost:$rest_port (RPC port $rpc_port), $slots slots, logs in $FLINK_LOG_DIR" >&2 ;;
    stop)
      [ -d "$FLINK_CONF_DIR" ] || { echo "flink.sh: no cluster with REST port $rest_port" >&2; return; }
      "$home/bin/taskmanager.sh" stop-all >/dev/null 2>&1 || true
      "$home/bin/jobmanager.sh" stop-all >/dev/null 2>&1 || true ;;
    add-taskmanager)
      [ -d "$FLINK_CONF_DIR" ] || die "no cluster with REST port $rest_port"
      # Waits for a TaskManager id it has not seen, not for a count: a killed one may deregister meanwhile
      # (its heartbeat timeout), and the count then never grows (exit 2 under load, found by issue 42's runs)
      local before
      before=$(taskmanager_ids "$rest_port")
      "$home/bin/taskmanager.sh" start >/dev/null
      wait_for_new_taskmanager "$rest_port" "$before" || die "the TaskManager did not register in 120 s"
      echo "flink.sh: a TaskManager joined the cluster on REST port $rest_port" >&2 ;;
    kill-taskmanager)
      [ -s "$tm_pids" ] || die "no TaskManager pid in $tm_pids"
      while read -r pid; do
        kill -9 "$pid" 2>/dev/null && echo "flink.sh: killed TaskManager $pid (SIGKILL)" >&2
      done < "$tm_pids"
      : > "$tm_pids" ;;
    *) die "cluster start|stop|add-taskmanager|kill-taskmanager" ;;
  esac
}

taskmanagers() {   # how many TaskManagers the cluster on REST port $1 has registered (0 if it does not answer)
  "$PYTHON" - "$1" <<'PY' 2>/dev/null || echo 0
import json, sys, urllib.request
print(json.load(urllib.request.urlopen(f"http://localhost:{sys.argv[1]}/overview", timeout=2))["taskmanagers"])
PY
}

taskmanager_ids() {   # the ids of the TaskManagers registered with the cluster on REST port $1, one a line
  "$PYTHON" - "$1" <<'PY' 2>/dev/null || true
import json, sys, urllib.request
for tm in json.load(urllib.request.urlopen(f"http://localhost:{sys.argv[1]}/taskmanagers", timeout=2))["taskmanagers"]:
    print(tm["id"])
PY
}

wait_for_new_taskmanager() {   # until the cluster on REST port $1 has a TaskManager not in $2, at most 120 s
  for _ in $(seq 120); do
    [ -n "$(comm -13 <(sort <<<"$2") <(taskmanager_ids "$1" | sort))" ] && return 0
    sleep 1
  done
  return 1
}

wait_for_taskmanagers() {   # until the cluster on REST port $1 has $2 TaskManagers, at most 120 s
  for _ in $(seq 120); do
    [ "$(taskmanagers "$1")" -ge "$2" ] && return 0
    sleep 1
  done
  return 1
}

case ${1:-} in
  build) build_job_server; build_flink_home >/dev/null ;;
  job-server) shift; job_server "$@" ;;
  cluster) shift; cluster "$@" ;;
  versions) echo "beam-runners-flink-$FLINK_MINOR $BEAM_RUNNER_VERSION, Flink $(flink_version)" ;;
  *) sed -n '2,33p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac

#!/usr/bin/env bash
# kvldp on Apache Flink: Beam's portable Flink job server, built from Maven
# Central (deploy/flink/pom.xml), and a local standalone Flink cluster.
#
#   flink.sh build                         resolve the job server's classpath (Maven) and the Flink
#                                          distribution (the apache-flink wheels) into the cache
#   flink.sh job-server [--port 8099] [--flink-master '[local]' | HOST:PORT] [--parallelism N]
#                                          run the job server in the foreground (Ctrl-C stops it)
#   flink.sh cluster start [--rest-port 8081] [--slots 2]
#                                          a JobManager and a TaskManager on this machine, detached;
#                                          returns once the TaskManager has registered
#   flink.sh cluster stop
#   flink.sh versions                      the Beam runner and Flink versions this script serves
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

build_job_server() {
  [ -f "$LIB/.complete" ] && return
  command -v mvn >/dev/null || die "Maven (mvn) is needed to resolve the job server's classpath"
  command -v java >/dev/null || die "Java (11 or 17) is needed to run the job server"
  echo "flink.sh: resolving beam-runners-flink-$FLINK_MINOR:$BEAM_RUNNER_VERSION into $LIB" >&2
  local work=$CACHE/maven
  rm -rf "$LIB" "$work" && mkdir -p "$work" "$LIB"
  cp "$HERE/pom.xml" "$work/pom.xml"          # Maven's target/ goes to the cache, not the source tree
  mvn -q -B -f "$work/pom.xml" -Dmaven.repo.local="$CACHE/m2" -Dkvldp.lib="$LIB" package
  touch "$LIB/.complete"
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
  local port=8099 master='[local]' extra=()
  while [ $# -gt 0 ]; do
    case $1 in
      --port) port=$2; shift 2 ;;
      --flink-master) master=$2; shift 2 ;;
      *) extra+=("$1"); shift ;;
    esac
  done
  build_job_server
  # The Job API carries no version: refuse here a runner the installed kvldp SDK was not tested with.
  if "$PYTHON" -c "import kvldp.pipelines.portable" 2>/dev/null; then
    "$PYTHON" -m kvldp.pipelines.portable check "beam-runners-flink-$FLINK_MINOR" "$BEAM_RUNNER_VERSION" || exit 2
  else
    echo "flink.sh: WARNING: $PYTHON cannot import kvldp (set PYTHON to the interpreter kvldp is installed in):" \
         "the SDK / job server pairing is not checked" >&2
  fi
  echo "flink.sh: job server (beam-runners-flink-$FLINK_MINOR $BEAM_RUNNER_VERSION) on localhost:$port," \
       "Flink master $master" >&2
  # INFO from Beam (job submitted, state changes), WARN and up from Flink's own chatter; JAVA_OPTS may override
  # shellcheck disable=SC2086
  exec java -Dorg.slf4j.simpleLogger.defaultLogLevel=info -Dorg.slf4j.simpleLogger.log.org.apache.flink=warn \
    -Dorg.slf4j.simpleLogger.showDateTime=true ${JAVA_OPTS:-} -cp "$LIB/*" org.apache.beam.runners.flink.FlinkJobServerDriver \
    --flink-master="$master" --job-port="$port" --artifact-port=0 --expansion-port=0 "${extra[@]}"
}

cluster() {
  local action=${1:-}; shift || true
  local rest_port=8081 slots=2
  while [ $# -gt 0 ]; do
    case $1 in
      --rest-port) rest_port=$2; shift 2 ;;
      --slots) slots=$2; shift 2 ;;
      *) die "cluster: unknown option $1" ;;
    esac
  done
  local home
  home=$(build_flink_home)
  export FLINK_HOME=$home FLINK_CONF_DIR=$home/conf FLINK_LOG_DIR=$CACHE/log FLINK_PID_DIR=$CACHE/pid
  mkdir -p "$FLINK_LOG_DIR" "$FLINK_PID_DIR"
  case $action in
    start)
      # Loopback only: the cluster runs whatever jar is submitted to it.
      cat > "$home/conf/config.yaml" <<EOF
jobmanager.rpc.address: localhost
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
EOF
      "$home/bin/jobmanager.sh" start >/dev/null
      "$home/bin/taskmanager.sh" start >/dev/null
      for _ in $(seq 120); do
        if "$PYTHON" - "$rest_port" <<'PY' 2>/dev/null; then
import json, sys, urllib.request
overview = json.load(urllib.request.urlopen(f"http://localhost:{sys.argv[1]}/overview", timeout=2))
sys.exit(0 if overview["taskmanagers"] >= 1 and overview["slots-total"] >= 1 else 1)
PY
          echo "flink.sh: Flink $(basename "$home" | sed 's/flink-//') cluster up: JobManager UI" \
               "http://localhost:$rest_port, $slots slots, logs in $FLINK_LOG_DIR" >&2
          return
        fi
        sleep 1
      done
      die "the cluster did not come up in 120 s; see $FLINK_LOG_DIR" ;;
    stop)
      "$home/bin/taskmanager.sh" stop-all >/dev/null 2>&1 || true
      "$home/bin/jobmanager.sh" stop-all >/dev/null 2>&1 || true ;;
    *) die "cluster start|stop" ;;
  esac
}

case ${1:-} in
  build) build_job_server; build_flink_home >/dev/null ;;
  job-server) shift; job_server "$@" ;;
  cluster) shift; cluster "$@" ;;
  versions) echo "beam-runners-flink-$FLINK_MINOR $BEAM_RUNNER_VERSION, Flink $(flink_version)" ;;
  *) sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac

# Sourced by deploy/flink/flink.sh and deploy/kafka/kafka.sh: resolve a
# pom.xml's runtime classpath from Maven Central into a cached folder.
#
#   resolve_classpath POM_DIR CACHE LIB WHAT
#
# copies POM_DIR/pom.xml to CACHE/maven (Maven's target/ stays out of the
# source tree), runs its copy-dependencies into LIB with the Maven repository
# CACHE/m2 (nothing in $HOME), and marks LIB complete; a complete LIB is kept.
resolve_classpath() {
  local pom_dir=$1 cache=$2 lib=$3 what=$4
  [ -f "$lib/.complete" ] && return
  command -v mvn >/dev/null || die "Maven (mvn) is needed to resolve the classpath of $what"
  command -v java >/dev/null || die "Java (11 or 17) is needed to run $what"
  echo "$(basename "$0"): resolving $what into $lib" >&2
  local work=$cache/maven
  rm -rf "$lib" "$work" && mkdir -p "$work" "$lib"
  cp "$pom_dir/pom.xml" "$work/pom.xml"
  mvn -q -B -f "$work/pom.xml" -Dmaven.repo.local="$cache/m2" -Dkvldp.lib="$lib" package
  touch "$lib/.complete"
}

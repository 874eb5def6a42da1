# shellcheck shell=bash
# Helpers shared by the deploy/ scripts: progress lines, pid files and process supervision,
# waiting for readiness, locks, free ports, Java and apt-get, and what the two Pulsar scripts
# share (JVM flags, jar resolution, the admin API probe). Sourced, never run:
#
#     source "$SCRIPT_DIR/lib/common.sh"
#
# Every process a script keeps running is started by `launch` (its own session, a pid file it
# writes itself), found again by `live_pid` (the pid file plus a check of its command line) and
# stopped by `terminate` (SIGTERM, then SIGKILL of its whole process group after a timeout).
# Progress goes to stderr, prefixed with the script's name; stdout is left to what callers parse.

LOG_NAME="${LOG_NAME:-$(basename "$0")}"

log() { echo "${LOG_NAME}: $*" >&2; }
die() { log "ERROR: $*"; exit 1; }

is_uint() { [[ "$1" =~ ^[0-9]+$ ]]; }

# tail_log FILE [N]: the last N (default 40) lines of FILE, to stderr, under a header.
tail_log() {
    local file="$1" lines="${2:-40}"
    [[ -f "$file" ]] || return 0
    echo "--- $file (last $lines lines)" >&2
    tail -n "$lines" "$file" >&2 || true
}

# --- processes ---------------------------------------------------------------

# pid_alive PID: the process exists and has not exited. A zombie (exited, not yet reaped: an
# orphan under a PID 1 that does not reap) still answers `kill -0`, so its state is read instead.
pid_alive() {
    local stat state
    stat="$(cat "/proc/$1/stat" 2>/dev/null)" || return 1
    state="${stat##*) }"  # the fields after "(comm)", which may itself hold spaces
    state="${state%% *}"
    [[ -n "$state" && "$state" != Z && "$state" != X ]]
}

# live_pid PIDFILE MARK...: print the pid that PIDFILE names if that process is alive and its
# command line contains every MARK (so a recycled pid of some other program is not ours).
live_pid() {
    local file="$1" pid cmdline mark
    shift
    [[ -f "$file" ]] || return 1
    pid="$(cat "$file" 2>/dev/null || true)"
    is_uint "$pid" || return 1
    pid_alive "$pid" || return 1
    cmdline="$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null || true)"
    # A process in the middle of an exec (a server becoming Envoy) shows an empty command line
    # for a moment: read it again until it has one (or has gone), up to a second.
    local tries=0
    while [[ -z "$cmdline" ]] && ((tries < 50)) && pid_alive "$pid"; do
        sleep 0.02
        tries=$((tries + 1))
        cmdline="$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null || true)"
    done
    for mark in "$@"; do
        [[ "$cmdline" == *"$mark"* ]] || return 1
    done
    echo "$pid"
}

# launch PIDFILE LOGFILE CWD [NAME=VALUE...] -- COMMAND...: start COMMAND in the background, in
# directory CWD with the extra environment variables given, stdin from /dev/null, stdout and
# stderr appended to LOGFILE. It runs under setsid, in a session and process group of its own:
# Ctrl-C in the calling shell or a signal to the caller's group does not reach it, and
# `terminate` can kill its children with it. The child writes its own pid to PIDFILE before it
# execs COMMAND, so the pid is COMMAND's; returns 1 if PIDFILE is not written within 5 s.
# The caller's lock descriptors (7-9) are closed in the child: a long-lived process holding them
# would block the next start or stop.
launch() {
    local pidfile="$1" logfile="$2" cwd="$3"
    shift 3
    local -a envs=()
    while [[ $# -gt 0 && "$1" != "--" ]]; do
        envs+=("$1")
        shift
    done
    [[ $# -ge 2 ]] || die "launch: no command after --"
    shift
    rm -f "$pidfile"
    # shellcheck disable=SC2016
    setsid env "${envs[@]}" bash -c 'echo $$ >"$0"; cd "$1" || exit 1; shift; exec "$@"' \
        "$pidfile" "$cwd" "$@" </dev/null >>"$logfile" 2>&1 7>&- 8>&- 9>&- &
    local _
    for _ in $(seq 1 50); do
        [[ -s "$pidfile" ]] && return 0
        sleep 0.1
    done
    return 1
}

# terminate TIMEOUT_S NAME PID...: SIGTERM every PID and wait until all have exited. Whatever is
# still alive after TIMEOUT_S seconds gets SIGKILL, sent to its process group (a process started
# by `launch` leads its group, so the children it may have left go with it), and is waited for.
# NAME (may be empty) names them in the progress line.
terminate() {
    local timeout_s="$1" name="$2" pid
    shift 2
    for pid in "$@"; do
        kill -TERM "$pid" 2>/dev/null || true
    done
    local deadline=$((SECONDS + timeout_s)) killed=0
    local -a alive
    while true; do
        alive=()
        for pid in "$@"; do
            if pid_alive "$pid"; then alive+=("$pid"); fi
        done
        ((${#alive[@]} > 0)) || return 0
        if ((killed == 0 && SECONDS >= deadline)); then
            log "${name:+$name }still alive after ${timeout_s}s, sending SIGKILL (pid ${alive[*]})"
            for pid in "${alive[@]}"; do
                kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null || true
            done
            killed=1
            deadline=$((SECONDS + 10))  # SIGKILL cannot be ignored: only the kernel's cleanup
        elif ((killed == 1 && SECONDS >= deadline)); then
            log "${name:+$name }pid ${alive[*]} survived SIGKILL for 10s"
            return 1
        fi
        sleep 0.2
    done
}

# wait_probe WHAT PID DEADLINE INTERVAL_S LOGFILE PROBE...: run PROBE every INTERVAL_S seconds
# until it succeeds. Dies, after the end of LOGFILE, if process PID exits first or if $SECONDS
# reaches DEADLINE (what started keeps running then: the caller's `stop` ends it).
wait_probe() {
    local what="$1" pid="$2" deadline="$3" interval_s="$4" logfile="$5" t0=$SECONDS
    shift 5
    until "$@"; do
        if ! pid_alive "$pid"; then
            tail_log "$logfile"
            die "$what: the process (pid $pid) exited during start-up (log: $logfile)"
        fi
        if ((SECONDS >= deadline)); then
            tail_log "$logfile"
            die "$what not ready after $((SECONDS - t0))s (pid $pid still running; log: $logfile)"
        fi
        sleep "$interval_s"
    done
}

# --- locks and ports ---------------------------------------------------------

# take_lock FILE WAIT_S: hold an exclusive lock on FILE on descriptor 9 (until `release_lock` or
# the script's exit), so two starts or stops of one instance never interleave. Dies if another
# holder keeps it for WAIT_S seconds.
take_lock() {
    exec 9>"$1"
    flock -w "$2" 9 || die "another start/stop holds $1"
}
release_lock() { exec 9>&-; }

# port_in_use PORT: true if 127.0.0.1:PORT cannot be bound the way a server binds it
# (SO_REUSEADDR): something listens there, or a connection uses it as its local port (which a
# connect probe would miss). Without an executable $PYTHON, only a listener is detected.
port_in_use() {
    if [[ -x "${PYTHON:-}" ]]; then
        "$PYTHON" - "$1" <<'PY' 2>/dev/null
import socket, sys
with socket.socket() as s:
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        s.bind(("127.0.0.1", int(sys.argv[1])))
    except OSError:
        sys.exit(0)  # in use
sys.exit(1)
PY
    else
        (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
    fi
}

# free_port: a port of 127.0.0.1 free right now (the kernel's choice), printed. Needs $PYTHON.
free_port() {
    "$PYTHON" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# --- packages: apt-get and Java ----------------------------------------------

as_root() {
    if [[ "$(id -u)" == 0 ]]; then
        "$@"
    else
        command -v sudo >/dev/null || die "not root and no sudo; cannot run: $*"
        sudo "$@"
    fi
}

# apt_install PACKAGE...: install Debian packages (waiting for a concurrent apt/dpkg run's lock
# instead of failing on it).
apt_install() {
    log "installing $* with apt-get"
    as_root apt-get -o DPkg::Lock::Timeout=600 update -qq >/dev/null
    as_root env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 \
        install -y -qq "$@" >/dev/null
}

java_major() {
    java -version 2>&1 | awk -F'"' '/version/ {split($2, v, "."); print (v[1] == "1" ? v[2] : v[1]); exit}'
}

# ensure_java MIN: a `java` of version MIN or later on PATH; installs openjdk-17-jre-headless if
# there is none or it is older.
ensure_java() {
    local min="$1"
    if ! command -v java >/dev/null || (($(java_major) < min)); then
        apt_install openjdk-17-jre-headless
    fi
    (($(java_major) >= min)) || die "needs Java ${min}+, found $(java -version 2>&1 | head -1)"
}

# --- Pulsar (pulsar.sh, pulsar-functions.sh) ----------------------------------

# pulsar_jvm_flags TMPDIR: the JVM flags of a Pulsar JVM (broker or bookie) whose temporary
# directory is TMPDIR, one per line (the caller adds heap sizes, -Dlog4j.configurationFile and
# the classpath). As in Pulsar's bin/pulsar for Java 17: the --add-opens that BookKeeper
# (posix_fadvise, CRC32), Netty (DirectByteBuffer), the DNS resolver and the GC/cgroup metrics
# need, and the metadata drivers of the bookie and the BookKeeper client.
pulsar_jvm_flags() {
    printf '%s\n' -XX:+UseG1GC -XX:+ExitOnOutOfMemoryError \
        -Djava.net.preferIPv4Stack=true -Djava.io.tmpdir="$1" \
        -Djute.maxbuffer=10485760 -Dio.netty.tryReflectionSetAccessible=true \
        --add-opens java.base/java.io=ALL-UNNAMED \
        --add-opens java.base/java.util.zip=ALL-UNNAMED \
        --add-opens java.base/java.nio=ALL-UNNAMED \
        --add-opens java.base/jdk.internal.misc=ALL-UNNAMED \
        --add-opens java.base/sun.net=ALL-UNNAMED \
        --add-opens java.base/java.lang=ALL-UNNAMED \
        --add-opens java.management/sun.management=ALL-UNNAMED \
        --add-opens jdk.management/com.sun.management.internal=ALL-UNNAMED \
        --add-opens java.base/jdk.internal.platform=ALL-UNNAMED \
        -Dlog4j2.is.webapp=false -Dlog4j.shutdownHookEnabled=false \
        -Dbookkeeper.metadata.bookie.drivers=org.apache.pulsar.metadata.bookkeeper.PulsarMetadataBookieDriver \
        -Dbookkeeper.metadata.client.drivers=org.apache.pulsar.metadata.bookkeeper.PulsarMetadataClientDriver
}

# write_pulsar_log4j FILE: a log4j2 configuration that logs everything at INFO to stdout (the
# process's log file), the bookie journal at WARN.
write_pulsar_log4j() {
    cat >"$1" <<EOF
# Generated by deploy/${LOG_NAME}: everything to stdout, which goes to the process's log file
status = warn
appender.console.type = Console
appender.console.name = STDOUT
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{ISO8601} [%t] %-5level %c{1.} - %msg%n
rootLogger.level = info
rootLogger.appenderRef.stdout.ref = STDOUT
logger.bkjournal.name = org.apache.bookkeeper.bookie.Journal
logger.bkjournal.level = warn
EOF
}

# classpath_complete FILE: FILE is a non-empty classpath whose every jar exists.
classpath_complete() {
    [[ -s "$1" ]] || return 1
    local jar
    while IFS= read -r jar; do
        [[ -f "$jar" ]] || return 1
    done < <(tr ':' '\n' <"$1")
}

# pulsar_classpath WORKDIR M2 VERSION ARTIFACT OUTFILE MVNLOG: resolve org.apache.pulsar:ARTIFACT
# VERSION and its runtime dependencies, plus a log4j2 backend (Pulsar brings none), with mvn into
# the local repository M2, and write the classpath to OUTFILE. Pulsar's parent pom is imported as
# a BOM, so every transitive version is the one Pulsar was built with (without it Maven's
# nearest-wins picks e.g. log4j 2.18 next to log4j-slf4j2-impl 2.23). mvn's output is appended to
# MVNLOG. Returns mvn's failure.
pulsar_classpath() {
    local workdir="$1" m2="$2" version="$3" artifact="$4" outfile="$5" mvnlog="$6"
    mkdir -p "$workdir"
    cat >"$workdir/pom.xml" <<EOF
<?xml version="1.0" encoding="UTF-8"?>
<!-- Generated by deploy/${LOG_NAME}: only used to resolve the ${artifact} classpath. -->
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>tablekeeper.deploy</groupId>
  <artifactId>${artifact}-classpath</artifactId>
  <version>${version}</version>
  <packaging>pom</packaging>
  <dependencyManagement>
    <dependencies>
      <dependency>
        <groupId>org.apache.pulsar</groupId>
        <artifactId>pulsar</artifactId>
        <version>${version}</version>
        <type>pom</type>
        <scope>import</scope>
      </dependency>
    </dependencies>
  </dependencyManagement>
  <dependencies>
    <dependency>
      <groupId>org.apache.pulsar</groupId>
      <artifactId>${artifact}</artifactId>
      <version>${version}</version>
    </dependency>
    <dependency>
      <groupId>org.apache.logging.log4j</groupId>
      <artifactId>log4j-core</artifactId>
    </dependency>
    <dependency>
      <groupId>org.apache.logging.log4j</groupId>
      <artifactId>log4j-slf4j2-impl</artifactId>
    </dependency>
  </dependencies>
</project>
EOF
    (cd "$workdir" && mvn -B -q -Dmaven.repo.local="$m2" dependency:build-classpath \
        -Dmdep.includeScope=runtime -Dmdep.outputFile="$outfile.tmp") >>"$mvnlog" 2>&1 || return 1
    mv "$outfile.tmp" "$outfile"
}

# pulsar_admin_ready HTTP_PORT [HOST]: the admin API on HOST (default 127.0.0.1):HTTP_PORT lists
# the cluster `standalone` and the namespace `public/default` (what a broker has once it is ready).
pulsar_admin_ready() {
    local host="${2:-127.0.0.1}"
    curl -sf --max-time 5 "http://$host:$1/admin/v2/clusters" 2>/dev/null | grep -q '"standalone"' &&
        curl -sf --max-time 5 "http://$host:$1/admin/v2/namespaces/public" 2>/dev/null |
        grep -q '"public/default"'
}

# --- class-data sharing (the JVMs' start-up) ----------------------------------------------------

# A JVM spends most of its start-up loading, parsing and verifying classes: a Pulsar standalone
# ~29 CPU-seconds to its first round trip on this 2-core machine, ZooKeeper ~1.7 to serving. An
# application class-data-sharing archive (AppCDS: `java -Xshare:dump` over the classes one start
# loaded) maps them ready-made into every later start of the same classpath and Java: 15 and
# 1.2. The first start of a classpath lists its classes (cds_flags) and, once it is ready,
# makes the archive in the background (cds_make, niced; ~90 CPU-seconds for Pulsar's), kept in
# ~/.cache/tablekeeper/cds for every later start, every clone; TK_JVM_CDS=0 turns both off. A
# JVM whose archive no longer fits (a changed jar, another Java) logs a warning and starts
# without it. The classpath given must be the JVM's own -cp, or its beginning (the archive
# covers the jars; a directory may follow them).
CDS_DIR="${XDG_CACHE_HOME:-$HOME/.cache}/tablekeeper/cds"

# cds_archive NAME CLASSPATH: the archive's path for this classpath (its jars' sizes and times
# included) and this Java.
cds_archive() {
    local java key
    java="$(readlink -f "$(command -v java)")"
    # shellcheck disable=SC2046
    key="$({ printf '%s\n' "$2"; stat -c '%n %s %Y' "$java" $(tr ':' ' ' <<<"$2"); } 2>/dev/null |
        sha256sum | cut -c1-16)"
    echo "$CDS_DIR/$1-$key.jsa"
}

# cds_flags NAME CLASSPATH LIST: the JVM flags, one per line: the archive's when there is one,
# else the listing of the classes this start loads into the file LIST (for cds_make).
cds_flags() {
    [[ "${TK_JVM_CDS:-1}" == 1 ]] || return 0
    local archive
    archive="$(cds_archive "$1" "$2")"
    if [[ -f "$archive" ]]; then
        echo "-XX:SharedArchiveFile=$archive"
    else
        rm -f "$3"
        echo "-XX:DumpLoadedClassList=$3"
    fi
}

# cds_make NAME CLASSPATH LIST: make the archive from LIST (written by a start that had
# cds_flags' listing flag, now ready) in the background, detached from the caller's output and
# locks; one maker at a time, nothing if the archive exists or LIST does not.
cds_make() {
    [[ "${TK_JVM_CDS:-1}" == 1 && -s "$3" ]] || return 0
    local archive
    archive="$(cds_archive "$1" "$2")"
    [[ -f "$archive" ]] && return 0
    mkdir -p "$CDS_DIR" || return 0
    # The running JVM goes on appending to LIST: its last line may be half written.
    head -n -1 "$3" >"$archive.list.$$" 2>/dev/null || return 0
    setsid bash -c '
        archive="$1" list="$2" cp="$3"
        exec 8>"$archive.lock"
        flock -n 8 || { rm -f "$list"; exit 0; }
        if [[ ! -f "$archive" ]] && nice -n 19 java -Xshare:dump -XX:+UseG1GC \
            -XX:SharedClassListFile="$list" -XX:SharedArchiveFile="$archive.tmp" -cp "$cp" \
            >"$archive.log" 2>&1; then
            mv -f "$archive.tmp" "$archive"
        fi
        rm -f "$list" "$archive.tmp"
    ' cds-make "$archive" "$archive.list.$$" "$2" </dev/null >/dev/null 2>&1 8>&- 9>&- &
}

# cds_use NAME CLASSPATH: the archive's flag if one has been made (a start that never makes one).
cds_use() {
    [[ "${TK_JVM_CDS:-1}" == 1 ]] || return 0
    local archive
    archive="$(cds_archive "$1" "$2")"
    [[ ! -f "$archive" ]] || echo "-XX:SharedArchiveFile=$archive"
}

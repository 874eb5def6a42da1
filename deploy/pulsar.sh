#!/usr/bin/env bash
# Apache Pulsar standalone (broker + embedded BookKeeper bookie + RocksDB metadata
# store, one JVM) on 127.0.0.1 for TableKeeper development and tests.
# The jars come from Maven Central via `mvn` (first run only).  See deploy/README.md.
set -euo pipefail

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_ROOT="$(cd "${SCRIPT_DIR}/.." && pwd)"

# 4.0.7 is the newest 4.0.x/4.1.x whose full dependency tree resolves from the
# package registry reachable here (4.0.8 lacks jetcd-core-shaded and
# pulsar-opentelemetry there; no 4.1.x is published there).
PULSAR_VERSION="${PULSAR_VERSION:-4.0.7}"
CACHE_DIR="${PULSAR_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/tablekeeper/pulsar-${PULSAR_VERSION}}"
PORT="${PULSAR_PORT:-6650}"
HTTP_PORT="${PULSAR_HTTP_PORT:-8080}"
BOOKIE_PORT="${PULSAR_BOOKIE_PORT:-3181}"
DIR="${PULSAR_DIR:-${REPO_ROOT}/.deploy/pulsar}"
TIMEOUT="${PULSAR_START_TIMEOUT:-180}"
STOP_TIMEOUT="${PULSAR_STOP_TIMEOUT:-60}"
MEM="${PULSAR_MEM:--Xms256m -Xmx768m -XX:MaxDirectMemorySize=512m}"
# C1 only: halves start-up time on a busy 2-core machine (~15 s instead of ~30 s);
# peak throughput does not matter for a dev/test broker.
EXTRA_OPTS="${PULSAR_EXTRA_OPTS:--XX:TieredStopAtLevel=1}"
PYTHON="${TK_PYTHON:-${REPO_ROOT}/.venv/bin/python}"
METADATA="${PULSAR_METADATA_URL:-}"
MAIN_CLASS=org.apache.pulsar.PulsarStandaloneStarter

usage() {
    cat <<EOF
Usage: $(basename "$0") start|stop|status|restart|check|fetch [options]

Apache Pulsar ${PULSAR_VERSION} standalone (broker + one bookie + RocksDB metadata,
functions worker and stream storage disabled), every socket on 127.0.0.1.

Commands:
  start     download the jars if needed, start Pulsar in the background (no-op if
            already running), wait until the admin API answers and a
            produce/consume round trip works; prints the service URL and admin URL
  stop      stop it cleanly (SIGTERM, SIGKILL after ${STOP_TIMEOUT}s); no-op if not running
  status    exit 0 and print the URLs if running and answering, 3 if not running
  restart   stop then start
  check     run the Python round trip (ExclusiveWithFencing producer + reader)
            against the running instance
  fetch     only resolve/download the jars into the cache (first run: ~260 MB)

Options:
  --port PORT         broker (binary protocol) port (default 6650, env PULSAR_PORT)
  --http-port PORT    admin/web port (default 8080, env PULSAR_HTTP_PORT)
  --bookie-port PORT  embedded bookie port (default 3181, env PULSAR_BOOKIE_PORT);
                      fixed by the bookie's cookie once data exists in --dir
  --dir DIR           state directory: conf/, data/, tmp/, pulsar.log, pulsar.pid
                      (default <repo>/.deploy/pulsar, env PULSAR_DIR)
  --metadata URL      the broker's and bookie's metadata store, e.g. oxia://127.0.0.1:6648
                      (TableKeeper's Oxia port: \`tablekeeper server --oxia-port 6648\`);
                      default: RocksDB under --dir. Fixed at the first start of a --dir
                      (its bookie is registered there); env PULSAR_METADATA_URL
  --timeout SECS      how long 'start' waits for readiness (default 180)
                      (client-side errors of the readiness round trip: DIR/check.log)
  -h, --help          this help

Environment: PULSAR_VERSION (default ${PULSAR_VERSION}), PULSAR_CACHE_DIR (jar cache,
default ~/.cache/tablekeeper/pulsar-<version>), PULSAR_MEM (JVM memory flags,
default "${MEM}"), PULSAR_EXTRA_OPTS (more JVM flags, default "${EXTRA_OPTS}"),
PULSAR_START_TIMEOUT / PULSAR_STOP_TIMEOUT (seconds), TK_PYTHON (python used for the round trip, default
<repo>/.venv/bin/python; pulsar-client is pip-installed into it if missing).
EOF
}

log() { echo "pulsar.sh: $*" >&2; }
die() { log "ERROR: $*"; exit 1; }

CMD=""
PORT_GIVEN=0
while [[ $# -gt 0 ]]; do
    case "$1" in
        start|stop|status|restart|check|fetch) [[ -z "$CMD" ]] || die "only one command allowed"; CMD="$1"; shift ;;
        --port) [[ $# -ge 2 ]] || die "--port needs a value"; PORT="$2"; PORT_GIVEN=1; shift 2 ;;
        --port=*) PORT="${1#*=}"; PORT_GIVEN=1; shift ;;
        --http-port) [[ $# -ge 2 ]] || die "--http-port needs a value"; HTTP_PORT="$2"; PORT_GIVEN=1; shift 2 ;;
        --http-port=*) HTTP_PORT="${1#*=}"; PORT_GIVEN=1; shift ;;
        --bookie-port) [[ $# -ge 2 ]] || die "--bookie-port needs a value"; BOOKIE_PORT="$2"; shift 2 ;;
        --bookie-port=*) BOOKIE_PORT="${1#*=}"; shift ;;
        --dir) [[ $# -ge 2 ]] || die "--dir needs a value"; DIR="$2"; shift 2 ;;
        --dir=*) DIR="${1#*=}"; shift ;;
        --metadata) [[ $# -ge 2 ]] || die "--metadata needs a value"; METADATA="$2"; shift 2 ;;
        --metadata=*) METADATA="${1#*=}"; shift ;;
        --timeout) [[ $# -ge 2 ]] || die "--timeout needs a value"; TIMEOUT="$2"; shift 2 ;;
        --timeout=*) TIMEOUT="${1#*=}"; shift ;;
        -h|--help) usage; exit 0 ;;
        *) usage >&2; die "unknown argument: $1" ;;
    esac
done
[[ -n "$CMD" ]] || { usage >&2; exit 2; }
for v in PORT HTTP_PORT BOOKIE_PORT TIMEOUT; do
    [[ "${!v}" =~ ^[0-9]+$ ]] || die "bad value for $v: ${!v}"
done

mkdir -p "$DIR"
DIR="$(cd "$DIR" && pwd)"
CONF_DIR="$DIR/conf"
DATA_DIR="$DIR/data"
PID_FILE="$DIR/pulsar.pid"
PORTS_FILE="$DIR/pulsar.ports"
LOG_FILE="$DIR/pulsar.log"
CLASSPATH_FILE="$CACHE_DIR/classpath.txt"

# --- helpers -----------------------------------------------------------------

as_root() {
    if [[ "$(id -u)" == 0 ]]; then "$@"; else
        command -v sudo >/dev/null || die "not root and no sudo; cannot run: $*"
        sudo "$@"
    fi
}

apt_install() {
    log "installing $* with apt-get"
    as_root apt-get update -qq >/dev/null
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

java_major() {
    java -version 2>&1 | awk -F'"' '/version/ {split($2, v, "."); print (v[1] == "1" ? v[2] : v[1]); exit}'
}

ensure_java() {
    if ! command -v java >/dev/null || (( $(java_major) < 17 )); then
        apt_install openjdk-17-jre-headless
    fi
    (( $(java_major) >= 17 )) || die "Pulsar ${PULSAR_VERSION} needs Java 17+, found $(java -version 2>&1 | head -1)"
}

classpath_complete() {
    [[ -s "$CLASSPATH_FILE" ]] || return 1
    local jar
    while IFS= read -r jar; do
        [[ -f "$jar" ]] || return 1
    done < <(tr ':' '\n' <"$CLASSPATH_FILE")
}

# Resolve pulsar-broker and its runtime dependencies (versions aligned with the
# Pulsar build by importing its parent pom as a BOM) plus a log4j2 backend.
ensure_jars() {
    classpath_complete && return 0
    ensure_java
    command -v mvn >/dev/null || apt_install maven
    mkdir -p "$CACHE_DIR"
    exec 8>"$CACHE_DIR/.lock"
    flock -w 1800 8 || die "timed out waiting for another download into $CACHE_DIR"
    if classpath_complete; then exec 8>&-; return 0; fi
    log "resolving Apache Pulsar ${PULSAR_VERSION} jars with mvn into $CACHE_DIR (first run: ~260 MB, 1-2 min)"
    cat >"$CACHE_DIR/pom.xml" <<EOF
<?xml version="1.0" encoding="UTF-8"?>
<!-- Generated by deploy/pulsar.sh: only used to resolve the Pulsar standalone classpath. -->
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>tablekeeper.deploy</groupId>
  <artifactId>pulsar-standalone-classpath</artifactId>
  <version>${PULSAR_VERSION}</version>
  <packaging>pom</packaging>
  <dependencyManagement>
    <dependencies>
      <dependency>
        <groupId>org.apache.pulsar</groupId>
        <artifactId>pulsar</artifactId>
        <version>${PULSAR_VERSION}</version>
        <type>pom</type>
        <scope>import</scope>
      </dependency>
    </dependencies>
  </dependencyManagement>
  <dependencies>
    <dependency>
      <groupId>org.apache.pulsar</groupId>
      <artifactId>pulsar-broker</artifactId>
      <version>${PULSAR_VERSION}</version>
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
    local start=$SECONDS
    if ! (cd "$CACHE_DIR" && mvn -B -q -Dmaven.repo.local="$CACHE_DIR/m2" \
            dependency:build-classpath -Dmdep.includeScope=runtime \
            -Dmdep.outputFile="$CACHE_DIR/classpath.txt.tmp") >"$CACHE_DIR/mvn.log" 2>&1; then
        tail -n 20 "$CACHE_DIR/mvn.log" >&2
        die "mvn could not resolve Pulsar ${PULSAR_VERSION} (full output: $CACHE_DIR/mvn.log)"
    fi
    mv "$CACHE_DIR/classpath.txt.tmp" "$CLASSPATH_FILE"
    classpath_complete || die "classpath incomplete after mvn run ($CLASSPATH_FILE)"
    log "resolved $(tr ':' '\n' <"$CLASSPATH_FILE" | wc -l) jars in $((SECONDS - start))s, cache size $(du -sh "$CACHE_DIR" | cut -f1)"
    exec 8>&-
}

ensure_python_client() {
    [[ -x "$PYTHON" ]] || die "python not found at $PYTHON (set TK_PYTHON)"
    "$PYTHON" -c "import pulsar" 2>/dev/null && return 0
    log "pulsar-client not importable with $PYTHON; pip-installing it"
    "$PYTHON" -m pip install -q pulsar-client >&2 || die "pip install pulsar-client failed"
}

# Prints the pid if the pid file names a live Pulsar JVM started from this DIR.
running_pid() {
    [[ -f "$PID_FILE" ]] || return 1
    local pid cmdline
    pid="$(cat "$PID_FILE" 2>/dev/null || true)"
    [[ "$pid" =~ ^[0-9]+$ ]] || return 1
    kill -0 "$pid" 2>/dev/null || return 1
    cmdline="$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null || true)"
    [[ "$cmdline" == *"$MAIN_CLASS"* && "$cmdline" == *"$CONF_DIR/standalone.conf"* ]] || return 1
    echo "$pid"
}

load_ports() { # the ports of the running instance
    if [[ -f "$PORTS_FILE" ]]; then
        # shellcheck disable=SC1090
        source "$PORTS_FILE"
        PORT="$RUN_PORT"; HTTP_PORT="$RUN_HTTP_PORT"; BOOKIE_PORT="$RUN_BOOKIE_PORT"
    fi
}

port_in_use() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

http_get() { curl -sf --max-time 3 "http://127.0.0.1:${HTTP_PORT}$1"; }

admin_ready() {
    http_get /admin/v2/clusters 2>/dev/null | grep -q '"standalone"' &&
        http_get /admin/v2/namespaces/public 2>/dev/null | grep -q '"public/default"'
}

# Produce with an ExclusiveWithFencing producer, read back with a reader.
roundtrip() {
    "$PYTHON" - "pulsar://127.0.0.1:${PORT}" <<'PY'
import logging, sys, uuid
import pulsar

quiet = logging.getLogger("pulsar-client")
quiet.addHandler(logging.NullHandler())
quiet.setLevel(logging.ERROR)
quiet.propagate = False

url = sys.argv[1]
topic = "persistent://public/default/tk-deploy-check-" + uuid.uuid4().hex[:12]
mode = getattr(getattr(pulsar, "ProducerAccessMode", None), "ExclusiveWithFencing", None)
client = pulsar.Client(url, operation_timeout_seconds=10, connection_timeout_ms=3000, logger=quiet)
try:
    kwargs = {"access_mode": mode} if mode is not None else {}
    producer = client.create_producer(topic, **kwargs)
    payload = ("tk-deploy-check " + uuid.uuid4().hex).encode()
    msg_id = producer.send(payload)
    reader = client.create_reader(topic, pulsar.MessageId.earliest)
    msg = reader.read_next(timeout_millis=10000)
    if msg.data() != payload:
        sys.exit("round trip read %r, expected %r" % (msg.data(), payload))
    reader.close()
    producer.close()
    print("round trip ok: topic=%s msg_id=%s access_mode=%s" % (
        topic, msg_id, "ExclusiveWithFencing" if mode is not None else "Shared (ExclusiveWithFencing missing)"))
finally:
    client.close()
PY
}

write_config() {
    mkdir -p "$CONF_DIR" "$DATA_DIR/metadata" "$DATA_DIR/bookkeeper" "$DIR/tmp"
    cat >"$CONF_DIR/standalone.conf" <<EOF
# Generated by deploy/pulsar.sh -- rewritten on every start.
# Read both as the broker's ServiceConfiguration and as the embedded bookie's
# ServerConfiguration (PulsarStandalone loads the same file for both).

### broker
clusterName=standalone
brokerServicePort=${PORT}
webServicePort=${HTTP_PORT}
bindAddress=127.0.0.1
advertisedAddress=127.0.0.1
# empty: PulsarStandalone uses RocksDB under --metadata-dir (no ZooKeeper);
# else --metadata (e.g. oxia://HOST:PORT, TableKeeper's Oxia port) for broker and bookie
metadataStoreUrl=${METADATA}
configurationMetadataStoreUrl=${METADATA}
functionsWorkerEnabled=false
webSocketServiceEnabled=false
transactionCoordinatorEnabled=false
allowAutoTopicCreation=true
allowAutoTopicCreationType=non-partitioned
brokerShutdownTimeoutMs=10000
managedLedgerDefaultEnsembleSize=1
managedLedgerDefaultWriteQuorum=1
managedLedgerDefaultAckQuorum=1
managedLedgerCacheSizeMB=64
bookkeeperClientRackawarePolicyEnabled=false
narExtractionDirectory=${DIR}/tmp
offloadersDirectory=${DIR}/offloaders
protocolHandlerDirectory=${DIR}/protocols
brokerInterceptorsDirectory=${DIR}/interceptors
additionalServletDirectory=${DIR}/servlets
# the broker's internal Pulsar client: bind its DNS resolver's UDP socket to
# loopback instead of 0.0.0.0 (every address used here is an IP literal)
brokerClient_dnsLookupBindAddress=127.0.0.1

### embedded bookie (journal + ledgers go to --bookkeeper-dir)
bookiePort=${BOOKIE_PORT}
# use bookiePort instead of a random free port
allowEphemeralPorts=true
# bind the bookie to the loopback interface, not 0.0.0.0
listeningInterface=lo
allowLoopback=true
httpServerEnabled=false
# no fsync per entry: survives process crashes, not power loss (dev/test only)
journalSyncData=false
dbStorage_writeCacheMaxSizeMb=32
dbStorage_readAheadCacheMaxSizeMb=32
dbStorage_rocksDB_blockCacheSize=16777216
EOF
    cat >"$CONF_DIR/log4j2.properties" <<'EOF'
# Generated by deploy/pulsar.sh: everything to stdout, which goes to pulsar.log
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

# The metadata store of a --dir is fixed at its first start: its bookie's cookie and ledgers are
# registered there, so another store would not know them.
check_metadata() {
    local recorded="$DIR/pulsar.metadata" want="${METADATA:-rocksdb:$DATA_DIR/metadata}"
    if [[ -f "$recorded" ]]; then
        local had
        had="$(cat "$recorded")"
        [[ "$had" == "$want" ]] || die "$DIR was started with metadata store '$had', not '$want'" \
            "(its bookie is registered there): use another --dir, or the same --metadata"
    else
        echo "$want" >"$recorded"
    fi
    if [[ -n "$METADATA" ]]; then
        log "metadata store: $METADATA"
    fi
}

# --- commands ----------------------------------------------------------------

print_urls() {
    echo "pulsar://127.0.0.1:${PORT}"
    echo "http://127.0.0.1:${HTTP_PORT}"
}

do_status() {
    local pid
    if pid="$(running_pid)"; then
        load_ports
        if admin_ready; then
            log "running (pid $pid), log $LOG_FILE"
            print_urls
            return 0
        fi
        log "process $pid is running but the admin API on port $HTTP_PORT is not ready"
        return 1
    fi
    log "not running"
    return 3
}

do_start() {
    local pid
    exec 9>"$DIR/.lock"
    flock -w "$((TIMEOUT + STOP_TIMEOUT))" 9 || die "another start/stop holds $DIR/.lock"
    if pid="$(running_pid)"; then
        local want_port="$PORT" want_http="$HTTP_PORT"
        load_ports
        if [[ "$PORT_GIVEN" == 1 && ( "$want_port" != "$PORT" || "$want_http" != "$HTTP_PORT" ) ]]; then
            die "already running (pid $pid) on ports $PORT/$HTTP_PORT, not $want_port/$want_http; stop it first"
        fi
        log "already running (pid $pid)"
    else
        rm -f "$PID_FILE"
        ensure_jars
        ensure_java
        ensure_python_client
        local p
        for p in "$PORT" "$HTTP_PORT" "$BOOKIE_PORT"; do
            if port_in_use "$p"; then die "port $p is already in use by another process"; fi
        done
        check_metadata
        write_config
        printf 'RUN_PORT=%s\nRUN_HTTP_PORT=%s\nRUN_BOOKIE_PORT=%s\n' "$PORT" "$HTTP_PORT" "$BOOKIE_PORT" >"$PORTS_FILE"
        echo "=== $(date -Is) starting Pulsar ${PULSAR_VERSION} standalone: broker 127.0.0.1:$PORT, http 127.0.0.1:$HTTP_PORT, bookie 127.0.0.1:$BOOKIE_PORT" >>"$LOG_FILE"
        local -a jvm_opts
        # shellcheck disable=SC2206
        jvm_opts=($MEM $EXTRA_OPTS
            -XX:+UseG1GC -XX:+ExitOnOutOfMemoryError
            -Djava.net.preferIPv4Stack=true
            -Djava.io.tmpdir="$DIR/tmp"
            -Djute.maxbuffer=10485760
            -Dio.netty.tryReflectionSetAccessible=true
            # as in Pulsar's bin/pulsar for Java 17: BookKeeper (posix_fadvise,
            # CRC32), Netty (DirectByteBuffer), DNS resolver, GC/cgroup metrics
            --add-opens java.base/java.io=ALL-UNNAMED
            --add-opens java.base/java.util.zip=ALL-UNNAMED
            --add-opens java.base/java.nio=ALL-UNNAMED
            --add-opens java.base/jdk.internal.misc=ALL-UNNAMED
            --add-opens java.base/sun.net=ALL-UNNAMED
            --add-opens java.base/java.lang=ALL-UNNAMED
            --add-opens java.management/sun.management=ALL-UNNAMED
            --add-opens jdk.management/com.sun.management.internal=ALL-UNNAMED
            --add-opens java.base/jdk.internal.platform=ALL-UNNAMED
            -Dlog4j.configurationFile="$CONF_DIR/log4j2.properties"
            -Dlog4j2.is.webapp=false
            -Dlog4j.shutdownHookEnabled=false
            -Dbookkeeper.metadata.bookie.drivers=org.apache.pulsar.metadata.bookkeeper.PulsarMetadataBookieDriver
            -Dbookkeeper.metadata.client.drivers=org.apache.pulsar.metadata.bookkeeper.PulsarMetadataClientDriver
            -cp "$CONF_DIR:$(cat "$CLASSPATH_FILE")")
        local -a metadata_args=(--metadata-dir "$DATA_DIR/metadata")
        [[ -z "$METADATA" ]] || metadata_args=(--metadata-url "$METADATA")
        # setsid: own session, so signals to the caller's process group do not
        # reach Pulsar.  The inner shell records its pid, cds into DIR (relative
        # paths Pulsar uses land there) and execs java.
        # shellcheck disable=SC2016
        setsid bash -c 'echo $$ >"$0"; cd "$1"; shift; exec "$@"' "$PID_FILE" "$DIR" \
            java "${jvm_opts[@]}" "$MAIN_CLASS" \
            --config "$CONF_DIR/standalone.conf" \
            --no-functions-worker --no-stream-storage \
            "${metadata_args[@]}" \
            --bookkeeper-dir "$DATA_DIR/bookkeeper" \
            --bookkeeper-port "$BOOKIE_PORT" \
            </dev/null >>"$LOG_FILE" 2>&1 8>&- 9>&- &
        # wait for the pid file written by the child
        for _ in $(seq 1 50); do [[ -s "$PID_FILE" ]] && break; sleep 0.1; done
        pid="$(cat "$PID_FILE" 2>/dev/null || true)"
        [[ -n "$pid" ]] || die "failed to launch java (see $LOG_FILE)"
        log "started pid $pid, log $LOG_FILE"
    fi

    local deadline=$((SECONDS + TIMEOUT)) t0=$SECONDS
    wait_until() { # wait_until DESCRIPTION COMMAND...
        local what="$1"; shift
        until "$@"; do
            if ! running_pid >/dev/null; then
                tail -n 40 "$LOG_FILE" >&2 || true
                rm -f "$PID_FILE"
                die "Pulsar exited during start-up (log: $LOG_FILE)"
            fi
            if (( SECONDS >= deadline )); then
                tail -n 40 "$LOG_FILE" >&2 || true
                die "$what not ready after ${TIMEOUT}s (pid $pid still running; log: $LOG_FILE)"
            fi
            sleep 1
        done
    }
    wait_until "admin API (http://127.0.0.1:$HTTP_PORT/admin/v2/clusters)" admin_ready
    ensure_python_client
    local out
    # shellcheck disable=SC2016
    wait_until "produce/consume round trip" eval 'out="$(roundtrip 2>>"$DIR/check.log")"'
    log "$out"
    log "ready ($((SECONDS - t0))s after launch/attach)"
    exec 9>&-
    print_urls
}

do_stop() {
    exec 9>"$DIR/.lock"
    flock -w "$((TIMEOUT + STOP_TIMEOUT))" 9 || die "another start/stop holds $DIR/.lock"
    local pid
    if ! pid="$(running_pid)"; then
        rm -f "$PID_FILE"
        log "not running"
        return 0
    fi
    log "stopping pid $pid"
    kill -TERM "$pid" 2>/dev/null || true
    local deadline=$((SECONDS + STOP_TIMEOUT))
    while kill -0 "$pid" 2>/dev/null; do
        if (( SECONDS >= deadline )); then
            log "still alive after ${STOP_TIMEOUT}s, sending SIGKILL"
            kill -KILL "$pid" 2>/dev/null || true
            sleep 0.5
            break
        fi
        sleep 0.2
    done
    rm -f "$PID_FILE"
    echo "=== $(date -Is) stopped" >>"$LOG_FILE"
    log "stopped"
    exec 9>&-
}

do_check() {
    running_pid >/dev/null || { log "not running"; return 3; }
    load_ports
    ensure_python_client
    roundtrip
}

case "$CMD" in
    start) do_start ;;
    stop) do_stop ;;
    status) do_status ;;
    restart) do_stop; do_start ;;
    check) do_check ;;
    fetch) ensure_jars; log "classpath: $CLASSPATH_FILE" ;;
esac

#!/usr/bin/env bash
# Apache Pulsar standalone (broker + embedded BookKeeper bookie + RocksDB metadata
# store, one JVM) on 127.0.0.1 for TableKeeper development and tests.
# The jars come from Maven Central via `mvn` (first run only).  See deploy/README.md.
set -euo pipefail

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_ROOT="$(cd "${SCRIPT_DIR}/.." && pwd)"
# shellcheck source-path=SCRIPTDIR source=lib/common.sh
source "$SCRIPT_DIR/lib/common.sh"

# 4.0.7 is the newest 4.0.x/4.1.x whose full dependency tree resolves from the
# package registry reachable here (4.0.8 lacks jetcd-core-shaded and
# pulsar-opentelemetry there; no 4.1.x is published there).
PULSAR_VERSION="${PULSAR_VERSION:-4.0.7}"
CACHE_DIR="${PULSAR_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/tablekeeper/pulsar-${PULSAR_VERSION}}"
PORT="${PULSAR_PORT:-6650}"
HOST="${PULSAR_HOST:-127.0.0.1}"
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
  cds-flag  print the JVM flag of the class-data archive of Pulsar's jars, if a start has
            made one (other launchers of those jars take it; see lib/common.sh)

Options:
  --port PORT         broker (binary protocol) port (default 6650, env PULSAR_PORT)
  --host ADDR         address the broker and admin API bind and advertise (default 127.0.0.1,
                      env PULSAR_HOST); another address only inside a network namespace of
                      your own (tests/robustness does so); the bookie stays on loopback
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

CMD=""
PORT_GIVEN=0
while [[ $# -gt 0 ]]; do
    case "$1" in
        start|stop|status|restart|check|fetch|cds-flag) [[ -z "$CMD" ]] || die "only one command allowed"; CMD="$1"; shift ;;
        --port) [[ $# -ge 2 ]] || die "--port needs a value"; PORT="$2"; PORT_GIVEN=1; shift 2 ;;
        --port=*) PORT="${1#*=}"; PORT_GIVEN=1; shift ;;
        --http-port) [[ $# -ge 2 ]] || die "--http-port needs a value"; HTTP_PORT="$2"; PORT_GIVEN=1; shift 2 ;;
        --http-port=*) HTTP_PORT="${1#*=}"; PORT_GIVEN=1; shift ;;
        --bookie-port) [[ $# -ge 2 ]] || die "--bookie-port needs a value"; BOOKIE_PORT="$2"; shift 2 ;;
        --bookie-port=*) BOOKIE_PORT="${1#*=}"; shift ;;
        --host) [[ $# -ge 2 ]] || die "--host needs a value"; HOST="$2"; shift 2 ;;
        --host=*) HOST="${1#*=}"; shift ;;
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
    is_uint "${!v}" || die "bad value for $v: ${!v}"
done

mkdir -p "$DIR"
DIR="$(cd "$DIR" && pwd)"
CONF_DIR="$DIR/conf"
DATA_DIR="$DIR/data"
PID_FILE="$DIR/pulsar.pid"
PORTS_FILE="$DIR/pulsar.ports"
LOG_FILE="$DIR/pulsar.log"
CDS_LIST="$DIR/tmp/classes.list"  # the classes a first start loads (cds_flags)
CLASSPATH_FILE="$CACHE_DIR/classpath.txt"

# --- helpers -----------------------------------------------------------------

# Resolve pulsar-broker and its runtime dependencies (pulsar_classpath in lib/common.sh).
ensure_jars() {
    classpath_complete "$CLASSPATH_FILE" && return 0
    ensure_java 17
    command -v mvn >/dev/null || apt_install maven
    mkdir -p "$CACHE_DIR"
    exec 8>"$CACHE_DIR/.lock"
    flock -w 1800 8 || die "timed out waiting for another download into $CACHE_DIR"
    if classpath_complete "$CLASSPATH_FILE"; then exec 8>&-; return 0; fi
    log "resolving Apache Pulsar ${PULSAR_VERSION} jars with mvn into $CACHE_DIR (first run: ~260 MB, 1-2 min)"
    local start=$SECONDS
    : >"$CACHE_DIR/mvn.log"
    if ! pulsar_classpath "$CACHE_DIR" "$CACHE_DIR/m2" "$PULSAR_VERSION" pulsar-broker \
            "$CLASSPATH_FILE" "$CACHE_DIR/mvn.log"; then
        tail -n 20 "$CACHE_DIR/mvn.log" >&2
        die "mvn could not resolve Pulsar ${PULSAR_VERSION} (full output: $CACHE_DIR/mvn.log)"
    fi
    classpath_complete "$CLASSPATH_FILE" || die "classpath incomplete after mvn run ($CLASSPATH_FILE)"
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
running_pid() { live_pid "$PID_FILE" "$MAIN_CLASS" "$CONF_DIR/standalone.conf"; }

load_ports() { # the ports of the running instance
    if [[ -f "$PORTS_FILE" ]]; then
        # shellcheck disable=SC1090
        source "$PORTS_FILE"
        PORT="$RUN_PORT"; HTTP_PORT="$RUN_HTTP_PORT"; BOOKIE_PORT="$RUN_BOOKIE_PORT"
        HOST="${RUN_HOST:-127.0.0.1}"
    fi
}

admin_ready() { pulsar_admin_ready "$HTTP_PORT" "$HOST"; }

# Produce with an ExclusiveWithFencing producer, read back with a reader.
roundtrip() {
    "$PYTHON" - "pulsar://${HOST}:${PORT}" <<'PY'
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
bindAddress=${HOST}
advertisedAddress=${HOST}
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
brokerClient_dnsLookupBindAddress=${HOST}

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
# a disk 95 % full (the default threshold) would turn the bookie read-only and stop every write:
# a developer's machine may well be that full (1 % of this machine's disk is 2.5 GB)
diskUsageThreshold=0.99
diskUsageWarnThreshold=0.98
dbStorage_writeCacheMaxSizeMb=32
dbStorage_readAheadCacheMaxSizeMb=32
dbStorage_rocksDB_blockCacheSize=16777216
EOF
    write_pulsar_log4j "$CONF_DIR/log4j2.properties"
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
    echo "pulsar://${HOST}:${PORT}"
    echo "http://${HOST}:${HTTP_PORT}"
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
    take_lock "$DIR/.lock" "$((TIMEOUT + STOP_TIMEOUT))"
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
        ensure_java 17
        ensure_python_client
        local p
        for p in "$PORT" "$HTTP_PORT" "$BOOKIE_PORT"; do
            if port_in_use "$p"; then die "port $p is already in use by another process"; fi
        done
        check_metadata
        write_config
        printf 'RUN_PORT=%s\nRUN_HTTP_PORT=%s\nRUN_BOOKIE_PORT=%s\nRUN_HOST=%s\n' "$PORT" "$HTTP_PORT" "$BOOKIE_PORT" "$HOST" >"$PORTS_FILE"
        echo "=== $(date -Is) starting Pulsar ${PULSAR_VERSION} standalone: broker $HOST:$PORT, http $HOST:$HTTP_PORT, bookie 127.0.0.1:$BOOKIE_PORT" >>"$LOG_FILE"
        local -a jvm_opts
        # shellcheck disable=SC2206
        jvm_opts=($MEM $EXTRA_OPTS)
        mapfile -t -O "${#jvm_opts[@]}" jvm_opts < <(pulsar_jvm_flags "$DIR/tmp")
        mapfile -t -O "${#jvm_opts[@]}" jvm_opts < <(cds_flags pulsar "$(cat "$CLASSPATH_FILE")" "$CDS_LIST")
        # The jars first, as the class-data archive has them (cds_flags); then the configuration.
        jvm_opts+=(-Dlog4j.configurationFile="$CONF_DIR/log4j2.properties"
            -cp "$(cat "$CLASSPATH_FILE"):$CONF_DIR")
        local -a metadata_args=(--metadata-dir "$DATA_DIR/metadata")
        [[ -z "$METADATA" ]] || metadata_args=(--metadata-url "$METADATA")
        # In DIR: relative paths Pulsar uses land there.
        launch "$PID_FILE" "$LOG_FILE" "$DIR" -- \
            java "${jvm_opts[@]}" "$MAIN_CLASS" \
            --config "$CONF_DIR/standalone.conf" \
            --no-functions-worker --no-stream-storage \
            "${metadata_args[@]}" \
            --bookkeeper-dir "$DATA_DIR/bookkeeper" \
            --bookkeeper-port "$BOOKIE_PORT" ||
            die "failed to launch java (see $LOG_FILE)"
        pid="$(cat "$PID_FILE")"
        log "started pid $pid, log $LOG_FILE"
    fi

    local deadline=$((SECONDS + TIMEOUT)) t0=$SECONDS
    wait_probe "Pulsar admin API (http://$HOST:$HTTP_PORT/admin/v2/clusters)" "$pid" \
        "$deadline" 1 "$LOG_FILE" admin_ready
    ensure_python_client
    local out
    # shellcheck disable=SC2016
    wait_probe "Pulsar produce/consume round trip" "$pid" "$deadline" 1 "$LOG_FILE" \
        eval 'out="$(roundtrip 2>>"$DIR/check.log")"'
    log "$out"
    log "ready ($((SECONDS - t0))s after launch/attach)"
    cds_make pulsar "$(cat "$CLASSPATH_FILE")" "$CDS_LIST"
    release_lock
    print_urls
}

do_stop() {
    take_lock "$DIR/.lock" "$((TIMEOUT + STOP_TIMEOUT))"
    local pid
    if ! pid="$(running_pid)"; then
        rm -f "$PID_FILE"
        log "not running"
        return 0
    fi
    log "stopping pid $pid"
    terminate "$STOP_TIMEOUT" "" "$pid"
    rm -f "$PID_FILE"
    echo "=== $(date -Is) stopped" >>"$LOG_FILE"
    log "stopped"
    release_lock
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
    cds-flag) ensure_jars; cds_use pulsar "$(cat "$CLASSPATH_FILE")" ;;
esac

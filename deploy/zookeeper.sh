#!/usr/bin/env bash
# Standalone ZooKeeper (Debian's `zookeeper` package) on 127.0.0.1 for TableKeeper
# development and tests.  See deploy/README.md.
set -euo pipefail

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_ROOT="$(cd "${SCRIPT_DIR}/.." && pwd)"
# shellcheck source-path=SCRIPTDIR source=lib/common.sh
source "$SCRIPT_DIR/lib/common.sh"

PORT="${ZK_PORT:-2181}"
HOST="${ZK_HOST:-127.0.0.1}"
DIR="${ZK_DIR:-${REPO_ROOT}/.deploy/zookeeper}"
TIMEOUT="${ZK_START_TIMEOUT:-60}"
STOP_TIMEOUT="${ZK_STOP_TIMEOUT:-30}"
HEAP="${ZK_HEAP:--Xmx256m}"
# C1 only: faster start-up on a busy machine; throughput is irrelevant here.
EXTRA_OPTS="${ZK_EXTRA_OPTS:--XX:TieredStopAtLevel=1}"
PYTHON="${TK_PYTHON:-${REPO_ROOT}/.venv/bin/python}"
ZK_JAR=/usr/share/java/zookeeper.jar
# slf4j binding so ZooKeeper's log is not silent (slf4j-simple ships with
# libslf4j-java, a dependency of the zookeeper package; it logs to stderr,
# which goes to the log file).
SLF4J_BINDING=/usr/share/java/slf4j-simple.jar
MAIN_CLASS=org.apache.zookeeper.server.quorum.QuorumPeerMain

usage() {
    cat <<EOF
Usage: $(basename "$0") start|stop|status|restart [options]

Standalone ZooKeeper bound to 127.0.0.1 (or --host) (Debian package 'zookeeper', 3.8.x).

Commands:
  start     start ZooKeeper in the background (no-op if already running) and
            wait until it accepts client sessions; prints the connect string
  stop      stop it (SIGTERM, then SIGKILL after ${STOP_TIMEOUT}s); no-op if not running
  status    exit 0 and print the connect string if running, exit 3 if not
  restart   stop then start

Options:
  --port PORT      client port (default 2181, env ZK_PORT)
  --host ADDR      address to bind (default 127.0.0.1, env ZK_HOST); another address only
                   inside a network namespace of your own (tests/robustness does so)
  --dir DIR        state directory: conf/, data/, zookeeper.log, zookeeper.pid
                   (default <repo>/.deploy/zookeeper, env ZK_DIR)
  --timeout SECS   how long 'start' waits for readiness (default 60, env ZK_START_TIMEOUT)
  --heap SIZE      the JVM's maximum heap, e.g. 2g (-Xmx2g; default 256m, env ZK_HEAP holds
                   the whole flag): what bounds the znodes it can hold
  -h, --help       this help

Environment: ZK_HEAP (default -Xmx256m), ZK_EXTRA_OPTS (more JVM flags, default
-XX:TieredStopAtLevel=1), ZK_STOP_TIMEOUT (default 30), TK_PYTHON (python with kazoo, default
<repo>/.venv/bin/python; without kazoo readiness falls back to the 'srvr' command),
ZK_CLASSPATH (another ZooKeeper's jars to run instead of Debian's, e.g. the 3.9.3 among
Pulsar's, as tests/compat/zookeeper_compat.py does).
Installs the Debian 'zookeeper' package with apt-get if it is missing (needs root).
EOF
}

CMD=""
PORT_GIVEN=0
HEAP_SIZE=""
while [[ $# -gt 0 ]]; do
    case "$1" in
        start|stop|status|restart) [[ -z "$CMD" ]] || die "only one command allowed"; CMD="$1"; shift ;;
        --port) [[ $# -ge 2 ]] || die "--port needs a value"; PORT="$2"; PORT_GIVEN=1; shift 2 ;;
        --port=*) PORT="${1#*=}"; PORT_GIVEN=1; shift ;;
        --host) [[ $# -ge 2 ]] || die "--host needs a value"; HOST="$2"; shift 2 ;;
        --host=*) HOST="${1#*=}"; shift ;;
        --dir) [[ $# -ge 2 ]] || die "--dir needs a value"; DIR="$2"; shift 2 ;;
        --dir=*) DIR="${1#*=}"; shift ;;
        --timeout) [[ $# -ge 2 ]] || die "--timeout needs a value"; TIMEOUT="$2"; shift 2 ;;
        --timeout=*) TIMEOUT="${1#*=}"; shift ;;
        --heap) [[ $# -ge 2 ]] || die "--heap needs a value"; HEAP_SIZE="$2"; shift 2 ;;
        --heap=*) HEAP_SIZE="${1#*=}"; shift ;;
        -h|--help) usage; exit 0 ;;
        *) usage >&2; die "unknown argument: $1" ;;
    esac
done
[[ -n "$CMD" ]] || { usage >&2; exit 2; }
is_uint "$PORT" || die "bad --port: $PORT"
is_uint "$TIMEOUT" || die "bad --timeout: $TIMEOUT"
if [[ -n "$HEAP_SIZE" ]]; then
    [[ "$HEAP_SIZE" =~ ^[0-9]+[kKmMgG]?$ ]] || die "bad --heap: $HEAP_SIZE (a size such as 2g or 512m)"
    HEAP="-Xmx$HEAP_SIZE"
fi

mkdir -p "$DIR"
DIR="$(cd "$DIR" && pwd)"
CONF_DIR="$DIR/conf"
DATA_DIR="$DIR/data"
PID_FILE="$DIR/zookeeper.pid"
PORT_FILE="$DIR/zookeeper.port"
HOST_FILE="$DIR/zookeeper.host"
LOG_FILE="$DIR/zookeeper.log"
CDS_LIST="$DIR/classes.list"  # the classes a first start loads (cds_flags)

# --- helpers -----------------------------------------------------------------

# Prints the pid if the pid file names a live ZooKeeper JVM started from this DIR.
running_pid() { live_pid "$PID_FILE" "$MAIN_CLASS" "$CONF_DIR/zoo.cfg"; }

current_port() {
    if [[ -f "$PORT_FILE" ]]; then cat "$PORT_FILE"; else echo "$PORT"; fi
}

# The address the running instance was started on (its --host).
load_host() {
    if [[ -f "$HOST_FILE" ]]; then HOST="$(cat "$HOST_FILE")"; fi
}

four_letter() { # four_letter PORT CMD
    # shellcheck disable=SC2016
    timeout 3 bash -c 'exec 3<>"/dev/tcp/$2/$0"; printf "%s" "$1" >&3; cat <&3' "$1" "$2" "$HOST" 2>/dev/null || true
}

# Ready: ZooKeeper answers `srvr` as a standalone server (bash alone: until its JVM listens,
# which takes a second or two, every probe costs next to nothing), then a kazoo session creates,
# reads and deletes an ephemeral znode (one Python process, ~0.2 CPU-seconds, normally once).
# Without kazoo for $PYTHON, `srvr` alone decides.
HAS_KAZOO=""
probe() {
    local port="$1" status=0
    four_letter "$port" srvr | grep -q "Mode: standalone" || return 1
    [[ "$HAS_KAZOO" != no && -x "$PYTHON" ]] || return 0
    "$PYTHON" - "$port" "$HOST" <<'PY' >/dev/null 2>&1 || status=$?
import sys, uuid
try:
    from kazoo.client import KazooClient
except ImportError:
    sys.exit(3)
zk = KazooClient(hosts="%s:%s" % (sys.argv[2], sys.argv[1]), timeout=2.0, connection_retry=None)
try:
    zk.start(timeout=3)
    path = "/tk-deploy-probe-" + uuid.uuid4().hex
    zk.create(path, b"ok", ephemeral=True)
    assert zk.get(path)[0] == b"ok"
    zk.delete(path)
finally:
    zk.stop()
    zk.close()
PY
    if ((status == 3)); then
        HAS_KAZOO=no
        log "kazoo not importable with $PYTHON; 'srvr' alone tells readiness"
        return 0
    fi
    return "$status"
}

ensure_installed() {
    [[ -f "$ZK_JAR" ]] && return 0
    log "Debian package 'zookeeper' not installed"
    apt_install zookeeper
    [[ -f "$ZK_JAR" ]] || die "apt-get install zookeeper did not provide $ZK_JAR"
}

write_config() {
    mkdir -p "$CONF_DIR" "$DATA_DIR"
    cat >"$CONF_DIR/zoo.cfg" <<EOF
# Generated by deploy/zookeeper.sh -- rewritten on every start.
# A session expires on the first tick after its timeout: a 100 ms tick keeps failure detection
# within 0.1 s of the session timeout (a 500 ms one added up to 0.5 s). Sessions of 1 to 60 s.
tickTime=100
minSessionTimeout=1000
maxSessionTimeout=60000
# (Ensembles only: 10 s to connect and sync with the leader, 5 s to stay in sync.)
initLimit=100
syncLimit=50
dataDir=$DATA_DIR
clientPort=$PORT
clientPortAddress=$HOST
maxClientCnxns=0
# No Jetty admin server (it would bind 0.0.0.0:8080).
admin.enableServer=false
4lw.commands.whitelist=ruok,srvr,stat,mntr
standaloneEnabled=true
autopurge.snapRetainCount=3
autopurge.purgeInterval=1
EOF
}

# --- commands ----------------------------------------------------------------

do_status() {
    local pid port
    if pid="$(running_pid)"; then
        port="$(current_port)"
        load_host
        if [[ "$(four_letter "$port" ruok)" == "imok" ]]; then
            log "running (pid $pid), log $LOG_FILE"
            echo "$HOST:$port"
            return 0
        fi
        log "process $pid is running but $HOST:$port does not answer 'ruok' yet"
        return 1
    fi
    log "not running"
    return 3
}

do_start() {
    local pid jars=""  # jars: set when this call starts the JVM
    take_lock "$DIR/.lock" "$((TIMEOUT + STOP_TIMEOUT))"
    if pid="$(running_pid)"; then
        local port; port="$(current_port)"
        if [[ "$PORT_GIVEN" == 1 && "$port" != "$PORT" ]]; then
            die "already running (pid $pid) on port $port, not $PORT; stop it first"
        fi
        PORT="$port"
        load_host
        log "already running (pid $pid)"
    else
        rm -f "$PID_FILE"
        ensure_installed
        ensure_java 8
        [[ -f "$SLF4J_BINDING" ]] || SLF4J_BINDING=""
        if port_in_use "$PORT"; then
            die "port $PORT is already in use by another process"
        fi
        write_config
        echo "$PORT" >"$PORT_FILE"
        echo "$HOST" >"$HOST_FILE"
        local -a cds
        jars="${ZK_CLASSPATH:-$ZK_JAR${SLF4J_BINDING:+:$SLF4J_BINDING}}"
        # The jars first, as the class-data archive has them (cds_flags); then the configuration.
        local cp="$jars:$CONF_DIR"
        mapfile -t cds < <(cds_flags zookeeper "$jars" "$CDS_LIST")
        {
            echo "=== $(date -Is) starting ZooKeeper on $HOST:$PORT"
        } >>"$LOG_FILE"
        # shellcheck disable=SC2086
        launch "$PID_FILE" "$LOG_FILE" "$PWD" -- \
            java $HEAP $EXTRA_OPTS "${cds[@]}" -Djava.net.preferIPv4Stack=true \
            -Dorg.slf4j.simpleLogger.showDateTime=true \
            -Dorg.slf4j.simpleLogger.dateTimeFormat="yyyy-MM-dd'T'HH:mm:ss.SSS" \
            -Dzookeeper.log.dir="$DIR" \
            -cp "$cp" "$MAIN_CLASS" "$CONF_DIR/zoo.cfg" ||
            die "failed to launch java (see $LOG_FILE)"
        pid="$(cat "$PID_FILE")"
        log "started pid $pid, log $LOG_FILE"
    fi

    wait_probe ZooKeeper "$pid" "$((SECONDS + TIMEOUT))" 0.3 "$LOG_FILE" probe "$PORT"
    log "ready"
    [[ -z "$jars" ]] || cds_make zookeeper "$jars" "$CDS_LIST"
    release_lock
    echo "$HOST:$PORT"
}

do_stop() {
    local pid
    take_lock "$DIR/.lock" "$((TIMEOUT + STOP_TIMEOUT))"
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

case "$CMD" in
    start) do_start ;;
    stop) do_stop ;;
    status) do_status ;;
    restart) do_stop; do_start ;;
esac

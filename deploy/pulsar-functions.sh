#!/usr/bin/env bash
# A real Pulsar Functions worker whose function state lives in TableKeeper:
# TableKeeper standalone + ZooKeeper + one BookKeeper bookie + Pulsar 4.0.7 standalone
# (broker with the functions worker, thread runtime) -- every socket on 127.0.0.1.
# See deploy/README.md ("pulsar-functions.sh") for why it is put together this way.
set -euo pipefail

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_ROOT="$(cd "${SCRIPT_DIR}/.." && pwd)"
# shellcheck source-path=SCRIPTDIR source=lib/common.sh
source "$SCRIPT_DIR/lib/common.sh"

PULSAR_VERSION="${PULSAR_VERSION:-4.0.7}"
CACHE_DIR="${PULSAR_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/tablekeeper/pulsar-${PULSAR_VERSION}}"
# Extra artifacts of this script (examples jar, pulsar-admin classpath) live next to
# deploy/pulsar.sh's classpath, in the same local Maven repository.
FN_CACHE="$CACHE_DIR/functions"
# pulsar-admin: org.apache.pulsar:pulsar-client-tools is not published for 4.0.7 in the
# registry reachable here; 4.0.6 is, and its REST calls are the same.
ADMIN_VERSION="${PULSAR_ADMIN_VERSION:-4.0.6}"
DIR="${PULSAR_FUNCTIONS_DIR:-${REPO_ROOT}/.deploy/pulsar-functions}"
TIMEOUT="${PULSAR_FUNCTIONS_START_TIMEOUT:-240}"
STOP_TIMEOUT="${PULSAR_FUNCTIONS_STOP_TIMEOUT:-30}"
BROKER_MEM="${PULSAR_MEM:--Xms256m -Xmx768m -XX:MaxDirectMemorySize=512m}"
BOOKIE_MEM="${PULSAR_BOOKIE_MEM:--Xms64m -Xmx256m -XX:MaxDirectMemorySize=256m}"
EXTRA_OPTS="${PULSAR_EXTRA_OPTS:--XX:TieredStopAtLevel=1}"
PYTHON="${TK_PYTHON:-${REPO_ROOT}/.venv/bin/python}"
TABLEKEEPER="${TK_TABLEKEEPER:-${REPO_ROOT}/.venv/bin/tablekeeper}"
MAIN_CLASS=org.apache.pulsar.PulsarStandaloneStarter
BOOKIE_CLASS=org.apache.bookkeeper.server.Main
ADMIN_CLASS=org.apache.pulsar.admin.cli.PulsarAdminTool
SHELL_CLASS=org.apache.pulsar.shell.PulsarShell

usage() {
    cat <<EOF
Usage: $(basename "$0") [options] start|stop|status|fetch
       $(basename "$0") [--dir DIR] admin PULSAR-ADMIN-ARGS...
       $(basename "$0") [--dir DIR] shell FILE

Pulsar ${PULSAR_VERSION} with its functions worker (thread runtime), function state in
TableKeeper (worker setting stateStorageServiceUrl=bk://127.0.0.1:PORT), all on 127.0.0.1:
a TableKeeper standalone server (unless --tablekeeper is given), ZooKeeper
(deploy/zookeeper.sh), one BookKeeper bookie, and PulsarStandalone in ZooKeeper mode
with --only-broker (so Pulsar's own table service is never started).

Commands:
  start   download what is missing, start what is not running, wait until the
          functions worker answers; prints the Pulsar service URL, the admin URL and
          the TableKeeper service URI, one per line
  stop    stop the broker, the bookie, ZooKeeper and (if started here) TableKeeper
  status  exit 0 and print the URLs if everything runs, 1 if something is down, 3 if nothing runs
  fetch   only download: Pulsar's jars (deploy/pulsar.sh fetch), the examples jar
          (pulsar-functions-api-examples ${PULSAR_VERSION}) and the pulsar-admin classpath
          (stdout: examples_jar=PATH and functions_api_jar=PATH, for building functions)
  admin   run one pulsar-admin command against the running instance, e.g.
          admin functions querystate --tenant public --namespace default --name F --key K
  shell   run the pulsar-admin commands of FILE (one per line, each starting with
          "admin ") in one JVM (pulsar-shell; saves the ~10 s start of a JVM per command);
          each command's output follows a line "[i/n] Executing ..."

Options (ports default to free ones, chosen on the first start and kept in DIR/ports.env):
  --dir DIR             state directory (default <repo>/.deploy/pulsar-functions)
  --tablekeeper URI     use this running TableKeeper (bk://127.0.0.1:PORT) instead of starting one
  --tk-port PORT        port of the TableKeeper server started here
  --port PORT           broker binary port       --http-port PORT  admin / functions port
  --bookie-port PORT    bookie port              --zk-port PORT    ZooKeeper port
  --timeout SECS        readiness wait of start (default ${TIMEOUT})

Environment: PULSAR_CACHE_DIR, PULSAR_MEM (broker JVM, default "${BROKER_MEM}"),
PULSAR_BOOKIE_MEM (default "${BOOKIE_MEM}"), PULSAR_EXTRA_OPTS, TK_PYTHON, TK_TABLEKEEPER.
EOF
}

CMD=""
TK_URI=""
TK_PORT=0 PORT=0 HTTP_PORT=0 BOOKIE_PORT=0 ZK_PORT=0
ADMIN_ARGS=()
while [[ $# -gt 0 ]]; do
    case "$1" in
        start|stop|status|fetch) [[ -z "$CMD" ]] || die "only one command allowed"; CMD="$1"; shift ;;
        admin) [[ -z "$CMD" ]] || die "only one command allowed"; CMD=admin; shift
            ADMIN_ARGS=("$@"); break ;;
        shell) [[ -z "$CMD" ]] || die "only one command allowed"; CMD=shell; shift
            [[ $# -eq 1 && -f "$1" ]] || die "shell needs one FILE of commands"
            ADMIN_ARGS=("$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"); break ;;
        --dir) [[ $# -ge 2 ]] || die "--dir needs a value"; DIR="$2"; shift 2 ;;
        --tablekeeper) [[ $# -ge 2 ]] || die "--tablekeeper needs a value"; TK_URI="$2"; shift 2 ;;
        --tk-port) [[ $# -ge 2 ]] || die "--tk-port needs a value"; TK_PORT="$2"; shift 2 ;;
        --port) [[ $# -ge 2 ]] || die "--port needs a value"; PORT="$2"; shift 2 ;;
        --http-port) [[ $# -ge 2 ]] || die "--http-port needs a value"; HTTP_PORT="$2"; shift 2 ;;
        --bookie-port) [[ $# -ge 2 ]] || die "--bookie-port needs a value"; BOOKIE_PORT="$2"; shift 2 ;;
        --zk-port) [[ $# -ge 2 ]] || die "--zk-port needs a value"; ZK_PORT="$2"; shift 2 ;;
        --timeout) [[ $# -ge 2 ]] || die "--timeout needs a value"; TIMEOUT="$2"; shift 2 ;;
        -h|--help) usage; exit 0 ;;
        *) usage >&2; die "unknown argument: $1" ;;
    esac
done
[[ -n "$CMD" ]] || { usage >&2; exit 2; }
for v in TK_PORT PORT HTTP_PORT BOOKIE_PORT ZK_PORT TIMEOUT; do
    is_uint "${!v}" || die "bad value for $v: ${!v}"
done
if [[ -n "$TK_URI" && ! "$TK_URI" =~ ^bk://127\.0\.0\.1:[0-9]+$ ]]; then
    die "--tablekeeper must be bk://127.0.0.1:PORT (got $TK_URI)"
fi

mkdir -p "$DIR"
DIR="$(cd "$DIR" && pwd)"
PORTS_FILE="$DIR/ports.env"
TK_DIR="$DIR/tablekeeper"
ZK_DIR="$DIR/zookeeper"
BOOKIE_DIR="$DIR/bookie"
BROKER_DIR="$DIR/broker"
CLASSPATH_FILE="$CACHE_DIR/classpath.txt"
ADMIN_CLASSPATH_FILE="$FN_CACHE/admin-classpath.txt"
EXAMPLES_JAR="$FN_CACHE/pulsar-functions-api-examples-${PULSAR_VERSION}.jar"

# --- helpers -----------------------------------------------------------------

stop_pid() { # stop_pid FILE MARK NAME
    local pid
    if ! pid="$(live_pid "$1" "$2")"; then rm -f "$1"; return 0; fi
    log "stopping $3 (pid $pid)"
    terminate "$STOP_TIMEOUT" "$3" "$pid"
    rm -f "$1"
}

java_opts() { # the flags of deploy/pulsar.sh's JVM, for a JVM whose tmp dir is $1
    # shellcheck disable=SC2086
    printf '%s\n' $EXTRA_OPTS
    pulsar_jvm_flags "$1"
    cds_use pulsar "$(cat "$CLASSPATH_FILE")"  # the archive deploy/pulsar.sh's starts make
}

mvn_q() { (cd "$FN_CACHE" && mvn -B -q -Dmaven.repo.local="$CACHE_DIR/m2" "$@") >>"$FN_CACHE/mvn.log" 2>&1; }

fetch() {
    "$SCRIPT_DIR/pulsar.sh" fetch
    mkdir -p "$FN_CACHE"
    exec 7>"$FN_CACHE/.lock"
    flock -w 1800 7 || die "timed out waiting for another download into $FN_CACHE"
    if [[ ! -s "$EXAMPLES_JAR" ]]; then
        log "downloading pulsar-functions-api-examples ${PULSAR_VERSION}"
        mvn_q dependency:copy -Dartifact="org.apache.pulsar:pulsar-functions-api-examples:${PULSAR_VERSION}" \
            -DoutputDirectory="$FN_CACHE" || die "mvn could not fetch the examples jar (see $FN_CACHE/mvn.log)"
    fi
    if ! classpath_complete "$ADMIN_CLASSPATH_FILE"; then
        log "resolving pulsar-admin (pulsar-client-tools ${ADMIN_VERSION}) with mvn"
        pulsar_classpath "$FN_CACHE/admin" "$CACHE_DIR/m2" "$ADMIN_VERSION" pulsar-client-tools \
            "$ADMIN_CLASSPATH_FILE" "$FN_CACHE/mvn.log" ||
            die "mvn could not resolve pulsar-client-tools ${ADMIN_VERSION} (see $FN_CACHE/mvn.log)"
    fi
    command -v javac >/dev/null || log "note: javac is missing (openjdk-17-jdk-headless); only needed to build your own Java functions"
    exec 7>&-
}

load_ports() {
    [[ -f "$PORTS_FILE" ]] || return 1
    # shellcheck disable=SC1090
    source "$PORTS_FILE"
}

choose_ports() { # keep recorded ports; a given port must match a recorded one
    local -A given=([TK_PORT]=$TK_PORT [PORT]=$PORT [HTTP_PORT]=$HTTP_PORT [BOOKIE_PORT]=$BOOKIE_PORT [ZK_PORT]=$ZK_PORT)
    local given_uri="$TK_URI" v
    if load_ports; then
        for v in "${!given[@]}"; do
            if [[ "${given[$v]}" != 0 && "${given[$v]}" != "${!v}" ]]; then
                die "$DIR was set up with $v=${!v}, not ${given[$v]}; stop it and use another --dir"
            fi
        done
        if [[ -n "$given_uri" && "$given_uri" != "$TK_URI" ]]; then
            die "$DIR was set up with TableKeeper ${TK_URI:-started here}, not $given_uri"
        fi
        return 0
    fi
    for v in "${!given[@]}"; do
        if [[ "${given[$v]}" == 0 ]]; then printf -v "$v" '%s' "$(free_port)"; fi
    done
    if [[ -n "$given_uri" ]]; then TK_PORT="${given_uri##*:}"; fi
    printf 'TK_URI=%q\nTK_PORT=%s\nPORT=%s\nHTTP_PORT=%s\nBOOKIE_PORT=%s\nZK_PORT=%s\n' \
        "$given_uri" "$TK_PORT" "$PORT" "$HTTP_PORT" "$BOOKIE_PORT" "$ZK_PORT" >"$PORTS_FILE"
}

tk_service() { echo "bk://127.0.0.1:${TK_PORT}"; }

tk_ready() { "$TABLEKEEPER" --service "$(tk_service)" --timeout 3 ns list >/dev/null 2>&1; }

http_get() { curl -sf --max-time 5 "http://127.0.0.1:${HTTP_PORT}$1"; }

broker_ready() { pulsar_admin_ready "$HTTP_PORT"; }

# the functions worker answers (it returns 503 until it has read its metadata topic)
worker_ready() { http_get /admin/v3/functions/public/default >/dev/null 2>&1; }

# ZooKeeper: the znodes a bookie registers under (what Pulsar's LocalBookkeeperEnsemble creates);
# and whether the bookie has registered.
zk_python() { # zk_python init|bookie-registered
    "$PYTHON" - "$1" "127.0.0.1:${ZK_PORT}" "127.0.0.1:${BOOKIE_PORT}" <<'PY'
import logging, sys
from kazoo.client import KazooClient
logging.getLogger("kazoo").setLevel(logging.CRITICAL)
what, hosts, bookie = sys.argv[1:]
zk = KazooClient(hosts=hosts, timeout=5)
zk.start(timeout=5)
try:
    if what == "init":
        for path in ("/ledgers/available/readonly", "/bookies"):
            zk.ensure_path(path)
    else:
        sys.exit(0 if zk.exists("/ledgers/available/" + bookie) else 1)
finally:
    zk.stop()
PY
}

write_bookie_conf() {
    mkdir -p "$BOOKIE_DIR/conf" "$BOOKIE_DIR/data/journal" "$BOOKIE_DIR/data/ledgers" "$BOOKIE_DIR/tmp"
    cat >"$BOOKIE_DIR/conf/bookie.conf" <<EOF
# Generated by deploy/pulsar-functions.sh -- rewritten on every start.
bookiePort=${BOOKIE_PORT}
advertisedAddress=127.0.0.1
listeningInterface=lo
allowLoopback=true
allowEphemeralPorts=true
metadataServiceUri=zk://127.0.0.1:${ZK_PORT}/ledgers
journalDirectories=${BOOKIE_DIR}/data/journal
ledgerDirectories=${BOOKIE_DIR}/data/ledgers
ledgerStorageClass=org.apache.bookkeeper.bookie.storage.ldb.DbLedgerStorage
httpServerEnabled=false
# no extra server components: this bookie does not run BookKeeper's table service
extraServerComponents=
journalSyncData=false
# a disk 95 % full (the default threshold) would turn the bookie read-only and stop every write:
# a developer's machine may well be that full (1 % of this machine's disk is 2.5 GB)
diskUsageThreshold=0.99
diskUsageWarnThreshold=0.98
dbStorage_writeCacheMaxSizeMb=32
dbStorage_readAheadCacheMaxSizeMb=32
dbStorage_rocksDB_blockCacheSize=16777216
EOF
    write_pulsar_log4j "$BOOKIE_DIR/conf/log4j2.properties"
}

write_broker_conf() {
    mkdir -p "$BROKER_DIR/conf" "$BROKER_DIR/tmp" "$BROKER_DIR/download" "$BROKER_DIR/connectors" \
        "$BROKER_DIR/functions"
    cat >"$BROKER_DIR/conf/standalone.conf" <<EOF
# Generated by deploy/pulsar-functions.sh -- rewritten on every start.
clusterName=standalone
brokerServicePort=${PORT}
webServicePort=${HTTP_PORT}
bindAddress=127.0.0.1
advertisedAddress=127.0.0.1
metadataStoreUrl=zk:127.0.0.1:${ZK_PORT}
configurationMetadataStoreUrl=zk:127.0.0.1:${ZK_PORT}
functionsWorkerEnabled=true
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
narExtractionDirectory=${BROKER_DIR}/tmp
offloadersDirectory=${BROKER_DIR}/offloaders
protocolHandlerDirectory=${BROKER_DIR}/protocols
brokerInterceptorsDirectory=${BROKER_DIR}/interceptors
additionalServletDirectory=${BROKER_DIR}/servlets
brokerClient_dnsLookupBindAddress=127.0.0.1
EOF
    # The in-broker functions worker (PulsarService.initializeWorkerConfigFromBrokerConfig
    # adds the broker's ports, address and cluster). stateStorageServiceUrl is what the
    # BookKeeper state store provider (the default stateStorageProviderImplementation)
    # connects to; in ZooKeeper mode without --no-stream-storage, PulsarStandalone keeps it.
    cat >"$BROKER_DIR/conf/functions_worker.yml" <<EOF
# Generated by deploy/pulsar-functions.sh -- rewritten on every start.
pulsarFunctionsNamespace: public/functions
functionMetadataTopicName: metadata
clusterCoordinationTopicName: coordinate
functionAssignmentTopicName: assignments
schedulerClassName: org.apache.pulsar.functions.worker.scheduler.RoundRobinScheduler
numFunctionPackageReplicas: 1
downloadDirectory: ${BROKER_DIR}/download
connectorsDirectory: ${BROKER_DIR}/connectors
functionsDirectory: ${BROKER_DIR}/functions
narExtractionDirectory: ${BROKER_DIR}/tmp
uploadBuiltinSinksSources: false
functionRuntimeFactoryClassName: org.apache.pulsar.functions.runtime.thread.ThreadRuntimeFactory
functionRuntimeFactoryConfigs:
  threadGroupName: "pulsar-functions"
stateStorageServiceUrl: bk://127.0.0.1:${TK_PORT}
stateStorageProviderImplementation: org.apache.pulsar.functions.instance.state.BKStateStoreProviderImpl
failureCheckFreqMs: 30000
rescheduleTimeoutMs: 60000
initialBrokerReconnectMaxRetries: 60
assignmentWriteMaxRetries: 60
instanceLivenessCheckFreqMs: 30000
topicCompactionFrequencySec: 1800
EOF
    write_pulsar_log4j "$BROKER_DIR/conf/log4j2.properties"
}

print_urls() {
    echo "pulsar://127.0.0.1:${PORT}"
    echo "http://127.0.0.1:${HTTP_PORT}"
    tk_service
}

wait_until() { # wait_until DEADLINE DESCRIPTION PIDFILE MARK LOG COMMAND...
    local deadline="$1" what="$2" pidfile="$3" mark="$4" logfile="$5" pid
    shift 5
    pid="$(live_pid "$pidfile" "$mark")" || {
        tail_log "$logfile"
        die "$what: the process is not running (log: $logfile)"
    }
    wait_probe "$what" "$pid" "$deadline" 1 "$logfile" "$@"
}

# --- commands ----------------------------------------------------------------

do_start() {
    take_lock "$DIR/.lock" "$((TIMEOUT + 4 * STOP_TIMEOUT))"
    fetch
    choose_ports
    local deadline=$((SECONDS + TIMEOUT)) t0=$SECONDS jvm
    local -a cp_broker

    # 1. TableKeeper
    if [[ -z "$TK_URI" ]]; then
        mkdir -p "$TK_DIR"
        if ! live_pid "$TK_DIR/server.pid" "$TK_DIR/data" >/dev/null; then
            port_in_use "$TK_PORT" && die "port $TK_PORT (TableKeeper) is in use by another process"
            launch "$TK_DIR/server.pid" "$TK_DIR/server.log" "$TK_DIR" -- \
                "$TABLEKEEPER" server --data-dir "$TK_DIR/data" --host 127.0.0.1 --port "$TK_PORT" --metrics-port 0 ||
                die "failed to launch TableKeeper (see $TK_DIR/server.log)"
            log "TableKeeper started (pid $(cat "$TK_DIR/server.pid")), log $TK_DIR/server.log"
        fi
        wait_until "$deadline" "TableKeeper $(tk_service)" "$TK_DIR/server.pid" "$TK_DIR/data" \
            "$TK_DIR/server.log" tk_ready
    else
        tk_ready || die "TableKeeper $(tk_service) does not answer"
    fi

    # 2. ZooKeeper (deploy/zookeeper.sh binds it to 127.0.0.1)
    "$SCRIPT_DIR/zookeeper.sh" start --dir "$ZK_DIR" --port "$ZK_PORT" --timeout "$TIMEOUT" >/dev/null
    zk_python init

    # 3. the bookie
    jvm="$(java_opts "$BOOKIE_DIR/tmp")"
    if ! live_pid "$BOOKIE_DIR/bookie.pid" "$BOOKIE_DIR/conf/bookie.conf" >/dev/null; then
        port_in_use "$BOOKIE_PORT" && die "port $BOOKIE_PORT (bookie) is in use by another process"
        write_bookie_conf
        local -a bookie_cmd
        # shellcheck disable=SC2206
        bookie_cmd=(java $BOOKIE_MEM $jvm -Dlog4j.configurationFile="$BOOKIE_DIR/conf/log4j2.properties"
            -cp "$(cat "$CLASSPATH_FILE"):$BOOKIE_DIR/conf" "$BOOKIE_CLASS" --conf "$BOOKIE_DIR/conf/bookie.conf")
        launch "$BOOKIE_DIR/bookie.pid" "$BOOKIE_DIR/bookie.log" "$BOOKIE_DIR" -- "${bookie_cmd[@]}" ||
            die "failed to launch the bookie (see $BOOKIE_DIR/bookie.log)"
        log "bookie started (pid $(cat "$BOOKIE_DIR/bookie.pid")), log $BOOKIE_DIR/bookie.log"
    fi
    wait_until "$deadline" "bookie 127.0.0.1:$BOOKIE_PORT" "$BOOKIE_DIR/bookie.pid" "$BOOKIE_DIR/conf/bookie.conf" \
        "$BOOKIE_DIR/bookie.log" zk_python bookie-registered

    # 4. the broker with its functions worker
    jvm="$(java_opts "$BROKER_DIR/tmp")"
    if ! live_pid "$BROKER_DIR/broker.pid" "$BROKER_DIR/conf/standalone.conf" >/dev/null; then
        local p
        for p in "$PORT" "$HTTP_PORT"; do
            port_in_use "$p" && die "port $p (broker) is in use by another process"
        done
        write_broker_conf
        # PULSAR_STANDALONE_USE_ZOOKEEPER=1: the ZooKeeper mode, where the worker keeps the
        # stateStorageServiceUrl of functions_worker.yml (the default RocksDB mode replaces the
        # state store with PulsarMetadataStateStoreProviderImpl). --only-broker: no embedded
        # ZooKeeper (it would bind 0.0.0.0), no embedded bookie, no stream storage (Pulsar's
        # own table service); they are the processes above. No --no-stream-storage: that
        # would null stateStorageServiceUrl.
        # shellcheck disable=SC2206
        cp_broker=(java $BROKER_MEM $jvm -Dlog4j.configurationFile="$BROKER_DIR/conf/log4j2.properties"
            -cp "$(cat "$CLASSPATH_FILE"):$BROKER_DIR/conf" "$MAIN_CLASS"
            --config "$BROKER_DIR/conf/standalone.conf" --only-broker
            --zookeeper-port "$ZK_PORT" --functions-worker-conf "$BROKER_DIR/conf/functions_worker.yml")
        launch "$BROKER_DIR/broker.pid" "$BROKER_DIR/broker.log" "$BROKER_DIR" PULSAR_STANDALONE_USE_ZOOKEEPER=1 -- \
            "${cp_broker[@]}" || die "failed to launch the broker (see $BROKER_DIR/broker.log)"
        log "broker started (pid $(cat "$BROKER_DIR/broker.pid")), log $BROKER_DIR/broker.log"
    fi
    wait_until "$deadline" "broker admin API" "$BROKER_DIR/broker.pid" "$BROKER_DIR/conf/standalone.conf" \
        "$BROKER_DIR/broker.log" broker_ready
    wait_until "$deadline" "functions worker" "$BROKER_DIR/broker.pid" "$BROKER_DIR/conf/standalone.conf" \
        "$BROKER_DIR/broker.log" worker_ready
    log "ready ($((SECONDS - t0))s); function state goes to $(tk_service)"
    release_lock
    print_urls
}

do_stop() {
    take_lock "$DIR/.lock" "$((TIMEOUT + 4 * STOP_TIMEOUT))"
    load_ports || { log "nothing set up in $DIR"; return 0; }
    stop_pid "$BROKER_DIR/broker.pid" "$BROKER_DIR/conf/standalone.conf" broker
    stop_pid "$BOOKIE_DIR/bookie.pid" "$BOOKIE_DIR/conf/bookie.conf" bookie
    [[ -d "$ZK_DIR" ]] && "$SCRIPT_DIR/zookeeper.sh" stop --dir "$ZK_DIR"
    if [[ -z "$TK_URI" ]]; then
        stop_pid "$TK_DIR/server.pid" "$TK_DIR/data" TableKeeper
    fi
    log "stopped"
}

do_status() {
    load_ports || { log "not set up in $DIR"; return 3; }
    local up=0 down=0
    if [[ -n "$TK_URI" ]]; then
        if tk_ready; then log "TableKeeper $(tk_service) (not started here): answering"; else log "TableKeeper $(tk_service): not answering"; down=1; fi
    elif live_pid "$TK_DIR/server.pid" "$TK_DIR/data" >/dev/null && tk_ready; then
        log "TableKeeper $(tk_service): running"; up=1
    else
        log "TableKeeper $(tk_service): down"; down=1
    fi
    if "$SCRIPT_DIR/zookeeper.sh" status --dir "$ZK_DIR" >/dev/null 2>&1; then
        log "ZooKeeper 127.0.0.1:$ZK_PORT: running"; up=1
    else
        log "ZooKeeper 127.0.0.1:$ZK_PORT: down"; down=1
    fi
    if live_pid "$BOOKIE_DIR/bookie.pid" "$BOOKIE_DIR/conf/bookie.conf" >/dev/null; then
        log "bookie 127.0.0.1:$BOOKIE_PORT: running"; up=1
    else
        log "bookie 127.0.0.1:$BOOKIE_PORT: down"; down=1
    fi
    if live_pid "$BROKER_DIR/broker.pid" "$BROKER_DIR/conf/standalone.conf" >/dev/null; then
        up=1
        if worker_ready; then log "broker + functions worker http://127.0.0.1:$HTTP_PORT: running"
        else log "broker http://127.0.0.1:$HTTP_PORT: process runs, functions worker not answering"; down=1; fi
    else
        log "broker: down"; down=1
    fi
    if (( !down )); then print_urls; return 0; fi
    (( up )) && return 1
    return 3
}

do_admin() { # do_admin MAIN-CLASS ARGS...
    load_ports || die "not set up in $DIR (start first)"
    [[ -s "$ADMIN_CLASSPATH_FILE" ]] || fetch
    mkdir -p "$DIR/admin"
    printf 'webServiceUrl=http://127.0.0.1:%s\nbrokerServiceUrl=pulsar://127.0.0.1:%s\n' "$HTTP_PORT" "$PORT" \
        >"$DIR/admin/client.conf"
    [[ -f "$DIR/admin/log4j2.properties" ]] || cat >"$DIR/admin/log4j2.properties" <<'EOF'
status = warn
appender.console.type = Console
appender.console.name = STDERR
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{ISO8601} %-5level %c{1.} - %msg%n
rootLogger.level = warn
rootLogger.appenderRef.stderr.ref = STDERR
EOF
    # shellcheck disable=SC2086
    exec java -Xmx128m $EXTRA_OPTS -Djava.net.preferIPv4Stack=true -Duser.home="$DIR/admin" \
        -Dlog4j.configurationFile="$DIR/admin/log4j2.properties" \
        -cp "$(cat "$ADMIN_CLASSPATH_FILE")" "$@"
}

case "$CMD" in
    start) do_start ;;
    stop) do_stop ;;
    status) do_status ;;
    fetch)
        fetch
        echo "examples_jar=$EXAMPLES_JAR"
        echo "functions_api_jar=$(tr ':' '\n' <"$CLASSPATH_FILE" | grep "/pulsar-functions-api-${PULSAR_VERSION}.jar$")"
        ;;
    admin) do_admin "$ADMIN_CLASS" "$DIR/admin/client.conf" "${ADMIN_ARGS[@]}" ;;
    # -np: plain output; without --fail-on-error, since pulsar-shell counts a successful
    # putstate (which prints nothing) as a failure and would stop there.
    shell) do_admin "$SHELL_CLASS" -c "$DIR/admin/client.conf" -np -f "${ADMIN_ARGS[0]}" ;;
esac

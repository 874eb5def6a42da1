#!/usr/bin/env bash
# A local TableKeeper cluster on 127.0.0.1: ZooKeeper, Pulsar and N `tablekeeper server`
# processes sharing one cluster name and one Pulsar namespace.  See deploy/README.md.
set -euo pipefail

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_ROOT="$(cd "${SCRIPT_DIR}/.." && pwd)"
# shellcheck source-path=SCRIPTDIR source=lib/common.sh
source "$SCRIPT_DIR/lib/common.sh"

DEFAULT_DIR="${TK_CLUSTER_DIR:-${REPO_ROOT}/.deploy/cluster}"
TABLEKEEPER="${TK_TABLEKEEPER:-${REPO_ROOT}/.venv/bin/tablekeeper}"
PYTHON="${TK_PYTHON:-${REPO_ROOT}/.venv/bin/python}"
TIMEOUT="${TK_CLUSTER_START_TIMEOUT:-120}"
STOP_TIMEOUT="${TK_CLUSTER_STOP_TIMEOUT:-30}"
D_CLUSTER=tablekeeper
D_CONTAINERS=8
D_ZK_SESSION_TIMEOUT=2
D_BASE_PORT=4181
D_ZK_PORT=2181
D_PULSAR_PORT=6650
D_PULSAR_HTTP_PORT=8080
D_PULSAR_BOOKIE_PORT=3181

usage() {
    cat <<EOF
Usage: $(basename "$0") start N [options] [-- SERVER_ARGS...]
       $(basename "$0") stop|status [--dir DIR]

A TableKeeper cluster on 127.0.0.1: a ZooKeeper (deploy/zookeeper.sh), a Pulsar standalone
(deploy/pulsar.sh) and N 'tablekeeper server' processes of one cluster. All servers keep their
range logs and checkpoints in the same Pulsar namespace, so containers can move between them.

Commands:
  start N   start ZooKeeper and Pulsar (unless running), run 'tablekeeper cluster init', make
            sure servers 1..N run (starting missing or dead ones: re-running with a larger N adds
            servers), wait until every container is served by its assigned server, then print
            the service URIs, one per server (bk://127.0.0.1:PORT)
  stop      SIGTERM every server (SIGKILL after ${STOP_TIMEOUT}s), then stop Pulsar and ZooKeeper
            (only those this script started); state stays in DIR
  status    ZooKeeper and Pulsar state, 'tablekeeper cluster status', and per server its pid,
            whether it is alive, its ports and log; exit 0 if everything runs, 1 if something
            is down, 3 if nothing runs

Options of start (recorded in DIR/cluster.env; later commands reuse them):
  --dir DIR                 state directory (default <repo>/.deploy/cluster, env TK_CLUSTER_DIR):
                            zookeeper/, pulsar/, servers/<i>/{data/,server.log,server.pid,ports}
  --containers C            storage containers, fixed at the first start (default ${D_CONTAINERS})
  --cluster NAME            cluster name in ZooKeeper (default ${D_CLUSTER})
  --zk-session-timeout S    the servers' ZooKeeper session timeout (default ${D_ZK_SESSION_TIMEOUT})
  --base-port P             first port for servers (default ${D_BASE_PORT}): each new server takes
                            the next two free ports from P on, gRPC then metrics
  --checkpoint-interval S   passed to the servers (default: the server's)
  --pulsar-namespace T/N    Pulsar namespace of all servers (default public/<cluster>)
  --zk-port PORT            port of the ZooKeeper this script starts (default ${D_ZK_PORT})
  --zk HOST:PORT            use this running ZooKeeper instead of starting one
  --pulsar-port PORT, --pulsar-http-port PORT, --pulsar-bookie-port PORT
                            ports of the Pulsar this script starts (default ${D_PULSAR_PORT}, ${D_PULSAR_HTTP_PORT}, ${D_PULSAR_BOOKIE_PORT})
  --pulsar-url URL --pulsar-admin-url URL
                            use this running Pulsar instead of starting one (both needed)
  --timeout SECS            how long start waits for the cluster to be ready (default ${TIMEOUT},
                            env TK_CLUSTER_START_TIMEOUT)
  --tls                     serve TLS, fixed at the first start: a throw-away CA (DIR/tls/ca.pem,
                            made with python -m tablekeeper_server.security.certs, valid 30 days),
                            a server certificate for 127.0.0.1 and localhost, a client certificate
                            'admin' and an HMAC secret (DIR/tls/secret.key); the servers call each
                            other over TLS. Clients: --tls-ca DIR/tls/ca.pem (or
                            TABLEKEEPER_TLS_CA). Tokens too: add
                            -- --auth-secret-key DIR/tls/secret.key --superuser-roles admin
                            and export TABLEKEEPER_TOKEN=\$(tablekeeper token create
                            --secret-key DIR/tls/secret.key --subject admin) before 'start'.
  -- SERVER_ARGS...         extra arguments for the servers started by this command
  -h, --help                this help

Environment: TK_TABLEKEEPER (the tablekeeper command, default <repo>/.venv/bin/tablekeeper),
TK_CLUSTER_STOP_TIMEOUT (default 30), TK_PYTHON (python for the port checks here and in
zookeeper.sh / pulsar.sh, default <repo>/.venv/bin/python).
Only the service URIs go to stdout; progress goes to stderr, so
'mapfile -t URIS < <(deploy/cluster.sh start 3)' works.
EOF
}

is_number() { [[ "$1" =~ ^[0-9]+([.][0-9]+)?$ ]]; }

CMD=""
COUNT=""
DIR="$DEFAULT_DIR"
SERVER_ARGS=()
# O_*: options given on this command line (empty = not given).
O_CLUSTER="" O_CONTAINERS="" O_ZK_SESSION_TIMEOUT="" O_BASE_PORT="" O_CHECKPOINT_INTERVAL=""
O_PULSAR_NAMESPACE="" O_ZK_PORT="" O_ZK="" O_PULSAR_PORT="" O_PULSAR_HTTP_PORT=""
O_PULSAR_BOOKIE_PORT="" O_PULSAR_URL="" O_PULSAR_ADMIN_URL="" O_TLS=""

need() { [[ $2 -ge 2 ]] || die "$1 needs a value"; }
while [[ $# -gt 0 ]]; do
    case "$1" in
        start|stop|status) [[ -z "$CMD" ]] || die "only one command allowed"; CMD="$1"; shift
            if [[ "$CMD" == start && $# -gt 0 && "$1" =~ ^[0-9]+$ ]]; then COUNT="$1"; shift; fi ;;
        --dir) need "$1" $#; DIR="$2"; shift 2 ;;
        --dir=*) DIR="${1#*=}"; shift ;;
        --containers) need "$1" $#; O_CONTAINERS="$2"; shift 2 ;;
        --containers=*) O_CONTAINERS="${1#*=}"; shift ;;
        --cluster) need "$1" $#; O_CLUSTER="$2"; shift 2 ;;
        --cluster=*) O_CLUSTER="${1#*=}"; shift ;;
        --zk-session-timeout) need "$1" $#; O_ZK_SESSION_TIMEOUT="$2"; shift 2 ;;
        --zk-session-timeout=*) O_ZK_SESSION_TIMEOUT="${1#*=}"; shift ;;
        --base-port) need "$1" $#; O_BASE_PORT="$2"; shift 2 ;;
        --base-port=*) O_BASE_PORT="${1#*=}"; shift ;;
        --checkpoint-interval) need "$1" $#; O_CHECKPOINT_INTERVAL="$2"; shift 2 ;;
        --checkpoint-interval=*) O_CHECKPOINT_INTERVAL="${1#*=}"; shift ;;
        --pulsar-namespace) need "$1" $#; O_PULSAR_NAMESPACE="$2"; shift 2 ;;
        --pulsar-namespace=*) O_PULSAR_NAMESPACE="${1#*=}"; shift ;;
        --zk-port) need "$1" $#; O_ZK_PORT="$2"; shift 2 ;;
        --zk-port=*) O_ZK_PORT="${1#*=}"; shift ;;
        --zk) need "$1" $#; O_ZK="$2"; shift 2 ;;
        --zk=*) O_ZK="${1#*=}"; shift ;;
        --pulsar-port) need "$1" $#; O_PULSAR_PORT="$2"; shift 2 ;;
        --pulsar-port=*) O_PULSAR_PORT="${1#*=}"; shift ;;
        --pulsar-http-port) need "$1" $#; O_PULSAR_HTTP_PORT="$2"; shift 2 ;;
        --pulsar-http-port=*) O_PULSAR_HTTP_PORT="${1#*=}"; shift ;;
        --pulsar-bookie-port) need "$1" $#; O_PULSAR_BOOKIE_PORT="$2"; shift 2 ;;
        --pulsar-bookie-port=*) O_PULSAR_BOOKIE_PORT="${1#*=}"; shift ;;
        --pulsar-url) need "$1" $#; O_PULSAR_URL="$2"; shift 2 ;;
        --pulsar-url=*) O_PULSAR_URL="${1#*=}"; shift ;;
        --pulsar-admin-url) need "$1" $#; O_PULSAR_ADMIN_URL="$2"; shift 2 ;;
        --pulsar-admin-url=*) O_PULSAR_ADMIN_URL="${1#*=}"; shift ;;
        --tls) O_TLS=1; shift ;;
        --timeout) need "$1" $#; TIMEOUT="$2"; shift 2 ;;
        --timeout=*) TIMEOUT="${1#*=}"; shift ;;
        --) shift; SERVER_ARGS=("$@"); break ;;
        -h|--help) usage; exit 0 ;;
        *) usage >&2; die "unknown argument: $1" ;;
    esac
done
[[ -n "$CMD" ]] || { usage >&2; exit 2; }
if [[ "$CMD" == start ]]; then
    [[ -n "$COUNT" ]] || { usage >&2; die "start needs the number of servers: start N"; }
    (( COUNT >= 1 )) || die "start N needs N >= 1"
elif [[ -n "$O_CLUSTER$O_CONTAINERS$O_ZK_SESSION_TIMEOUT$O_BASE_PORT$O_CHECKPOINT_INTERVAL$O_PULSAR_NAMESPACE$O_ZK_PORT$O_ZK$O_PULSAR_PORT$O_PULSAR_HTTP_PORT$O_PULSAR_BOOKIE_PORT$O_PULSAR_URL$O_PULSAR_ADMIN_URL$O_TLS" || ${#SERVER_ARGS[@]} -gt 0 ]]; then
    die "$CMD takes only --dir (the cluster's settings are recorded there)"
fi
is_uint "$TIMEOUT" || die "bad --timeout: $TIMEOUT"
is_uint "$STOP_TIMEOUT" || die "bad TK_CLUSTER_STOP_TIMEOUT: $STOP_TIMEOUT"
for opt in O_CONTAINERS O_BASE_PORT O_ZK_PORT O_PULSAR_PORT O_PULSAR_HTTP_PORT O_PULSAR_BOOKIE_PORT; do
    [[ -z "${!opt}" ]] || is_uint "${!opt}" || die "bad --$(echo "${opt#O_}" | tr 'A-Z_' 'a-z-'): ${!opt}"
done
for opt in O_ZK_SESSION_TIMEOUT O_CHECKPOINT_INTERVAL; do
    [[ -z "${!opt}" ]] || is_number "${!opt}" || die "bad --$(echo "${opt#O_}" | tr 'A-Z_' 'a-z-'): ${!opt}"
done
[[ -z "$O_CONTAINERS" ]] || (( O_CONTAINERS >= 1 )) || die "--containers must be at least 1"
[[ -z "$O_CLUSTER" || "$O_CLUSTER" =~ ^[A-Za-z0-9._-]+$ ]] || die "bad --cluster: $O_CLUSTER (letters, digits, . _ -)"
[[ -z "$O_PULSAR_NAMESPACE" || "$O_PULSAR_NAMESPACE" =~ ^[A-Za-z0-9._-]+/[A-Za-z0-9._-]+$ ]] ||
    die "bad --pulsar-namespace: $O_PULSAR_NAMESPACE (TENANT/NAMESPACE)"
[[ -z "$O_ZK" || "$O_ZK" =~ ^[^/[:space:]]+:[0-9]+(,[^/[:space:]]+:[0-9]+)*$ ]] || die "bad --zk: $O_ZK (HOST:PORT[,...])"
[[ -z "$O_ZK" || -z "$O_ZK_PORT" ]] || die "--zk (use a running ZooKeeper) and --zk-port (start one) exclude each other"
if [[ -n "$O_PULSAR_URL$O_PULSAR_ADMIN_URL" ]]; then
    [[ -n "$O_PULSAR_URL" && -n "$O_PULSAR_ADMIN_URL" ]] || die "--pulsar-url and --pulsar-admin-url go together"
    [[ -z "$O_PULSAR_PORT$O_PULSAR_HTTP_PORT$O_PULSAR_BOOKIE_PORT" ]] ||
        die "--pulsar-url/--pulsar-admin-url (use a running Pulsar) and --pulsar-*-port (start one) exclude each other"
fi

if [[ "$CMD" == start ]]; then
    mkdir -p "$DIR"
elif [[ ! -d "$DIR" ]]; then
    log "no cluster in $DIR (no such directory)"
    [[ "$CMD" == stop ]] && exit 0
    exit 3
fi
DIR="$(cd "$DIR" && pwd)"
ENV_FILE="$DIR/cluster.env"
SERVERS_DIR="$DIR/servers"
ZK_DIR="$DIR/zookeeper"
PULSAR_DIR="$DIR/pulsar"
TLS_DIR="$DIR/tls"

# --- settings ----------------------------------------------------------------

# Settings of the first start are recorded in cluster.env. Later a setting given again must
# match, except the ones that only affect servers started from now on.
CLUSTER="" CONTAINERS="" ZK_SESSION_TIMEOUT="" BASE_PORT="" CHECKPOINT_INTERVAL=""
PULSAR_NAMESPACE="" ZK_MODE="" ZK_PORT="" ZK_CONNECT="" PULSAR_MODE="" PULSAR_PORT=""
PULSAR_HTTP_PORT="" PULSAR_BOOKIE_PORT="" PULSAR_URL="" PULSAR_ADMIN_URL="" TLS=""
RECORDED=0
if [[ -f "$ENV_FILE" ]]; then
    # shellcheck disable=SC1090
    source "$ENV_FILE"
    RECORDED=1
fi

describe() { # describe NAME VALUE: how the option that set it reads on the command line
    case "$1" in
        ZK_MODE) [[ "$2" == own ]] && echo "its own ZooKeeper (--zk-port)" || echo "a running ZooKeeper (--zk)" ;;
        PULSAR_MODE) [[ "$2" == own ]] && echo "its own Pulsar (--pulsar-*-port)" || echo "a running Pulsar (--pulsar-url)" ;;
        ZK_CONNECT) echo "--zk $2" ;;
        TLS) [[ "$2" == 1 ]] && echo "--tls" || echo "plaintext (no --tls)" ;;
        *) echo "--$(echo "$1" | tr 'A-Z_' 'a-z-') $2" ;;
    esac
}

settle() { # settle NAME GIVEN DEFAULT [soft]: given > recorded > default; a conflict is fatal
    local name="$1" given="$2" default="$3" soft="${4:-}" recorded="${!1}"
    if [[ -n "$given" ]]; then
        if [[ -n "$recorded" && "$recorded" != "$given" && -z "$soft" ]]; then
            die "$DIR was started with $(describe "$name" "$recorded"), not $(describe "$name" "$given");" \
                "stop it and use another --dir to change that"
        fi
        printf -v "$name" '%s' "$given"
    elif [[ -z "$recorded" ]]; then
        printf -v "$name" '%s' "$default"
    fi
}

resolve_settings() {
    settle CLUSTER "$O_CLUSTER" "$D_CLUSTER"
    settle CONTAINERS "$O_CONTAINERS" "$D_CONTAINERS"
    settle PULSAR_NAMESPACE "$O_PULSAR_NAMESPACE" "public/$CLUSTER"
    settle ZK_SESSION_TIMEOUT "$O_ZK_SESSION_TIMEOUT" "$D_ZK_SESSION_TIMEOUT" soft
    settle BASE_PORT "$O_BASE_PORT" "$D_BASE_PORT" soft
    settle CHECKPOINT_INTERVAL "$O_CHECKPOINT_INTERVAL" "" soft
    # A cluster is TLS or not from its first start (its servers must all speak the same): a
    # recorded plaintext cluster refuses --tls; a later start without --tls keeps what was recorded.
    if [[ -n "$O_TLS" ]]; then
        settle TLS 1 0
    elif [[ -z "$TLS" ]]; then
        TLS=0
    fi
    if [[ -n "$O_ZK" ]]; then
        settle ZK_MODE external external
        settle ZK_CONNECT "$O_ZK" ""
    else
        settle ZK_MODE "$([[ -n "$O_ZK_PORT" ]] && echo own)" own
        if [[ "$ZK_MODE" == own ]]; then
            settle ZK_PORT "$O_ZK_PORT" "$D_ZK_PORT"
            ZK_CONNECT="127.0.0.1:$ZK_PORT"
        fi
    fi
    if [[ -n "$O_PULSAR_URL" ]]; then
        settle PULSAR_MODE external external
        settle PULSAR_URL "$O_PULSAR_URL" ""
        settle PULSAR_ADMIN_URL "$O_PULSAR_ADMIN_URL" ""
    else
        settle PULSAR_MODE "$([[ -n "$O_PULSAR_PORT$O_PULSAR_HTTP_PORT$O_PULSAR_BOOKIE_PORT" ]] && echo own)" own
        if [[ "$PULSAR_MODE" == own ]]; then
            settle PULSAR_PORT "$O_PULSAR_PORT" "$D_PULSAR_PORT"
            settle PULSAR_HTTP_PORT "$O_PULSAR_HTTP_PORT" "$D_PULSAR_HTTP_PORT"
            settle PULSAR_BOOKIE_PORT "$O_PULSAR_BOOKIE_PORT" "$D_PULSAR_BOOKIE_PORT"
        fi
    fi
}

write_settings() {
    local tmp="$ENV_FILE.tmp" name
    {
        echo "# Written by deploy/cluster.sh start: the settings of this cluster."
        for name in CLUSTER CONTAINERS PULSAR_NAMESPACE ZK_SESSION_TIMEOUT BASE_PORT \
            CHECKPOINT_INTERVAL ZK_MODE ZK_PORT ZK_CONNECT PULSAR_MODE PULSAR_PORT \
            PULSAR_HTTP_PORT PULSAR_BOOKIE_PORT PULSAR_URL PULSAR_ADMIN_URL TLS; do
            printf '%s=%q\n' "$name" "${!name}"
        done
    } >"$tmp"
    mv "$tmp" "$ENV_FILE"
}

# --- servers -----------------------------------------------------------------

server_dir() { echo "$SERVERS_DIR/$1"; }

# The indexes of every server ever started in DIR, in order.
server_indexes() {
    [[ -d "$SERVERS_DIR" ]] || return 0
    local d
    for d in "$SERVERS_DIR"/*/; do
        d="${d%/}"; d="${d##*/}"
        [[ "$d" =~ ^[0-9]+$ ]] && echo "$d"
    done | sort -n
}

# Prints the pid if server I's pid file names a live `tablekeeper server` on its data dir.
server_pid() {
    local sdir
    sdir="$(server_dir "$1")"
    live_pid "$sdir/server.pid" " server " "--data-dir $sdir/data "
}

server_ports() { # server_ports I -> sets GRPC_PORT and METRICS_PORT from servers/I/ports
    GRPC_PORT="" METRICS_PORT=""
    local file; file="$(server_dir "$1")/ports"
    [[ -f "$file" ]] || return 1
    # shellcheck disable=SC1090
    source "$file"
    [[ -n "$GRPC_PORT" && -n "$METRICS_PORT" ]]
}

# Ports of this DIR that a new server must not take: every server's, ZooKeeper's, Pulsar's.
reserved_ports() {
    local i
    for i in $(server_indexes); do
        if server_ports "$i"; then echo "$GRPC_PORT"; echo "$METRICS_PORT"; fi
    done
    [[ "$ZK_MODE" != own ]] || echo "$ZK_PORT"
    [[ "$PULSAR_MODE" != own ]] || printf '%s\n' "$PULSAR_PORT" "$PULSAR_HTTP_PORT" "$PULSAR_BOOKIE_PORT"
}

next_free_port() { # next_free_port FROM: the first port >= FROM neither reserved nor in use
    local port="$1" reserved
    reserved=" $(reserved_ports | tr '\n' ' ') ${TAKEN_PORTS:-} "
    while [[ "$reserved" == *" $port "* ]] || port_in_use "$port"; do
        port=$((port + 1))
        (( port < 65536 )) || die "no free port from $1 on"
    done
    echo "$port"
}

start_server() { # start_server I: start server I (its recorded ports, else two free ones)
    local i="$1" sdir pid
    sdir="$(server_dir "$i")"
    mkdir -p "$sdir/data"
    if ! server_ports "$i"; then
        TAKEN_PORTS=""
        GRPC_PORT="$(next_free_port "$BASE_PORT")"
        TAKEN_PORTS="$GRPC_PORT"
        METRICS_PORT="$(next_free_port "$((GRPC_PORT + 1))")"
        TAKEN_PORTS=""
        [[ -n "$GRPC_PORT" && -n "$METRICS_PORT" ]] || die "server $i: no free ports from $BASE_PORT on"
        printf 'GRPC_PORT=%s\nMETRICS_PORT=%s\n' "$GRPC_PORT" "$METRICS_PORT" >"$sdir/ports"
    fi
    local p
    for p in "$GRPC_PORT" "$METRICS_PORT"; do
        if port_in_use "$p"; then die "server $i: port $p is in use by another process"; fi
    done
    local -a args=(server --zk "$ZK_CONNECT" --cluster "$CLUSTER"
        --zk-session-timeout "$ZK_SESSION_TIMEOUT"
        --log pulsar --checkpoint-store pulsar
        --pulsar-url "$PULSAR_URL" --pulsar-admin-url "$PULSAR_ADMIN_URL"
        --pulsar-namespace "$PULSAR_NAMESPACE"
        --host 127.0.0.1 --port "$GRPC_PORT" --metrics-port "$METRICS_PORT"
        --data-dir "$sdir/data")
    [[ -z "$CHECKPOINT_INTERVAL" ]] || args+=(--checkpoint-interval "$CHECKPOINT_INTERVAL")
    if [[ "$TLS" == 1 ]]; then
        args+=(--tls-cert "$TLS_DIR/server.pem" --tls-key "$TLS_DIR/server-key.pem"
            --tls-ca "$TLS_DIR/ca.pem")
    fi
    args+=("${SERVER_ARGS[@]}")
    echo "=== $(date -Is) starting server $i: $TABLEKEEPER ${args[*]}" >>"$sdir/server.log"
    # In the caller's directory: relative paths among SERVER_ARGS are the caller's.
    launch "$sdir/server.pid" "$sdir/server.log" "$PWD" -- "$TABLEKEEPER" "${args[@]}" ||
        die "server $i did not launch (see $sdir/server.log)"
    pid="$(cat "$sdir/server.pid")"
    log "server $i: pid $pid, bk://127.0.0.1:$GRPC_PORT, metrics :$METRICS_PORT, log $sdir/server.log"
}

# The throw-away CA, certificates and HMAC secret of a --tls cluster (made once, kept in DIR/tls).
make_certificates() {
    [[ -f "$TLS_DIR/ca.pem" && -f "$TLS_DIR/server.pem" && -f "$TLS_DIR/server-key.pem" ]] && return 0
    [[ -x "$PYTHON" ]] || die "$PYTHON not found: it makes the certificates (set TK_PYTHON)"
    "$PYTHON" -m tablekeeper_server.security.certs "$TLS_DIR" --hosts 127.0.0.1,localhost \
        --clients admin >&2 9>&- || die "could not make the certificates in $TLS_DIR"
    log "TLS: a throw-away CA and certificates in $TLS_DIR (for local use only)"
}

server_log_tails() { # the end of every server's log, to stderr
    local i
    for i in $(server_indexes); do
        echo "--- server $i: $(server_dir "$i")/server.log (last 20 lines)" >&2
        tail -n 20 "$(server_dir "$i")/server.log" >&2 2>/dev/null || true
    done
}

# --- readiness ---------------------------------------------------------------

cluster_status() { # cluster_status [--wait S]: `tablekeeper cluster status`, asked of this cluster's servers
    local -a tls=() addresses=()
    if [[ "$TLS" == 1 ]]; then # the servers are asked over TLS, as the admin client
        tls=(--tls-ca "$TLS_DIR/ca.pem" --tls-cert "$TLS_DIR/admin.pem" --tls-key "$TLS_DIR/admin-key.pem")
    fi
    local i GRPC_PORT METRICS_PORT # server_ports sets these: keep the caller's
    for i in $(server_indexes); do
        if server_ports "$i"; then addresses+=("127.0.0.1:$GRPC_PORT"); fi
    done
    if [[ ${#addresses[@]} == 0 ]]; then
        echo "error: no servers in $DIR to ask" >&2
        return 3
    fi
    # Any server answers for the whole cluster; the CLI tries them in order until one does.
    "$TABLEKEEPER" "${tls[@]}" --service "bk://$(IFS=,; echo "${addresses[*]}")" -o text cluster status "$@" 9>&-
}

wait_ready() { # wait_ready I...: until servers I... are live and every container is served
    local deadline=$((SECONDS + TIMEOUT)) out="" rc i missing
    while true; do
        for i in "$@"; do
            if ! server_pid "$i" >/dev/null; then
                server_ports "$i" || true
                echo "--- server $i: $(server_dir "$i")/server.log (last 40 lines)" >&2
                tail -n 40 "$(server_dir "$i")/server.log" >&2 || true
                die "server $i (port $GRPC_PORT) exited during start-up" \
                    "(what started keeps running: '$0 stop --dir $DIR' stops it)"
            fi
        done
        rc=0
        out="$(cluster_status --wait 0 2>&1)" || rc=$?
        missing=""
        if [[ "$rc" == 0 ]]; then
            local live
            live="$(sed -n 's/^servers: //p' <<<"$out")"
            for i in "$@"; do
                server_ports "$i" || true
                [[ ", $live, " == *", 127.0.0.1:$GRPC_PORT, "* ]] || missing+=" 127.0.0.1:$GRPC_PORT"
            done
            [[ -n "$missing" ]] || return 0
        fi
        if (( SECONDS >= deadline )); then
            echo "--- tablekeeper cluster status:" >&2
            echo "$out" >&2
            server_log_tails
            if [[ -n "$missing" ]]; then
                die "cluster not ready after ${TIMEOUT}s: not registered in ZooKeeper:$missing" \
                    "(what started keeps running: '$0 stop --dir $DIR' stops it)"
            fi
            die "cluster not ready after ${TIMEOUT}s: $(sed -n 's/^ready: no //p' <<<"$out" | head -c 2000)" \
                "(what started keeps running: '$0 stop --dir $DIR' stops it)"
        fi
        sleep 1
    done
}

# --- commands ----------------------------------------------------------------

service_uris() { # one bk:// URI per running server
    local i
    for i in $(server_indexes); do
        if server_pid "$i" >/dev/null && server_ports "$i"; then echo "bk://127.0.0.1:$GRPC_PORT"; fi
    done
}

do_start() {
    take_lock "$DIR/.lock" "$((TIMEOUT + STOP_TIMEOUT + 300))"
    [[ -x "$TABLEKEEPER" ]] || die "$TABLEKEEPER not found (run 'make install' or set TK_TABLEKEEPER)"
    resolve_settings
    write_settings
    local t0=$SECONDS

    if [[ "$ZK_MODE" == own ]]; then
        ZK_CONNECT="$("$SCRIPT_DIR/zookeeper.sh" start --port "$ZK_PORT" --dir "$ZK_DIR" 9>&-)" ||
            die "could not start ZooKeeper (log: $ZK_DIR/zookeeper.log)"
    fi
    if [[ "$PULSAR_MODE" == own ]]; then
        local -a urls
        mapfile -t urls < <("$SCRIPT_DIR/pulsar.sh" start --dir "$PULSAR_DIR" --port "$PULSAR_PORT" \
            --http-port "$PULSAR_HTTP_PORT" --bookie-port "$PULSAR_BOOKIE_PORT" 9>&- || echo FAILED)
        [[ ${#urls[@]} -ge 2 && "${urls[-1]}" != FAILED ]] ||
            die "could not start Pulsar (log: $PULSAR_DIR/pulsar.log)"
        PULSAR_URL="${urls[0]}" PULSAR_ADMIN_URL="${urls[1]}"
        write_settings
    else
        curl -sf --max-time 5 "$PULSAR_ADMIN_URL/admin/v2/clusters" >/dev/null ||
            die "Pulsar admin API at $PULSAR_ADMIN_URL does not answer"
    fi

    "$TABLEKEEPER" cluster init --zk "$ZK_CONNECT" --cluster "$CLUSTER" --containers "$CONTAINERS" \
        9>&- >&2 || die "tablekeeper cluster init failed"
    [[ "$TLS" != 1 ]] || make_certificates

    local i started=() all=()
    for i in $(seq 1 "$COUNT"); do
        all+=("$i")
        if server_pid "$i" >/dev/null; then continue; fi
        start_server "$i"
        started+=("$i")
    done
    local running=0
    for i in $(server_indexes); do
        if server_pid "$i" >/dev/null; then
            running=$((running + 1))
            (( i <= COUNT )) || all+=("$i")
        fi
    done
    if (( running > COUNT )); then
        log "note: $running servers are running, more than the $COUNT asked for ('stop' stops them all)"
    fi
    if (( ${#started[@]} == 0 )); then
        log "servers 1..$COUNT already running"
    fi
    log "waiting until every one of $CONTAINERS containers is served (timeout ${TIMEOUT}s)"
    wait_ready "${all[@]}"
    log "ready after $((SECONDS - t0))s: $running servers, $CONTAINERS containers, cluster '$CLUSTER'," \
        "ZooKeeper $ZK_CONNECT, Pulsar $PULSAR_URL namespace $PULSAR_NAMESPACE"
    exec 9>&-
    local -a uris
    mapfile -t uris < <(service_uris)
    local joined
    joined="bk://$(printf '%s\n' "${uris[@]}" | sed 's|^bk://||' | paste -sd, -)"
    if [[ "$TLS" == 1 ]]; then
        cat >&2 <<EOF
cluster.sh: TLS is on (a throw-away CA in $TLS_DIR); use any of the URIs below, or all at once:
  export TABLEKEEPER_SERVICE=$joined
  export TABLEKEEPER_TLS_CA=$TLS_DIR/ca.pem      # or --tls-ca $TLS_DIR/ca.pem on each command
  $TABLEKEEPER ns create app
  python: tablekeeper.Client("$joined", tls=tablekeeper.TlsConfig(ca="$TLS_DIR/ca.pem"))
  a client certificate (servers run with -- --tls-client-ca): $TLS_DIR/admin.pem, admin-key.pem
  status: $0 status --dir $DIR
  stop:   $0 stop --dir $DIR
EOF
    else
        cat >&2 <<EOF
cluster.sh: use any of the URIs below, or all of them at once:
  export TABLEKEEPER_SERVICE=$joined
  $TABLEKEEPER ns create app
  python: tablekeeper.Client("$joined")
  status: $0 status --dir $DIR
  stop:   $0 stop --dir $DIR
EOF
    fi
    printf '%s\n' "${uris[@]}"
}

do_stop() {
    take_lock "$DIR/.lock" "$((TIMEOUT + STOP_TIMEOUT + 300))"
    local i pid pids=()
    for i in $(server_indexes); do
        if pid="$(server_pid "$i")"; then
            log "stopping server $i (pid $pid)"
            pids+=("$pid")
        fi
    done
    # All at once: each drains and closes its containers while the others do.
    (( ${#pids[@]} == 0 )) || terminate "$STOP_TIMEOUT" "" "${pids[@]}"
    for i in $(server_indexes); do
        if ! server_pid "$i" >/dev/null; then
            rm -f "$(server_dir "$i")/server.pid"
            echo "=== $(date -Is) stopped" >>"$(server_dir "$i")/server.log"
        fi
    done
    (( ${#pids[@]} == 0 )) || log "stopped ${#pids[@]} servers"
    if [[ -d "$PULSAR_DIR" ]]; then
        "$SCRIPT_DIR/pulsar.sh" stop --dir "$PULSAR_DIR" 9>&- || log "pulsar.sh stop failed"
    fi
    if [[ -d "$ZK_DIR" ]]; then
        "$SCRIPT_DIR/zookeeper.sh" stop --dir "$ZK_DIR" 9>&- || log "zookeeper.sh stop failed"
    fi
    exec 9>&-
    log "stopped"
}

do_status() {
    if [[ "$RECORDED" == 0 ]]; then
        log "no cluster in $DIR (nothing was started there)"
        return 3
    fi
    local down=0 up=0 zk_up=1
    if [[ "$ZK_MODE" == own ]]; then
        if "$SCRIPT_DIR/zookeeper.sh" status --dir "$ZK_DIR" >/dev/null 2>&1; then
            echo "zookeeper: $ZK_CONNECT running ($ZK_DIR)"; up=$((up + 1))
        else
            echo "zookeeper: $ZK_CONNECT NOT RUNNING ($ZK_DIR)"; down=$((down + 1)); zk_up=0
        fi
    else
        echo "zookeeper: $ZK_CONNECT (not started by this script)"
    fi
    if [[ "$PULSAR_MODE" == own ]]; then
        if "$SCRIPT_DIR/pulsar.sh" status --dir "$PULSAR_DIR" >/dev/null 2>&1; then
            echo "pulsar: $PULSAR_URL $PULSAR_ADMIN_URL running ($PULSAR_DIR)"; up=$((up + 1))
        else
            echo "pulsar: $PULSAR_URL $PULSAR_ADMIN_URL NOT RUNNING ($PULSAR_DIR)"; down=$((down + 1))
        fi
    else
        echo "pulsar: $PULSAR_URL $PULSAR_ADMIN_URL (not started by this script)"
    fi
    echo "pulsar namespace: $PULSAR_NAMESPACE"
    if [[ "$TLS" == 1 ]]; then
        echo "tls: on, CA $TLS_DIR/ca.pem (the status below asks the servers over TLS)"
    fi
    if [[ "$zk_up" == 1 ]]; then
        cluster_status || down=$((down + 1))
    else
        echo "(tablekeeper cluster status skipped: ZooKeeper is not running)"
    fi
    printf '%-7s %-8s %-6s %-22s %-8s %s\n' server pid alive service metrics log
    local i pid alive
    for i in $(server_indexes); do
        server_ports "$i" || true
        if pid="$(server_pid "$i")"; then
            alive=yes; up=$((up + 1))
        else
            pid="-" alive=no; down=$((down + 1))
        fi
        printf '%-7s %-8s %-6s %-22s %-8s %s\n' "$i" "$pid" "$alive" \
            "bk://127.0.0.1:$GRPC_PORT" "$METRICS_PORT" "$(server_dir "$i")/server.log"
    done
    [[ -n "$(server_indexes)" ]] || echo "(no servers)"
    if (( up == 0 )); then return 3; fi
    if (( down > 0 )); then return 1; fi
    return 0
}

case "$CMD" in
    start) do_start ;;
    stop) do_stop ;;
    status) do_status ;;
esac

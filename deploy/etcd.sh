#!/usr/bin/env bash
# Start/stop a single-node etcd bound to loopback, for benchmarks and local tests.
# See `deploy/etcd.sh --help`.
set -euo pipefail

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_ROOT="$(cd "${SCRIPT_DIR}/.." && pwd)"
# shellcheck source-path=SCRIPTDIR source=lib/common.sh
source "$SCRIPT_DIR/lib/common.sh"
HOST="127.0.0.1"

usage() {
    cat <<EOF
Usage: deploy/etcd.sh <start|stop|status> [options]

Runs one etcd member on ${HOST} only (client and peer URLs on loopback).

Commands:
  start     Install etcd (Debian package etcd-server) if missing, start it in the
            background, wait until /health reports healthy, print the endpoint.
            A no-op (prints the endpoint) if it is already running on that port.
  stop      Stop the member started for that port (SIGTERM, then SIGKILL after
            the wait). A no-op if it is not running.
  status    Print whether the member for that port runs and is healthy.
            Exit 0 if healthy, 1 if running but unhealthy, 3 if not running.

Options:
  --port P          client port (default 2379)
  --peer-port P     peer port (default: client port + 1)
  --data-dir D      data directory. Default: .deploy/etcd/<port>/data inside the
                    repo, wiped on every start so each run begins empty. An explicit
                    --data-dir is kept as it is unless --fresh is also given.
  --fresh           wipe the data directory before starting (implied for the default)
  --quota-bytes B   backend quota (default 8589934592 = 8 GiB, etcd's suggested max)
  --wait S          seconds to wait for health on start / exit on stop (default 30)
  -h, --help        this help

State (pid file, log) lives in .deploy/etcd/<port>/ (override the base with
ETCD_DEPLOY_DIR). The server runs with --auto-compaction-retention=1 (periodic,
1 hour) and a raised quota so heavy benchmark loads do not trip the space alarm.

Examples:
  deploy/etcd.sh start                 # 127.0.0.1:2379
  deploy/etcd.sh start --port 23790    # second instance
  deploy/etcd.sh status --port 23790
  deploy/etcd.sh stop --port 23790
EOF
}

die() { # this script's errors carry no "ERROR:" (as before lib/common.sh)
    log "$*"
    exit 1
}

CMD=""
PORT=2379
PEER_PORT=""
DATA_DIR=""
FRESH=0
QUOTA_BYTES=8589934592
WAIT_S=30

while [[ $# -gt 0 ]]; do
    case "$1" in
        start | stop | status)
            [[ -z "${CMD}" ]] || die "only one command allowed (got ${CMD} and $1)"
            CMD="$1"
            ;;
        --port) PORT="${2:?--port needs a value}"; shift ;;
        --port=*) PORT="${1#*=}" ;;
        --peer-port) PEER_PORT="${2:?--peer-port needs a value}"; shift ;;
        --peer-port=*) PEER_PORT="${1#*=}" ;;
        --data-dir) DATA_DIR="${2:?--data-dir needs a value}"; shift ;;
        --data-dir=*) DATA_DIR="${1#*=}" ;;
        --fresh) FRESH=1 ;;
        --quota-bytes) QUOTA_BYTES="${2:?--quota-bytes needs a value}"; shift ;;
        --quota-bytes=*) QUOTA_BYTES="${1#*=}" ;;
        --wait) WAIT_S="${2:?--wait needs a value}"; shift ;;
        --wait=*) WAIT_S="${1#*=}" ;;
        -h | --help) usage; exit 0 ;;
        *) die "unknown argument: $1 (see --help)" ;;
    esac
    shift
done

[[ -n "${CMD}" ]] || { echo "Usage: deploy/etcd.sh <start|stop|status> [options] (see --help)" >&2; exit 2; }
is_uint "${PORT}" || die "--port must be a number"
[[ -z "${PEER_PORT}" ]] && PEER_PORT=$((PORT + 1))
is_uint "${PEER_PORT}" || die "--peer-port must be a number"
is_uint "${WAIT_S}" || die "--wait must be a whole number of seconds"
is_uint "${QUOTA_BYTES}" || die "--quota-bytes must be a number"

BASE_DIR="${ETCD_DEPLOY_DIR:-${REPO_ROOT}/.deploy/etcd}"
RUN_DIR="${BASE_DIR}/${PORT}"
PID_FILE="${RUN_DIR}/etcd.pid"
LOG_FILE="${RUN_DIR}/etcd.log"
if [[ -z "${DATA_DIR}" ]]; then
    DATA_DIR="${RUN_DIR}/data"
    FRESH=1
fi
ENDPOINT="${HOST}:${PORT}"

# Prints the pid from the pid file if that process is alive and is an etcd.
running_pid() { live_pid "${PID_FILE}" etcd; }

healthy() {
    local body
    body="$(curl -fsS --max-time 2 "http://${ENDPOINT}/health" 2>/dev/null || true)"
    [[ "${body}" == *'"health":"true"'* ]]
}

ensure_installed() {
    if command -v etcd >/dev/null 2>&1; then
        return 0
    fi
    log "etcd not found"
    apt_install etcd-server
    command -v etcd >/dev/null 2>&1 || die "etcd still not on PATH after install"
}

do_start() {
    local pid
    if pid="$(running_pid)"; then
        if healthy; then
            echo "etcd already running (pid ${pid})" >&2
            echo "${ENDPOINT}"
            return 0
        fi
        die "etcd pid ${pid} is running but not healthy; see ${LOG_FILE} or run stop"
    fi
    rm -f "${PID_FILE}"
    command -v curl >/dev/null 2>&1 || die "curl is needed for the health check"
    ensure_installed
    port_in_use "${PORT}" && die "port ${PORT} is already in use by another process"
    port_in_use "${PEER_PORT}" && die "peer port ${PEER_PORT} is already in use by another process"

    mkdir -p "${RUN_DIR}"
    if [[ "${FRESH}" == 1 && -d "${DATA_DIR}" ]]; then
        # Only ever wipe something that is empty or is an etcd data dir.
        if [[ -n "$(ls -A "${DATA_DIR}")" && ! -d "${DATA_DIR}/member" ]]; then
            die "refusing to wipe ${DATA_DIR}: not empty and not an etcd data dir"
        fi
        rm -rf "${DATA_DIR}"
    fi
    mkdir -p "${DATA_DIR}"
    chmod 700 "${DATA_DIR}"

    local name="bench-${PORT}"
    local client_url="http://${HOST}:${PORT}"
    local peer_url="http://${HOST}:${PEER_PORT}"
    # ETCD_* variables in the environment would be merged with (or shadowed by) flags;
    # start from a clean slate so the flags below are the whole configuration.
    local -a clean_env=()
    local var
    for var in $(compgen -e); do
        [[ "${var}" == ETCD_* ]] && clean_env+=(-u "${var}")
    done
    # ETCD_* variables are removed from the environment (env -u) before etcd starts; each start
    # begins a new log.
    : >"${LOG_FILE}"
    launch "${PID_FILE}" "${LOG_FILE}" "${PWD}" -- env "${clean_env[@]}" etcd \
        --name "${name}" \
        --data-dir "${DATA_DIR}" \
        --listen-client-urls "${client_url}" \
        --advertise-client-urls "${client_url}" \
        --listen-peer-urls "${peer_url}" \
        --initial-advertise-peer-urls "${peer_url}" \
        --initial-cluster "${name}=${peer_url}" \
        --initial-cluster-state new \
        --initial-cluster-token "tablekeeper-bench-${PORT}" \
        --auto-compaction-mode periodic \
        --auto-compaction-retention=1 \
        --quota-backend-bytes "${QUOTA_BYTES}" \
        --snapshot-count 10000 \
        --max-txn-ops 1024 \
        --logger zap \
        --log-outputs stderr \
        --log-level warn || die "failed to launch etcd (see ${LOG_FILE})"
    pid="$(cat "${PID_FILE}")"

    # Unlike the other scripts, an etcd that does not become healthy is stopped again.
    if ! (wait_probe etcd "${pid}" "$((SECONDS + WAIT_S))" 0.2 "${LOG_FILE}" healthy); then
        kill -TERM "${pid}" 2>/dev/null || true
        rm -f "${PID_FILE}"
        exit 1
    fi
    echo "etcd started (pid ${pid}, data ${DATA_DIR}, log ${LOG_FILE})" >&2
    echo "${ENDPOINT}"
}

do_stop() {
    local pid
    if ! pid="$(running_pid)"; then
        rm -f "${PID_FILE}"
        echo "etcd on port ${PORT} is not running" >&2
        return 0
    fi
    terminate "${WAIT_S}" "" "${pid}"
    rm -f "${PID_FILE}"
    echo "etcd on port ${PORT} stopped (pid ${pid})" >&2
}

do_status() {
    local pid
    if ! pid="$(running_pid)"; then
        echo "stopped (port ${PORT})"
        return 3
    fi
    if healthy; then
        echo "running healthy pid=${pid} endpoint=${ENDPOINT}"
        return 0
    fi
    echo "running UNHEALTHY pid=${pid} endpoint=${ENDPOINT} log=${LOG_FILE}"
    return 1
}

case "${CMD}" in
    start) do_start ;;
    stop) do_stop ;;
    status) do_status ;;
esac

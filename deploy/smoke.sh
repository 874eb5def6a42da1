#!/usr/bin/env bash
# Manual end-to-end check of deploy/zookeeper.sh and deploy/pulsar.sh: start both
# (in their own state dirs under .deploy/smoke/), do a kazoo round trip and a
# Pulsar produce/fence/read round trip, then stop both.
set -euo pipefail

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_ROOT="$(cd "${SCRIPT_DIR}/.." && pwd)"
PYTHON="${TK_PYTHON:-${REPO_ROOT}/.venv/bin/python}"
SMOKE_DIR="${REPO_ROOT}/.deploy/smoke"
ZK_PORT=2181
PULSAR_PORT=6650
HTTP_PORT=8080
BOOKIE_PORT=3181
KEEP=0

usage() {
    cat <<EOF
Usage: $(basename "$0") [options]

Starts ZooKeeper and Pulsar standalone (state under .deploy/smoke/, wiped first),
checks a kazoo session (create/read/ephemeral/2 s session timeout) and a Pulsar
round trip (ExclusiveWithFencing producer, fencing by a second producer, reader),
then stops both.  Exit status 0 when everything passed.

Options:
  --zk-port PORT       (default 2181)
  --pulsar-port PORT   (default 6650)
  --http-port PORT     (default 8080)
  --bookie-port PORT   (default 3181)
  --keep               leave both services running afterwards
  -h, --help           this help
EOF
}

while [[ $# -gt 0 ]]; do
    case "$1" in
        --zk-port) ZK_PORT="$2"; shift 2 ;;
        --pulsar-port) PULSAR_PORT="$2"; shift 2 ;;
        --http-port) HTTP_PORT="$2"; shift 2 ;;
        --bookie-port) BOOKIE_PORT="$2"; shift 2 ;;
        --keep) KEEP=1; shift ;;
        -h|--help) usage; exit 0 ;;
        *) usage >&2; echo "smoke.sh: unknown argument: $1" >&2; exit 2 ;;
    esac
done

ZK_DIR="$SMOKE_DIR/zookeeper"
PULSAR_DIR="$SMOKE_DIR/pulsar"

cleanup() {
    local rc=$?
    if [[ "$KEEP" == 0 ]]; then
        "$SCRIPT_DIR/pulsar.sh" stop --dir "$PULSAR_DIR" || true
        "$SCRIPT_DIR/zookeeper.sh" stop --dir "$ZK_DIR" || true
    fi
    if [[ $rc == 0 ]]; then echo "smoke.sh: PASSED"; else echo "smoke.sh: FAILED (rc=$rc)"; fi
}

# Stop leftovers of an earlier smoke run, then start from empty state dirs.
"$SCRIPT_DIR/pulsar.sh" stop --dir "$PULSAR_DIR" 2>/dev/null || true
"$SCRIPT_DIR/zookeeper.sh" stop --dir "$ZK_DIR" 2>/dev/null || true
rm -rf "$SMOKE_DIR"
trap cleanup EXIT

t=$SECONDS
ZK="$("$SCRIPT_DIR/zookeeper.sh" start --port "$ZK_PORT" --dir "$ZK_DIR")"
echo "smoke.sh: zookeeper up at $ZK in $((SECONDS - t))s"

t=$SECONDS
mapfile -t URLS < <("$SCRIPT_DIR/pulsar.sh" start --port "$PULSAR_PORT" --http-port "$HTTP_PORT" \
    --bookie-port "$BOOKIE_PORT" --dir "$PULSAR_DIR")
[[ ${#URLS[@]} -eq 2 ]] || { echo "smoke.sh: pulsar.sh start printed ${URLS[*]:-nothing}" >&2; exit 1; }
echo "smoke.sh: pulsar up at ${URLS[0]} (admin ${URLS[1]}) in $((SECONDS - t))s"

echo "smoke.sh: kazoo round trip"
"$PYTHON" - "$ZK" <<'PY'
import sys, uuid
from kazoo.client import KazooClient

hosts = sys.argv[1]
zk = KazooClient(hosts=hosts, timeout=2.0)
zk.start(timeout=10)
try:
    # kazoo stores the server-negotiated value here after connecting
    negotiated = getattr(zk, "_session_timeout", None)
    if negotiated is not None:
        assert negotiated == 2000, "server negotiated %s ms instead of 2000" % negotiated
    base = "/tk-smoke-" + uuid.uuid4().hex[:8]
    zk.create(base, b"v1", makepath=True)
    assert zk.get(base)[0] == b"v1"
    zk.set(base, b"v2")
    assert zk.get(base)[0] == b"v2"
    seq = zk.create(base + "/n-", b"", ephemeral=True, sequence=True)
    assert zk.get_children(base) == [seq.rsplit("/", 1)[1]]
    zk.delete(base, recursive=True)
    print("  ok: create/set/get/ephemeral-sequential/delete on %s, session timeout requested 2 s%s" % (
        hosts, "" if negotiated is None else ", negotiated %s ms" % negotiated))
finally:
    zk.stop()
    zk.close()
PY

echo "smoke.sh: pulsar round trip (readiness check)"
"$SCRIPT_DIR/pulsar.sh" check --dir "$PULSAR_DIR" | sed 's/^/  /'

echo "smoke.sh: pulsar ExclusiveWithFencing"
"$PYTHON" - "${URLS[0]}" <<'PY'
import logging, sys, uuid
import pulsar

quiet = logging.getLogger("pulsar-client")
quiet.addHandler(logging.NullHandler())
quiet.propagate = False

mode = pulsar.ProducerAccessMode.ExclusiveWithFencing  # AttributeError = not supported
client = pulsar.Client(sys.argv[1], operation_timeout_seconds=10, logger=quiet)
try:
    topic = "persistent://public/default/tk-smoke-fence-" + uuid.uuid4().hex[:8]
    p1 = client.create_producer(topic, access_mode=mode, producer_name="smoke-p1")
    p1.send(b"from-p1")
    p2 = client.create_producer(topic, access_mode=mode, producer_name="smoke-p2")  # fences p1
    p2.send(b"from-p2")
    try:
        p1.send(b"stale")
        sys.exit("fenced producer could still send")
    except pulsar.ProducerFenced:
        pass
    reader = client.create_reader(topic, pulsar.MessageId.earliest)
    got = []
    while reader.has_message_available():
        got.append(reader.read_next(timeout_millis=5000).data())
    assert got == [b"from-p1", b"from-p2"], got
    print("  ok: second ExclusiveWithFencing producer fenced the first (ProducerFenced), reader got %r" % got)
finally:
    client.close()
PY

echo "smoke.sh: status"
"$SCRIPT_DIR/zookeeper.sh" status --dir "$ZK_DIR" | sed 's/^/  /'
"$SCRIPT_DIR/pulsar.sh" status --dir "$PULSAR_DIR" | sed 's/^/  /'

# TableKeeper — the two commands a user needs are `make run` and `make test`.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# Two install levels in the one .venv: `make run` needs only the server (the `server` extra);
# everything else (tests, lint, protos, benchmarks) needs the full set, which includes it.
SERVER_STAMP := $(VENV)/.installed-server
STAMP := $(VENV)/.installed
PROTO_FILES := $(wildcard proto/tablekeeper_proto/bookkeeper/*.proto proto/tablekeeper_proto/v1/*.proto proto/tablekeeper_proto/etcd/*.proto proto/tablekeeper_proto/oxia/*.proto proto/tablekeeper_proto/zookeeper/*.proto)
DATA_DIR ?= ./data
# Python keeps the bytecode it compiles (__pycache__/, git-ignored) even where the environment
# says not to (PYTHONDONTWRITEBYTECODE, set in some container images): without it every process
# compiles what it imports from source again, and a server (`make run`, or each of the hundreds
# the tests start) spends about twice as long starting.
unexport PYTHONDONTWRITEBYTECODE
# The Pulsar tests start a Pulsar standalone through deploy/pulsar.sh (its first run downloads
# the jars with mvn into ~/.cache); under make they must run, never be skipped.
export TABLEKEEPER_REQUIRE_PULSAR ?= 1
PORT ?= 4181
METRICS_PORT ?= 9181
ETCD_PORT ?= 2379
OXIA_PORT ?= 6648
ZOOKEEPER_PORT ?= 2181

.PHONY: docs etcd-client promtool debian-tools java-drivers-build help install run test test-steps test-unit test-integration test-tiers test-compat test-floors test-robustness robustness robustness-tools lint proto proto-check bench ghz profile simulate clean pulsar-fetch java-compat-build zookeeper-compat-build pulsar-metadata-build test-pulsar-metadata etcd3-suite test-etcd3 etcd-check-perf test-zookeeper-differential

help:  ## list targets
	@grep -E '^[a-z-]+:.*##' $(MAKEFILE_LIST) | sed 's/:.*##/\t/'

# A venv whose pip knows PEP 735 dependency groups (`--group`, pip >= 25.1).
# PIP_INSTALL does not compile the installed packages' bytecode ahead (`--no-compile`): pip does
# it file by file, on one core, for every module of every package (~23 of a fresh install's ~70
# CPU-seconds here); Python compiles what a process imports on first use and keeps it (see
# PYTHONDONTWRITEBYTECODE below).
PIP_INSTALL := $(PY) -m pip install -q --no-compile
define make-venv
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP_INSTALL) --upgrade 'pip>=25.1'
endef

$(SERVER_STAMP): pyproject.toml
	$(make-venv)
	$(PIP_INSTALL) -e '.[server]'
	@# Envoy (pyvoy) is the default runtime; where it has no wheel the server runs grpc.aio.
	$(PIP_INSTALL) -e '.[server,envoy]' || echo "pyvoy is not available here: the server runs on grpc.aio"
	touch $(SERVER_STAMP)

# The full set: cluster mode and Pulsar (`cluster`, which includes `server`), the Spark connector
# (`spark`, for tests/integration/test_spark.py), Envoy (`envoy`: the default runtime) and the
# dev tools (the `dev` dependency group).
$(STAMP): pyproject.toml
	$(make-venv)
	$(PIP_INSTALL) -e '.[cluster,spark,envoy]' --group dev
	touch $(STAMP) $(SERVER_STAMP)

install: $(STAMP)  ## create .venv and install the server (cluster mode, Pulsar, Spark), SDK and dev tools

# What the test set-up keeps outside the checkout, for every clone (mypy's cache, the virtualenvs
# of python-etcd3's suite and of the SDK floors; Pulsar's jars too, see deploy/pulsar.sh).
TK_CACHE := $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/tablekeeper

# The SDK at the lowest versions pyproject.toml declares (grpcio, protobuf; the health-checking
# package the test harness imports, at its declared floor), in a client-only environment: a
# virtualenv of those packages alone, kept in the user's cache (~/.cache/tablekeeper) under the
# hash of its requirements, as python-etcd3's is (building it cost each fresh clone 34 core-s);
# the checkout's own sources come from PYTHONPATH, as an editable install would give them.
FLOORS_REQUIREMENTS := $(shell $(PYTHON) -c "import tomllib; p = tomllib.load(open('pyproject.toml', 'rb'))['project']; \
	print(' '.join(d.replace('>=', '==') for d in p['dependencies'] + [x for x in p['optional-dependencies']['server'] if x.startswith('grpcio')]))") \
	kazoo pytest pytest-asyncio pytest-timeout
FLOORS_VENV := $(TK_CACHE)/venv-floors-$(shell echo '$(FLOORS_REQUIREMENTS)' | sha256sum | cut -c1-12)
FLOORS_STAMP := $(FLOORS_VENV)/.installed
$(FLOORS_STAMP):
	mkdir -p $(dir $(FLOORS_VENV))
	flock $(FLOORS_VENV).lock sh -c 'test -e $(FLOORS_STAMP) || { rm -rf $(FLOORS_VENV) && \
		$(PYTHON) -m venv $(FLOORS_VENV) && $(FLOORS_VENV)/bin/pip install -q $(FLOORS_REQUIREMENTS) && \
		touch $(FLOORS_STAMP); }'

run: $(SERVER_STAMP)  ## start the standalone server in the foreground (DATA_DIR, PORT, METRICS_PORT, ETCD_PORT, OXIA_PORT, ZOOKEEPER_PORT)
	$(VENV)/bin/tablekeeper server --data-dir $(DATA_DIR) --port $(PORT) --metrics-port $(METRICS_PORT) --etcd-port $(ETCD_PORT) --oxia-port $(OXIA_PORT) --zookeeper-port $(ZOOKEEPER_PORT)

proto: $(STAMP)  ## regenerate proto/gen from proto/*.proto
	rm -rf proto/gen/tablekeeper_proto
	PATH=$(CURDIR)/$(VENV)/bin:$$PATH $(PY) -m grpc_tools.protoc -I proto --python_out=proto/gen --grpc_python_out=proto/gen \
		--mypy_out=proto/gen --mypy_grpc_out=proto/gen $(PROTO_FILES)
	for d in proto/gen/tablekeeper_proto proto/gen/tablekeeper_proto/bookkeeper proto/gen/tablekeeper_proto/v1 proto/gen/tablekeeper_proto/etcd proto/gen/tablekeeper_proto/oxia proto/gen/tablekeeper_proto/zookeeper; do \
		touch $$d/__init__.py; done
	touch proto/gen/tablekeeper_proto/py.typed

proto-check: $(STAMP)  ## fail if proto/gen is stale
	$(MAKE) -s proto && git diff --exit-code -- proto/gen

DOCS_DIR := build/docs
docs: $(STAMP)  ## the SDK's API reference (HTML, pdoc) into build/docs (git-ignored)
	rm -rf $(DOCS_DIR)
	$(VENV)/bin/pdoc --docformat markdown --no-show-source --output-directory $(DOCS_DIR) \
		tablekeeper tablekeeper.errors tablekeeper.types tablekeeper.recipes tablekeeper.recipes.sync
	@echo "API reference: $(DOCS_DIR)/index.html"

# mypy's cache outside the checkout, as pip's and Maven's are: a fresh clone checks only the
# modules whose contents (not their file times) differ from the last run's, and what depends on
# them (40 core-s cold, 1 warm). MYPY_CACHE_DIR= (empty) keeps it in the checkout.
MYPY_CACHE_DIR ?= $(TK_CACHE)/mypy
lint: $(STAMP)  ## ruff and mypy
	$(VENV)/bin/ruff check client server tests benchmarks
	$(VENV)/bin/ruff format --check client server tests benchmarks
	$(VENV)/bin/mypy $(if $(MYPY_CACHE_DIR),--cache-dir "$(MYPY_CACHE_DIR)") client server tests

pulsar-fetch:  ## download the Pulsar jars for the Pulsar tests (mvn, first run only; then a no-op)
	deploy/pulsar.sh fetch
	@# the examples jar and pulsar-admin for tests/integration/test_pulsar_functions.py
	deploy/pulsar-functions.sh fetch >/dev/null

# $(call beside,MAIN,SIDE,WHAT[,PORTS]): run the shell command SIDE (WHAT names it) in a process
# group of its own beside MAIN, print its output once both are done, and fail if either fails (an
# interrupt stops SIDE's whole group as well as MAIN). A tier whose modules leave the cores idle
# part of the time (waiting on servers, ZooKeeper, Pulsar) runs its other passes this way. The
# two pick their servers' ports from ranges of their own (tests/support/server.py): MAIN's
# 20000-28000, SIDE's PORTS (default 28000-32000).
define beside
	@side_log=$$(mktemp); \
	setsid env TABLEKEEPER_TEST_PORTS=$(or $(4),28000-32000) bash -c "$(2)" >"$$side_log" 2>&1 & side=$$!; \
	trap 'kill -TERM -- -'$$side' 2>/dev/null; rm -f "'$$side_log'"' EXIT; \
	echo "beside this run (process group $$side): $(3)"; \
	TABLEKEEPER_TEST_PORTS=20000-28000 $(1); main_status=$$?; \
	wait $$side; side_status=$$?; \
	echo "--- $(3) (exit $$side_status):"; \
	cat "$$side_log"; \
	test $$main_status -eq 0 && test $$side_status -eq 0
endef

# The unit, integration and compat tiers run their modules on TEST_WORKERS pytest processes
# (pytest-xdist), a module's tests together on one of them (`TEST_WORKERS=1`: one at a time).
# Most tests wait on servers, ZooKeeper sessions and Pulsar more than they compute (two workers
# kept this machine's two cores 58 % busy in the integration tier), so three workers share them.
# Each worker starts the Pulsar its tests ask for and picks ports from its own share
# (tests/support/server.py).
TEST_WORKERS ?= 3
test-unit: $(STAMP) pulsar-fetch  ## unit, contract and simulation tests (fakes, local files, a real Pulsar)
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile tests/unit tests/contract tests/simulation

SEEDS ?= 2000
simulate: $(STAMP)  ## the seeded simulation over SEEDS seeds (a failure prints the command replaying it)
	$(PY) -m tests.simulation --seeds $(SEEDS)

# Beside the tier's modules: Spark's tests (Spark starts its JVM with fork/exec: in a process
# whose earlier tests left gRPC threads running, that fork is unsafe, as gRPC skips its fork
# handlers, so Spark gets a process of its own), then the SDK suite once more, entering a
# 3-server cluster (ZooKeeper + Pulsar) through one endpoint.
INTEGRATION_SIDE = $(PY) -m pytest -q tests/integration/test_spark.py && \
	TABLEKEEPER_TEST_CLUSTER=3 $(PY) -m pytest -q tests/integration/test_sdk.py -k 'not data_survives_restart'
test-integration: $(STAMP) pulsar-fetch etcd-client promtool  ## real server processes (and Pulsar), SDK and CLI end to end
	$(call beside,$(PY) -m pytest -q --durations=15 -n $(TEST_WORKERS) --dist loadfile tests/integration --ignore=tests/integration/test_spark.py,$(INTEGRATION_SIDE),tests/integration/test_spark.py then test_sdk.py on a cluster)

etcd-client:  ## etcdctl for the etcd API tests (Debian etcd-client; installed if missing)
	command -v etcdctl >/dev/null || (apt-get update -qq && apt-get install -y -qq etcd-client)

promtool:  ## promtool for the alert rules' tests (Debian prometheus; installed if missing, not run)
	command -v promtool >/dev/null || (apt-get update -qq && apt-get install -y -qq prometheus)

# The BookKeeper Java client's driver (tests/compat/java): Maven Central on the first run, then
# offline from ~/.m2; test_java_client.py runs it (and would build it itself if it is stale).
JAVA_COMPAT_MVN := mvn -q -B package dependency:build-classpath -Dmdep.outputFile=target/classpath.txt
java-compat-build:  ## build the Java compatibility driver (Maven; downloads only on the first run)
	cd tests/compat/java && ($(JAVA_COMPAT_MVN) -o >/dev/null 2>&1 || $(JAVA_COMPAT_MVN))

# The ZooKeeper Java client's and Curator's drivers (tests/compat/zookeeper_java) and the Kafka
# broker and client (tests/compat/kafka) for the ZooKeeper port's compat tests, likewise.
zookeeper-compat-build:  ## build the ZooKeeper Java client, Curator and Kafka drivers (Maven; downloads only on the first run)
	cd tests/compat/zookeeper_java && ($(JAVA_COMPAT_MVN) -o >/dev/null 2>&1 || $(JAVA_COMPAT_MVN))
	cd tests/compat/kafka && ($(JAVA_COMPAT_MVN) -o >/dev/null 2>&1 || $(JAVA_COMPAT_MVN))

# Pulsar's own metadata-store tests (the pulsar-metadata test-jar) run by tests/compat/
# test_pulsar_metadata.py through a harness of ours (tests/compat/pulsar_metadata): Maven
# resolves them into Pulsar's jar cache on the first run, then builds offline.
PULSAR_M2 = $${PULSAR_CACHE_DIR:-$${XDG_CACHE_HOME:-$$HOME/.cache}/tablekeeper/pulsar-4.0.7}/m2
PULSAR_METADATA_MVN = mvn -q -B -Dmaven.repo.local=$(PULSAR_M2) package dependency:build-classpath -Dmdep.outputFile=target/classpath.txt
pulsar-metadata-build: pulsar-fetch  ## build the harness for Pulsar's metadata tests (Maven; downloads only on the first run)
	cd tests/compat/pulsar_metadata && ($(PULSAR_METADATA_MVN) -o >/dev/null 2>&1 || $(PULSAR_METADATA_MVN))

# python-etcd3's own test suite (its 0.12.0 sdist's tests/) in a virtualenv of its own with the
# protobuf, tenacity and hypothesis it was written for (tests/compat/test_python_etcd3.py), kept
# in the user's cache (~/.cache/tablekeeper) as Pulsar's jars are: nothing in it is ours.
etcd3-suite: $(STAMP)  ## the virtualenv and sdist python-etcd3's own tests run from (PyPI; first run only)
	$(PY) -c "from tests.compat.test_python_etcd3 import prepare; prepare()"

# Beside the modules' standalone pass, two more passes, one after the other:
# Once more, the tests marked on_cluster: what depends on the topology (the root range and the
# containers on other servers: routing, forwarding, splits), each module against a 3-server
# cluster of its own (ZooKeeper + Pulsar, deploy/cluster.sh) entered through one endpoint.
# The other tests' calls are the same on a cluster; forwarding itself is proven for every
# front-end by tests/integration (test_sdk.py on a cluster, test_forwarded_errors.py,
# test_etcd_cluster.py, test_oxia_cluster.py, test_zookeeper_cluster.py). Those also marked
# cluster_only (the Java client through splits) show there all they would on a standalone
# server, and are skipped above.
# And once more, the tests marked on_grpc_aio, with every server's gRPC ports on grpcio's server
# (`--runtime grpc-aio`; the default is Envoy's HTTP/2): each client library (BookKeeper Python
# and Java, etcdctl, clientv3, the Oxia Java client) with what depends on the HTTP/2 server
# (status codes, streams, many calls in flight, TLS, metadata, several ports, a client going
# on through a restart). Not again there: what the storage decides (data kept across restarts,
# kill -9, compaction, splits), python-etcd3's and Pulsar's metadata suites, and the Pulsar
# standalones on the Oxia front-end (Pulsar's metadata client there is the Oxia Java client,
# which the on_grpc_aio scenarios run; `make test-pulsar-metadata PULSAR_METADATA_RUNTIME=grpc-aio`
# runs Pulsar's own metadata tests, Oxia and etcd stores, on grpc.aio).
COMPAT_SIDE = TABLEKEEPER_TEST_CLUSTER=3 $(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile -m on_cluster tests/compat && \
	TABLEKEEPER_TEST_RUNTIME=grpc-aio $(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile -m on_grpc_aio tests/compat
COMPAT_BUILDS ?= java-compat-build zookeeper-compat-build pulsar-metadata-build etcd3-suite
test-compat: $(STAMP) pulsar-fetch etcd-client $(COMPAT_BUILDS)  ## the unmodified BookKeeper Python and Java clients against a real server (own process: its protos share names with ours)
	$(call beside,$(PY) -m pytest -q --durations=10 -n $(TEST_WORKERS) --dist loadfile tests/compat,$(COMPAT_SIDE),the on_cluster pass then the on_grpc_aio pass)

# The ZooKeeper differential test (test-compat plays 3 seeds of 150 operations) over many seeds.
ZK_DIFFERENTIAL_SEEDS ?= 40
ZK_DIFFERENTIAL_OPS ?= 300
test-zookeeper-differential: $(STAMP) pulsar-fetch  ## seeded operations against a real ZooKeeper 3.9 and the ZooKeeper port, compared (ZK_DIFFERENTIAL_SEEDS x ZK_DIFFERENTIAL_OPS, ~5 min)
	TABLEKEEPER_ZK_DIFFERENTIAL_SEEDS=$(ZK_DIFFERENTIAL_SEEDS) TABLEKEEPER_ZK_DIFFERENTIAL_OPS=$(ZK_DIFFERENTIAL_OPS) \
		$(PY) -m pytest -q tests/compat/test_zookeeper_differential.py

test-etcd3: $(STAMP) etcd-client etcd3-suite  ## all of python-etcd3's own tests, its slow property tests too (~5 min)
	TABLEKEEPER_ETCD3_SUITE=all $(PY) -m pytest -q -s tests/compat/test_python_etcd3.py

etcd-check-perf: $(STAMP) etcd-client  ## etcdctl check perf (its small load, 60 s) against a fresh server's etcd port
	$(PY) benchmarks/etcd_check_perf.py

# Every class of Pulsar's metadata suite (test-compat runs the store, cache and coordination
# classes): about 20 minutes on this 2-core machine, so not part of `make test`.
PULSAR_METADATA_RUNTIME ?=
test-pulsar-metadata: $(STAMP) pulsar-metadata-build  ## all of Pulsar's metadata-store tests against the Oxia and etcd ports (~20 min)
	TABLEKEEPER_PULSAR_METADATA_CLASSES=all $(if $(PULSAR_METADATA_RUNTIME),TABLEKEEPER_TEST_RUNTIME=$(PULSAR_METADATA_RUNTIME)) \
		$(PY) -m pytest -q -s tests/compat/test_pulsar_metadata.py

test-floors: $(STAMP) $(FLOORS_STAMP)  ## the SDK suite with grpcio/protobuf at their declared floors
	$(FLOORS_VENV)/bin/pip list 2>/dev/null | grep -E '^(grpcio|protobuf) '
	PYTHONPATH=$(CURDIR)/client:$(CURDIR)/server:$(CURDIR)/proto/gen TABLEKEEPER_TEST_SERVER_BIN=$(CURDIR)/$(VENV)/bin/tablekeeper \
		$(FLOORS_VENV)/bin/python -m pytest -q -p no:cacheprovider tests/integration/test_sdk.py

# Robustness (tests/robustness): real clients of every protocol against a 3-server cluster whose
# servers, ZooKeeper and Pulsar each run in a network namespace of their own (root, `ip`, `nft`),
# under pauses, kills, partitions, slow logs, moves and splits; histories checked with porcupine.
robustness-tools:  ## ip and nft for the robustness tests' network namespaces (Debian iproute2, nftables; installed if missing)
	command -v ip >/dev/null && command -v nft >/dev/null || \
		(apt-get update -qq && apt-get install -y -qq iproute2 nftables)

test-robustness: $(STAMP) pulsar-fetch robustness-tools  ## the short robustness run (two seeds, about two minutes)
	TABLEKEEPER_REQUIRE_NETNS=1 $(PY) -m pytest -q tests/robustness

SEED ?=
MINUTES ?= 30
DURATION ?= 45
NEMESIS ?=
robustness: $(STAMP) pulsar-fetch robustness-tools  ## the long robustness run: seeds for MINUTES (SEED=N replays one; DURATION per seed; NEMESIS=kind,...)
	$(PY) -m tests.robustness --minutes $(MINUTES) --duration $(DURATION) \
		$(if $(SEED),--seed $(SEED)) $(if $(NEMESIS),--nemesis $(NEMESIS))

# First, side by side, what needs no virtualenv beside the virtualenv (pip keeps one core busy,
# Maven the other, the downloads and apt neither): the Java drivers (one after the other: they
# share ~/.m2) and Pulsar's metadata harness, the Debian tools (one after the other: apt holds a
# lock), the floors' virtualenv.
debian-tools:
	$(MAKE) --no-print-directory etcd-client promtool robustness-tools
java-drivers-build:
	$(MAKE) --no-print-directory java-compat-build zookeeper-compat-build
TEST_BUILD := $(STAMP) pulsar-fetch java-drivers-build debian-tools pulsar-metadata-build $(FLOORS_STAMP)
# Then one Pulsar for every test process from here on (tests/support/shared_pulsar.py; each
# would start its own), and with it: lint, python-etcd3's virtualenv and the unit tier side by
# side; the integration tier; then the compat tier with the robustness run and the floors beside
# it (its passes wait on Java clients, Pulsar and ZooKeeper more than they compute), on ports of
# their own. The tiers do not build again what the first step built (COMPAT_BUILDS=).
test:  ## everything CI runs
	@$(MAKE) --no-print-directory -j4 --output-sync=target $(TEST_BUILD)
	@$(PY) -m tests.support.shared_pulsar --ports 32700-32768 -- $(MAKE) --no-print-directory test-steps
test-steps:
	@$(MAKE) --no-print-directory -j4 --output-sync=target lint etcd3-suite test-unit
	@$(MAKE) --no-print-directory test-tiers
test-tiers:
	@$(MAKE) --no-print-directory test-integration
	$(call beside,$(MAKE) --no-print-directory COMPAT_BUILDS= test-compat,$(MAKE) --no-print-directory test-robustness && $(MAKE) --no-print-directory test-floors,the robustness tests then the floors,32000-32700)

GHZ_VERSION := v0.93.0
GHZ := $(CURDIR)/.deploy/bin/ghz
$(GHZ):
	GOBIN=$(CURDIR)/.deploy/bin GOFLAGS=-mod=mod go install github.com/bojand/ghz/cmd/ghz@$(GHZ_VERSION)

ghz: $(GHZ)  ## install the ghz load generator (Go module proxy) into .deploy/bin

profile: $(STAMP) $(GHZ)  ## py-spy samples a server under a ghz load: hottest functions, collapsed stacks in benchmarks/out/
	GHZ=$(GHZ) $(PY) benchmarks/cpu_profile.py

bench: $(STAMP) $(GHZ)  ## TableKeeper vs etcd: one native generator (ghz), then the SDK path (load.py)
	GHZ=$(GHZ) $(PY) benchmarks/native.py --envoy
	$(PY) benchmarks/load.py --start-servers

clean:  ## remove the virtualenv and local data
	rm -rf $(VENV) $(DATA_DIR) .deploy

# idempay — the README's commands. Each target does its own set-up.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | sha1sum | cut -c1-12)

.PHONY: demo test test-fast lint bench loadtest chaos failover verify services tools clean \
	images deploy-check deploy-test

# --no-compile: a module is compiled when first imported, not all 1.4 GB of them at install
# (compiling every installed module costs 27 CPU-s here; most are never imported).
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q -U pip
	$(BIN)/python -m pip install -q --no-compile -e '.[api,sdk,analytics,loadtest,dev]'
	rm -f $(VENV)/.installed-* && touch $@

services:
	./scripts/services.sh

# System tools the suite drives: headless Chromium (the report test) and spin (the model).
tools:
	./scripts/ensure_chromium.sh >/dev/null
	@command -v spin >/dev/null || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq spin >/dev/null)
	@command -v patroni >/dev/null && command -v etcd >/dev/null || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq patroni etcd-server etcd-client >/dev/null)

demo: $(STAMP)
	$(BIN)/idempay demo

# The suite on TEST_WORKERS pytest-xdist processes (many tests wait on timers and servers, so
# more workers than cores: on 2 cores pytest took 18:44 with 3 workers and 17:33 with 4,
# which still left 14 % of the CPU idle); tests sharing a private cluster or session stay on one worker
# (xdist_group marks, set in tests/conftest.py). TEST_WORKERS=0 runs it in one process.
# Every run prints the 25 slowest tests and the 25 heaviest by CPU (tests/support/cpu_report.py).
# The deploy test (deploy-test below: image builds, the stack, its audit) runs after pytest.
# Beside it (the script's --start/join mode), a clean clone on 2 cores took 20:08 instead of
# 21:53 (pytest 19:34 instead of 17:51; the deploy test 13 min, its stack up after 50 s): 1:45
# saved for pytest's timing tests run under more load. On a slower machine the stack missed
# its 180 s readiness bound that way.
TEST_WORKERS ?= 4
PARALLEL = $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadgroup)
test: $(STAMP) services tools
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/lint-imports
	$(BIN)/pytest -q -p no:cacheprovider $(PARALLEL) --durations=25
	./deploy/local/deploy_test.sh --if-possible

# The edit loop's lane: no servers, Spark, browser, model or chaos (markers set in tests/conftest.py);
# CPU-bound, so one pytest-xdist worker per core. The folders whose every test one of those
# markers takes by its path (tests/conftest.py, tests/citus/conftest.py) are not even collected.
FAST := not (server or redis or spark or browser or model or chaos or slow)
FAST_UNCOLLECTED := tests/analytics tests/citus tests/deploy tests/loadtest
test-fast: $(STAMP) services
	$(BIN)/pytest -q -p no:cacheprovider -n 2 -m "$(FAST)" $(FAST_UNCOLLECTED:%=--ignore=%)

# Both suites start hundreds of Python processes (servers, CLIs, each pytest-xdist worker): they
# compile the project and rewrite the tests once per checkout, not once per process, whatever
# PYTHONDONTWRITEBYTECODE says outside (the bytecode goes to __pycache__/, ignored by git).
test test-fast: export PYTHONDONTWRITEBYTECODE :=

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports

bench: $(STAMP) services
	$(BIN)/python -m loadtest.bench

loadtest: $(STAMP) services
	$(BIN)/python -m loadtest.run_loadtest

# Faults on a seeded schedule against a private PostgreSQL + Redis; writes docs/reliability.md.
CHAOS_SEED ?= 7
CHAOS_DURATION ?= 300
chaos: $(STAMP)
	$(BIN)/python -m idempay_tools.chaos --duration $(CHAOS_DURATION) --seed $(CHAOS_SEED) --report docs/reliability.md

# The Postgres primary killed under a fleet: Patroni fails over to a synchronous standby,
# then the same run without synchronous replication (docs/operations.md, "High availability").
FAILOVER_DURATION ?= 120
failover: $(STAMP)
	@command -v patroni >/dev/null && command -v etcd >/dev/null || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq patroni etcd-server etcd-client >/dev/null)
	$(BIN)/python -m idempay_tools.failover --duration $(FAILOVER_DURATION) --report var/failover-report.md

verify:
	./scripts/verify.sh

# A private Citus cluster (coordinator + 2 workers on localhost) in var/citus, building and
# installing the extension the first time (docs/scaling.md, "Run here"): CITUS=stop|status|env.
.PHONY: citus
CITUS ?= start
citus:
	./scripts/citus.sh $(CITUS) var/citus

# Every image of deploy/compose.yaml without a registry (deploy/README.md, "Without a
# registry"): needs root, debootstrap and a running dockerd (DOCKER_HOST).
images: $(STAMP)
	./deploy/local/build_images.sh

# The compose stack for real: fleet through the chaos proxy with an API replica killed,
# contract §8 invariants, the audit in the Spark image, then down -v. Needs a running dockerd.
deploy-check: images
	./deploy/local/deploy_check.sh

# Both from nothing on a private dockerd (scripts/dockerd.sh), installing docker.io,
# debootstrap and docker-compose if missing; everything removed and dockerd stopped at the
# end, also on failure. The last step of `make test`, which says so when it cannot run here.
deploy-test: $(STAMP)
	./deploy/local/deploy_test.sh

clean:
	rm -rf $(VENV) var .pytest_cache .mypy_cache .ruff_cache

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: test check test-compat demo lint clean

COMPAT_VENV := .venv-compat
SOURCE_TESTS := $(addprefix tests/spark/group_source/,test_source_groups.py test_source_replay.py test_source_pins.py test_source_errors.py test_source_recovery.py)

# The default editable install puts the checkout on sys.path (see package-dir in pyproject.toml),
# so Spark's lookup of top-level pyspark_* modules finds pyspark_nats_pcg and pyspark_nats.
$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(VENV)/.test-installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e '.[test]'
	touch $@

$(VENV)/.server-installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e '.[spark,server]'
	touch $@

# The fast lane: lint, format, types and the tests marked `unit` (no nats-server, no Spark; a unit
# test that asks for either fails, see tests/conftest.py).
check: $(VENV)/.test-installed
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy nats_spark
	$(BIN)/python -m pytest -q -m unit

# The rest, after check: two workers, a test module each at a time (each worker starts its own
# nats-server and Spark sessions): the suite waits on servers and JVMs more than it computes.
test: check
	$(BIN)/python -m pytest -q -n 2 --dist loadfile -m "not unit"

demo: $(VENV)/.server-installed
	$(BIN)/python -m nats_spark.demo

# The source tests on the oldest supported Spark (4.0.x), in a venv of their own.
$(COMPAT_VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(COMPAT_VENV)
	$(COMPAT_VENV)/bin/python -m pip install -q --upgrade pip
	$(COMPAT_VENV)/bin/pip install -q -e '.[test]' 'pyspark>=4.0,<4.1'
	touch $@

test-compat: $(COMPAT_VENV)/.installed
	$(COMPAT_VENV)/bin/python -c 'import pyspark; print("pyspark", pyspark.__version__)'
	$(COMPAT_VENV)/bin/python -m pytest -q $(SOURCE_TESTS)

# Throughput, latency, commit time and memory on an embedded server; see bench/run.py --help.
.PHONY: bench
bench: $(VENV)/.test-installed
	$(BIN)/python bench/run.py $(BENCH_ARGS)

# Only the two cases users run (warm session, fresh process) and Spark's own fresh start (~15 min).
.PHONY: bench-cases
bench-cases: $(VENV)/.test-installed
	$(BIN)/python bench/run.py --cases-only $(BENCH_ARGS)

# Read throughput over key counts, both layouts, vs nats-py, with server CPU per message (~20 min).
.PHONY: bench-keys
bench-keys: $(VENV)/.test-installed
	$(BIN)/python bench/keys.py $(BENCH_ARGS)

lint: $(VENV)/.test-installed
	$(BIN)/ruff check .

clean:
	rm -rf $(VENV) build *.egg-info

# Kill sweep: ROUNDS driver kills -9 at seeded phases of a batch, Python worker kills between; a
# JSON report; fails on any lost, duplicated, unacked or out-of-key-order row. SEED= repeats one.
.PHONY: chaos chaos-soak
chaos: $(VENV)/.test-installed
	$(BIN)/python chaos/sweep.py --rounds $(or $(ROUNDS),8) $(if $(SEED),--seed $(SEED))

# Randomised soak: faults at random while publishing; fails on any lost, duplicated or unacked message.
chaos-soak: $(VENV)/.test-installed
	$(BIN)/python chaos/run.py --minutes $(or $(MINUTES),3) $(if $(SEED),--seed $(SEED))

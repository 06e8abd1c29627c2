PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: test check test-main test-compat demo lint clean

# The default editable install puts the checkout on sys.path (see package-dir in pyproject.toml),
# so Spark's lookup of top-level pyspark_* modules finds pyspark_nats_pcg and pyspark_nats.
$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(VENV)/.test-installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e '.[test]'
	touch $@

$(VENV)/.server-installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e '.[spark,server,plot]'
	touch $@

# The fast lane: lint, format, types and the tests marked `unit` (no nats-server, no Spark; a unit
# test that asks for either fails, see tests/conftest.py), on two workers that steal work from
# each other (the simulation's few long tests would otherwise end the run on one worker).
check: $(VENV)/.test-installed
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy nats_spark
	$(BIN)/python -m pytest -q -m unit -n 2 --dist worksteal

# The rest, after check, on the newest Spark, then the tests marked `compat` on the older Sparks
# users run (test-compat). Two workers, a test module each at a time (each worker starts its own
# nats-server and Spark sessions): the suite waits on servers and JVMs more than it computes.
# The compat venvs install (on a fresh clone mostly downloading and building each pyspark) while
# check and the main lane run, then their lanes run. Each venv's class archive is made beside
# other work too: the main venv's while check runs, the older Sparks' after their
# installs; a lane would otherwise start by making its own (a JVM run of ~80 CPU-s).
test: $(VENV)/.test-installed
	@$(MAKE) --no-print-directory compat-venvs > .compat-venvs.log 2>&1 & installing=$$!; \
	$(MAKE) --no-print-directory $(VENV)/.spark-classes > .spark-classes.log 2>&1 & archiving=$$!; \
	$(MAKE) --no-print-directory check; tested=$$?; \
	wait $$archiving || cat .spark-classes.log; \
	[ $$tested -eq 0 ] && $(MAKE) --no-print-directory test-main; tested=$$?; \
	wait $$installing || { cat .compat-venvs.log; exit 1; }; \
	[ $$tested -eq 0 ] && $(MAKE) --no-print-directory test-compat

test-main: $(VENV)/.test-installed
	$(BIN)/python -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder -m "not unit"

demo: $(VENV)/.server-installed
	$(BIN)/python -m nats_spark.demo

# The Sparks of Databricks 17.3 LTS (4.0) and 18 LTS (4.1), each at its newest patch release in a
# venv of its own (.venv-spark4.0, ...), with this checkout installed editable. Only the tests
# marked `compat` run there: those that start Spark (a session or a job) to check the faults,
# recovery, exactly once and the notebooks; a test without Spark runs the same code on any.
COMPAT_SPARKS := 4.0 4.1
COMPAT_RUNS := $(addprefix test-spark,$(COMPAT_SPARKS))
.PHONY: $(COMPAT_RUNS) compat-venvs

.venv-spark%/.test-installed: pyproject.toml
	$(PYTHON) -m venv .venv-spark$*
	.venv-spark$*/bin/python -m pip install -q --upgrade pip
	.venv-spark$*/bin/pip install -q -e '.[test]' 'pyspark~=$*.0'
	touch $@

test-compat: $(COMPAT_RUNS)

COMPAT_VENVS := $(addprefix .venv-spark,$(COMPAT_SPARKS))
compat-venvs: $(addsuffix /.test-installed,$(COMPAT_VENVS)) $(addsuffix /.spark-classes,$(COMPAT_VENVS))

# The class archive of a venv's pyspark that the suite's JVMs map (tests/conftest.py); a lane
# makes it itself when it is missing, so failing here only moves the work there.
%/.spark-classes: %/.test-installed
	cd tests && ../$*/bin/python -c 'from conftest import spark_class_archive; spark_class_archive()'
	touch $@

$(COMPAT_RUNS): test-spark%: .venv-spark%/.test-installed
	.venv-spark$*/bin/python -c 'import pyspark; print("pyspark", pyspark.__version__)'
	.venv-spark$*/bin/python -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder -m compat

# The two cases users run (warm session, fresh process) at N and 4N messages, 1,000 and 10,000
# keys, against a tuned nats-py loop, with CPU per message by process kind (a few minutes);
# bench-cases at issue 38's sizes (1.2M messages, ~10 min); bench-full adds the 64-key
# throughput, latency, commit time and memory (~30 min). See bench/run.py --help.
.PHONY: bench bench-cases bench-full
bench: $(VENV)/.test-installed
	$(BIN)/python bench/run.py --cases-only $(BENCH_ARGS)

bench-cases: $(VENV)/.test-installed
	$(BIN)/python bench/run.py --cases-only --issue-sizes $(BENCH_ARGS)

bench-full: $(VENV)/.test-installed
	$(BIN)/python bench/run.py $(BENCH_ARGS)

# Latency from the stored timestamp to rows in hand and to the commit, at steady rates over
# partition counts and triggers, beside a tuned nats-py loop and Spark's own floor (the full grid
# ~40 min; a quick run: BENCH_ARGS="--rates 500 --partitions 8 --triggers 0 --seconds 20").
.PHONY: bench-latency
bench-latency: $(VENV)/.test-installed
	$(BIN)/python bench/latency.py $(BENCH_ARGS)

# Read throughput over key counts, both layouts, vs nats-py, with server CPU per message (~20 min).
.PHONY: bench-keys
bench-keys: $(VENV)/.test-installed
	$(BIN)/python bench/keys.py $(BENCH_ARGS)

lint: $(VENV)/.test-installed
	$(BIN)/ruff check .

clean:
	rm -rf $(VENV) .venv-spark* build dist *.egg-info

# The ack-ledger simulation over a seed range (make test explores seeds 0-1399 of the drawn worlds and
# 0-259 of those whose executors pause, make check 0-259 and 0-39; SIMULATE_ARGS=--stalling-executors); a failing
# seed is reproduced, with its schedule, by `python -m tests.simulation --seed <n> --verbose`.
.PHONY: simulate
simulate: $(VENV)/.test-installed
	$(BIN)/python -m tests.simulation --seeds $(or $(SEEDS),0-10000) --jobs $(or $(JOBS),1) $(SIMULATE_ARGS)

# The holes the simulation found, put back one at a time (tests/simulation/mutants.py): each must
# break a guarantee in some seed of the range; prints per mutant its failing seeds and the first
# problem. MUTANTS_ARGS: e.g. --only NAME, --first 5 (stop a mutant at its first 5 failures).
.PHONY: mutants
mutants: $(VENV)/.test-installed
	$(BIN)/python -m tests.simulation.mutants --seeds $(or $(SEEDS),0-1999) --jobs $(or $(JOBS),1) $(MUTANTS_ARGS)

# Kill sweep: ROUNDS driver kills -9 at seeded phases of a batch, Python worker kills between; a
# JSON report; fails on any lost, duplicated, unacked or out-of-key-order row. SEED= repeats one.
.PHONY: chaos chaos-soak
chaos: $(VENV)/.test-installed
	$(BIN)/python chaos/sweep.py --rounds $(or $(ROUNDS),8) $(if $(SEED),--seed $(SEED))

# Randomised soak: faults at random while publishing; fails on any lost, duplicated or unacked message.
chaos-soak: $(VENV)/.test-installed
	$(BIN)/python chaos/run.py --minutes $(or $(MINUTES),3) $(if $(SEED),--seed $(SEED))

# The wheel to install elsewhere (a cluster, a Databricks Volume): $(DIST)/nats_spark-<version>-py3-none-any.whl.
DIST ?= dist
.PHONY: wheel
wheel: | $(BIN)/python
	$(BIN)/python -m pip wheel -q --no-deps -w $(DIST) .

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: test demo lint clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(VENV)/.test-installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e '.[test]'
	touch $@

$(VENV)/.server-installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e '.[server]'
	touch $@

test: $(VENV)/.test-installed
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q

demo: $(VENV)/.server-installed
	$(BIN)/python -m nats_spark.demo

lint: $(VENV)/.test-installed
	$(BIN)/ruff check .

clean:
	rm -rf $(VENV) build *.egg-info

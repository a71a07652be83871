# One obvious way to run things. Every target creates .venv when it is missing.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: all demo test lint bench bench-engine clean

all: test

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

$(STAMP): $(PY) pyproject.toml
	$(PY) -m pip install --quiet -e '.[fast,test]'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/softhca demo

test: $(STAMP)
	$(PY) -m pytest -q

lint: $(STAMP)
	$(PY) -m ruff check engine protocol server client tests

bench-engine: $(STAMP)
	$(VENV)/bin/softhca bench engine

bench: bench-engine

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .hypothesis

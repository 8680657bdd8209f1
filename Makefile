# Two commands do all the set-up on a fresh machine: `make run` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup run test test-all clean

$(STAMP): requirements.lock setup.py
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -r requirements.lock
	$(PY) -m pip install -q --disable-pip-version-check --no-deps --no-build-isolation -e .
	@touch $(STAMP)

setup: $(STAMP)

# The main job on its built-in default: distributed int8 D4PG on cartpole:balance, local Ray (about a minute).
run: setup
	$(PY) -m launch.actorq

# Default suite: reduced-size learning runs, no real-size benchmarks.
test: setup
	$(PY) -m pytest -q -m "not slow" --durations=30

# Everything, including slow fault-injection and fuzzing tests.
test-all: setup
	$(PY) -m pytest -q

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis

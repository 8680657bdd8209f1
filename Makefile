# Two commands do all the set-up on a fresh machine: `make run` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup run test test-all clean

# requirements-nodeps.lock: gymnax, which declares gymnasium<1.4 but runs on the lock's 1.4.0 (that file says why).
$(STAMP): requirements.lock requirements-nodeps.lock setup.py
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -r requirements.lock
	$(PY) -m pip install -q --disable-pip-version-check --no-deps -r requirements-nodeps.lock
	$(PY) -m pip install -q --disable-pip-version-check --no-deps --no-build-isolation -e .
	@touch $(STAMP)

setup: $(STAMP)

# The main job on its built-in default: distributed int8 D4PG on cartpole:balance, local Ray (about a minute).
run: setup
	$(PY) -m launch.actorq

# Default suite: one test of each kind at reduced size (docs/testing.md), on TEST_WORKERS processes (pytest-xdist; a
# file's tests stay in one process, so its module fixtures run once). TEST_WORKERS=0: one process.
TEST_WORKERS ?= 2
test: setup
	$(PY) -m pytest -q -m "not slow" -n $(TEST_WORKERS) --dist loadfile --durations=30

# Everything, including slow fault-injection and fuzzing tests (one process: the slow tests time full-size runs).
test-all: setup
	$(PY) -m pytest -q

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis

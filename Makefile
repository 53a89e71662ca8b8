# The two commands of the README: `make demo` and `make test`. Each creates the virtual environment
# when it is missing and installs what it needs, so both work on a fresh machine.

VENV ?= .venv
PYTHON ?= python3
# The CPU build of torch 2.13 lies on this project's machines; a bare `torch` requirement would make pip
# fetch a multi-GB CUDA build instead. Override on a GPU machine: make TORCH_SPEC='torch' demo
TORCH_SPEC ?= torch==2.13.0
PY := $(VENV)/bin/python
STAMP := $(VENV)/.tuneup-installed

.PHONY: demo test lint bench clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet "$(TORCH_SPEC)"
	$(PY) -m pip install --quiet -e ".[test]"
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/tuneup demo

# Two passes: the tests that time nothing on 2 processes (a module's tests stay on one, so its shared
# fixtures are built once), then the tests that time something alone (marked `timing`, tests/conftest.py).
test: $(STAMP)
	$(PY) -m pytest -q -m "not timing" -n 2 --dist loadfile
	$(PY) -m pytest -q -m timing

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

bench: $(STAMP)
	$(PY) benchmarks/overhead.py

clean:
	rm -rf $(VENV) build *.egg-info

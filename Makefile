# The two commands of the README: `make demo` and `make test`. Each creates the virtual environment
# when it is missing and installs what it needs, so both work on a fresh machine.

VENV ?= .venv
# The interpreter the environment is made from: Debian's python3.11 where the machine has it, else python3.
# Debian builds CPython with profile-guided and link-time optimization; pyenv's default build (this
# machine's python3) has neither, and runs pure Python about 25% slower (timeit of a dict loop: 85 us
# against 63 us). The suite, most of it Python starting Lightning and analysing runs, ran 12% faster on
# Debian's (tests/test_fuzz, test_plots, test_render_cost and test_comm: 112 s against 99 s, the same day).
# 3.11, because the CPU build of torch on this project's machines is built for it. Override: make PYTHON=...
PYTHON ?= $(firstword $(wildcard /usr/bin/python3.11) python3)
# The CPU build of torch 2.13 lies on this project's machines; a bare `torch` requirement would make pip
# fetch a multi-GB CUDA build instead. Override on a GPU machine: make TORCH_SPEC='torch' demo
TORCH_SPEC ?= torch==2.13.0
PY := $(VENV)/bin/python
STAMP := $(VENV)/.tuneup-installed

.PHONY: demo test lint bench clean

# transformers (the Hugging Face adapter's tests) is kept in $(HF_SITE), off the environment's default path:
# installed beside Lightning, every `import lightning` imports it too (torchmetrics' BERTScore checks for it
# at import), 0.6-0.9 s more in each of the hundreds of processes the tests start. tests/conftest.py puts
# $(HF_SITE) on the path of the tests that train with the Hugging Face Trainer, and of theirs alone.
HF_SITE := $(VENV)/hf-site
# The same for the `ci` extra (ruptures and SciPy, for `tuneup regressions`): with SciPy installed, every
# `import lightning` imports scipy.signal too (Lightning reads torchmetrics' version by importing it, and
# torchmetrics imports scipy.signal when SciPy is there): 1.0 s more a process (4.4 s against 3.4 s here).
# tests/conftest.py puts $(CI_SITE) on the test processes' own path, which tests/test_regressions.py needs.
# For `tuneup regressions` in this environment: PYTHONPATH=.venv/ci-site
CI_SITE := $(VENV)/ci-site

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet "$(TORCH_SPEC)"
	$(PY) -m pip install --quiet -e ".[test,huggingface]"
	$(PY) -m pip install --quiet --no-deps --upgrade --target $(HF_SITE) \
		"transformers==$$($(PY) -c 'from importlib.metadata import version; print(version("transformers"))')"
	$(PY) -m pip uninstall --quiet --yes transformers
	$(PY) -m pip install --quiet --no-deps --upgrade --target $(CI_SITE) \
		$$($(PY) -c 'from importlib.metadata import version; print(*(f"{p}=={version(p)}" for p in ("scipy", "ruptures")))')
	$(PY) -m pip uninstall --quiet --yes ruptures scipy
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/tuneup demo

# Two passes: the tests that time nothing on 2 processes (a module's tests stay on one, so its shared
# fixtures are built once; the longest modules are handed out first, tests/conftest.py's LONGEST_FIRST),
# then the tests that time something alone (marked `timing`, tests/conftest.py).
# The environment may forbid writing bytecode (PYTHONDONTWRITEBYTECODE=1 here): each of the tests' processes
# would then compile tuneup's modules anew (about 0.15 s a process), and pytest would rewrite the asserts of
# every test module in each of its three processes (4.5 s of each 13 s collection). The tests write it:
# tuneup's compiled once by compileall, the test modules' by pytest into __pycache__ (git ignores both).
test: $(STAMP)
	$(PY) -m compileall -q tuneup plugins > /dev/null
	PYTHONDONTWRITEBYTECODE= $(PY) -m pytest -q -m "not timing" -n 2 --dist loadfile --no-loadscope-reorder
	PYTHONDONTWRITEBYTECODE= $(PY) -m pytest -q -m timing

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

bench: $(STAMP)
	$(PY) benchmarks/overhead.py

clean:
	rm -rf $(VENV) build *.egg-info

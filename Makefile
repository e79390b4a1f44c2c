# Two commands for a newcomer on a fresh machine:
#   make quickstart   set up .venv and run the main job on MorcaTiny-v0
#   make test         set up .venv and run the test suite
# and, for maintainers, `make mutate`: mutation testing of the result-critical modules (slow, not in CI)
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: quickstart test test-slow bench mutate clean-venv

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# torch/torchvision pinned to the builds this project is tested with (CUDA build, runs on CPU too)
	$(PY) -m pip install --quiet torch==2.14.1 torchvision==0.29.1
	$(PY) -m pip install --quiet -e ".[dev]"
	touch $(STAMP)

quickstart: $(STAMP)
	$(PY) scripts/quickstart.py $(ARGS)

test: $(STAMP)
	$(PY) -m pytest -q $(ARGS)

test-slow: $(STAMP)
	$(PY) -m pytest -q -m slow $(ARGS)

# mutmut on the modules listed in [tool.mutmut] of pyproject.toml, one worker, lowest priority;
# results are kept in mutants/ (a rerun only retests what changed); `$(VENV)/bin/mutmut browse` to inspect
mutate: $(STAMP)
	$(PY) -m pip install --quiet "mutmut>=3.8,<4"
	OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 nice -n 19 $(VENV)/bin/mutmut run --max-children 1
	$(VENV)/bin/mutmut results
	$(PY) scripts/mutation_score.py

bench: $(STAMP)
	for b in benchmarks/*.py; do $(PY) $$b || exit 1; done

clean-venv:
	rm -rf $(VENV)

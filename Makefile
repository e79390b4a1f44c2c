# Two commands for a newcomer on a fresh machine:
#   make quickstart   set up .venv and run the main job on MorcaTiny-v0
#   make test         set up .venv and run the test suite
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: quickstart test test-slow bench clean-venv

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

bench: $(STAMP)
	for b in benchmarks/*.py; do $(PY) $$b || exit 1; done

clean-venv:
	rm -rf $(VENV)

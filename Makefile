# Two commands for a newcomer on a fresh machine:
#   make quickstart   set up .venv and run the main job on MorcaTiny-v0
#   make test         set up .venv and run the test suite
# and, for maintainers, `make mutate`: mutation testing of the result-critical modules (slow, not in CI)
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

CORE_VENV ?= .venv-core
CORE_PY := $(CORE_VENV)/bin/python

.PHONY: quickstart test test-slow test-core docs bench mutate leaderboard clean-venv

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# torch/torchvision pinned to the builds this project is tested with (CUDA build, runs on CPU too)
	$(PY) -m pip install --quiet torch==2.14.1 torchvision==0.29.1
	# everything: the core and every extra (agents, sb3, lpips, ray, benchmark); `pip install .` alone is the core
	$(PY) -m pip install --quiet -e ".[all,dev]"
	touch $(STAMP)

quickstart: $(STAMP)
	$(VENV)/bin/morca quickstart $(ARGS)

test: $(STAMP)
	$(PY) -m pytest -q $(ARGS)

# the leaderboard, continued from its run records in leaderboard/tiny (about 12 h on 2 cores, so it is made over many
# sessions: a rerun runs only what is missing; its progress page is leaderboard/tiny/leaderboard.md); the datasets are
# collected only where this machine has fewer than the board's 400 episodes
BOARD := --out leaderboard/tiny --updates 8000 --online-episodes 192 --curve-points 4
leaderboard: $(STAMP)
	for recipe in random-v0 anchored-v2; do \
	  $(PY) -c "import sys; from morca_env.data.integrity import load_dataset; \
	    sys.exit(load_dataset('morca/tiny/$$recipe').total_episodes < 400)" 2>/dev/null \
	  || $(VENV)/bin/morca collect morca/tiny/$$recipe --episodes 400 || exit 1; \
	done
	$(VENV)/bin/morca leaderboard $(BOARD) $(ARGS)

# the documentation site (mkdocs-material, mkdocstrings from the docstrings) into site/; fails on any warning
docs: $(STAMP)
	$(PY) -m pip install --quiet -e ".[docs]"
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict --quiet -d site

# the core install alone on the newest gymnasium 1.x, beside torchrl, tianshou and stable-baselines3 / sb3-contrib
# (no d3rlpy: it pins gymnasium 1.0; no lpips)
$(CORE_VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(CORE_VENV)
	$(CORE_PY) -m pip install --quiet --upgrade pip
	$(CORE_PY) -m pip install --quiet torch==2.14.1
	$(CORE_PY) -m pip install --quiet -e ".[dev,sb3]" "gymnasium>=1.1,<2" torchrl tianshou
	touch $(CORE_VENV)/.installed

test-core: $(CORE_VENV)/.installed
	MORCA_CORE_ONLY=1 $(CORE_PY) -m pytest -q -m "core and not slow" tests $(ARGS)  # the studies need the full install

test-slow: $(STAMP)
	$(PY) -m pytest -q -m slow $(ARGS)

# mutmut on the modules listed in [tool.mutmut] of pyproject.toml, one worker, lowest priority;
# results are kept in mutants/ (a rerun only retests what changed); `$(VENV)/bin/mutmut browse` to inspect
mutate: $(STAMP)
	$(PY) -m pip install --quiet "mutmut>=3.8,<4"
	OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 nice -n 19 $(VENV)/bin/mutmut run --max-children 1
	$(VENV)/bin/mutmut results
	$(PY) research/mutation_testing/mutation_score.py

bench: $(STAMP)
	for b in benchmarks/*.py; do $(PY) $$b || exit 1; done

clean-venv:
	rm -rf $(VENV) $(CORE_VENV)

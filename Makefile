# Every target sets itself up from nothing: it creates .venv and installs what it
# needs, re-installing only when pyproject.toml changes.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# numba's compiled kernels, shared by every target (`make clean` removes them).
export NUMBA_CACHE_DIR ?= $(CURDIR)/.cache/numba

.PHONY: demo test fuzz bench lint clean install calibrate holdout bytecode

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[dev,ray]'
	@# Compile the knapsack kernels now (about 10 s), so a first search shows its own speed.
	$(BIN)/python -c "from ndplan.core.kernels.knapsack import warm_engine; warm_engine()"
	touch $(STAMP)

# Byte-compile the package, as pip does for a regular install: an editable install
# leaves src/ as source, and where PYTHONDONTWRITEBYTECODE is set every command would
# compile its modules again (about 0.2 s of its start-up). Only changed files recompile.
bytecode: $(STAMP)
	$(BIN)/python -m compileall -q src

install: bytecode

demo: bytecode
	$(BIN)/ndplan demo

# One pytest worker per core; whole files go to one worker, so a file's module-scoped
# fixtures (a local Ray instance, an installed test plugin) are set up once.
TEST_WORKERS ?= auto
test: bytecode
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile

# The property suites on fresh random examples (`make test` draws the same ones every
# run); FUZZ_RUNS runs, each on a new seed.
FUZZ_RUNS ?= 4
FUZZ_TESTS = $(shell grep -l '^from hypothesis' tests/unit/*.py)
fuzz: $(STAMP)
	for run in $$(seq $(FUZZ_RUNS)); do \
		$(BIN)/python -m pytest -q -p no:cacheprovider --hypothesis-profile explore \
			$(FUZZ_TESTS) || exit 1; \
	done

bench: bytecode
	$(BIN)/python -m benchmarks.run

# Refit the shipped calibration on the even-row_id measured runs (the odd ones are
# the test split reported by `make bench`).
calibrate: $(STAMP)
	$(BIN)/python -m benchmarks.calibrate

# Leave-one-source-out: fit on every other source's even rows, price the one left out
# (one fit per source, on every core; about 45 minutes on two). Writes docs/holdout.md.
holdout: bytecode
	$(BIN)/python -m benchmarks.holdout

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

clean:
	rm -rf $(VENV) build dist .cache *.egg-info src/*.egg-info .pytest_cache
	find src -name __pycache__ -prune -exec rm -rf {} +

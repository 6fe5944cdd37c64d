# The two commands of the README. Both set up .venv on first use.
.PHONY: run test lint

ARGS ?=

run:
	@bash scripts/bootstrap.sh
	@.venv/bin/kvdeck $(ARGS)

test:
	@bash scripts/bootstrap.sh test
	@.venv/bin/python -m ruff check .
	@bash scripts/lint_imports.sh
	@.venv/bin/python -m pytest -q --timeout=600 -n 2 --dist loadfile --no-loadscope-reorder

lint:
	@bash scripts/bootstrap.sh test
	@.venv/bin/python -m ruff check .
	@bash scripts/lint_imports.sh

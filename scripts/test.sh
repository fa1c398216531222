#!/usr/bin/env bash
# Install everything and run the checks and the test suite (real BPF: needs root).
# Extra arguments go to pytest, e.g. scripts/test.sh -k check -x
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check refcntd tests benchmarks
.venv/bin/lint-imports --no-cache
.venv/bin/mypy  # --strict on the package: [tool.mypy] in pyproject.toml
.venv/bin/python -m refcntd.kernel.abigen --check \
    || { echo "refcntd/kernel/abi.py is stale: python -m refcntd.kernel.abigen" >&2; exit 1; }
# tests/unit (no root) and tests/bpf (real kernel), in one process by default: the whole
# suite has not yet finished once on several pytest-xdist workers (2026-12-03, a machine at
# load 20-47: benchmarks/results/suite.md), so CI keeps the way that passed.
# REFCNTD_TEST_WORKERS=N runs it on N workers; tests marked `serial` (the machine's global
# BPF and pid state) then run alone (tests/conftest.py).
.venv/bin/python -m pytest -ra -n "${REFCNTD_TEST_WORKERS:-0}" --dist loadgroup "$@"

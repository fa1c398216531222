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
# tests/unit (no root) and tests/bpf (real kernel) on 2 pytest-xdist workers: the suite
# mostly waits on the kernel (tracepoint unregistration, the verifier at each refcntd
# start), so two workers on this 2-CPU machine took 16 min (1284 tests, load 2; 26 at
# load 3-7) where one process took 37 (benchmarks/results/suite.md).  Tests marked `serial` (the machine's global BPF and pid
# state) run alone (tests/conftest.py).  REFCNTD_TEST_WORKERS=N sets the workers; 0 runs
# the suite in one process.
.venv/bin/python -m pytest -ra -n "${REFCNTD_TEST_WORKERS:-2}" --dist loadgroup "$@"

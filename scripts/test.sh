#!/usr/bin/env bash
# Install everything and run the test suite (real BPF: needs root).
# Extra arguments go to pytest, e.g. scripts/test.sh -k check -x
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check refcntd tests
.venv/bin/python -m pytest -ra "$@"

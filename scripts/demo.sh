#!/usr/bin/env bash
# Install everything, build the bundled perf-like example and run it under
# refcntd: the report names the leaked objects and where they were allocated.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
make -s -C examples
echo "+ refcntd check --binary examples/build/perflike"
.venv/bin/refcntd check --binary examples/build/perflike
echo
echo "+ refcntd run -- examples/build/perflike"
status=0
.venv/bin/refcntd run --json examples/build/perflike-report.json -- examples/build/perflike \
    || status=$?
echo "refcntd exit status: $status (23 = leaks found, as expected for this example)"
[ "$status" = 23 ]

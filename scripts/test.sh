#!/usr/bin/env bash
# The README's test command: lint, build the test cluster (cached), run every test.
set -uo pipefail
cd "$(dirname "$0")/.."
uv run --no-sync ruff check . || exit 1
uv run --no-sync mypy || exit 1
bash tests/cluster/build.sh >/dev/null || exit 1
# Kueue's controller (cached by version): tests/e2e/test_kueue.py starts it on the test cluster.
bash tests/cluster/build-kueue.sh >/dev/null || exit 1
# The S3 server (versitygw, cached by version): the `s3_server` fixture starts it beside the cluster.
bash tests/cluster/build-s3.sh >/dev/null || exit 1
bash scripts/install-prometheus.sh || exit 1
# Parallel workers (pytest-xdist) share the one test cluster. A test module whose tests share
# a module-scoped fixture or build on each other marks itself xdist_group and runs whole on one
# worker; every other test goes to whichever worker is free. More workers than cores: much of an
# integration test is waiting on the cluster. MPJOB_TEST_WORKERS=0 runs them in this process.
uv run --no-sync pytest -n "${MPJOB_TEST_WORKERS:-3}" --dist loadgroup "$@"
rc=$?
if [[ $rc -eq 5 ]]; then
  echo "test: pytest collected no tests" >&2
  exit 1
fi
exit $rc

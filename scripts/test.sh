#!/usr/bin/env bash
# The README's test command: lint, build the test cluster (cached), run every test.
set -uo pipefail
cd "$(dirname "$0")/.."
# The tests are collected once beside mypy (it keeps one core busy, this takes the other): pytest
# writes each test module with its asserts rewritten to __pycache__, and the parallel workers
# below then import them ready instead of each rewriting all of them (5 s of CPU a worker).
MPJOB_KEEP_CLUSTER=1 uv run --no-sync pytest --collect-only -q -p no:cacheprovider >/dev/null 2>&1 &
collected=$!
uv run --no-sync ruff check . || exit 1
uv run --no-sync mypy || exit 1
wait "$collected"
bash tests/cluster/build.sh >/dev/null || exit 1
# Kueue's controller (cached by version): tests/e2e/test_kueue.py starts it on the test cluster.
bash tests/cluster/build-kueue.sh >/dev/null || exit 1
# The S3 server (versitygw, cached by version): the `s3_server` fixture starts it beside the cluster.
bash tests/cluster/build-s3.sh >/dev/null || exit 1
bash scripts/install-prometheus.sh || exit 1
# The e2e suite runs in a process of its own beside the rest: its modules install Helm releases
# that share cluster-wide names, so they go one at a time. The other tests spread over parallel
# workers (pytest-xdist), a test file to a worker (module-scoped fixtures are made once).
# Both share one test cluster: started here when it is not running (unless $KUBECONFIG names
# another cluster), stopped at the end if it was not, or kept with MPJOB_KEEP_CLUSTER=1.
was_running=1
if [[ -z "${KUBECONFIG:-}" ]]; then
  uv run --no-sync python -m tests.cluster status >/dev/null 2>&1 || was_running=0
  uv run --no-sync python -m tests.cluster up >/dev/null || exit 1
fi
e2e_log="$(mktemp)"
# Without paths it collects tests/e2e only (every e2e test is there): importing the whole suite
# to deselect it cost this process 15-17 s of CPU.
e2e_paths=("$@")
[[ $# -eq 0 ]] && e2e_paths=(tests/e2e)
rm -f .test-report.xml .test-report-e2e.xml
MPJOB_KEEP_CLUSTER=1 uv run --no-sync pytest -m e2e --junitxml=.test-report-e2e.xml "${e2e_paths[@]}" >"$e2e_log" 2>&1 &
e2e_pid=$!
# Files go to the workers slowest first (tests/durations.json; the root conftest orders them),
# and each test's time lands in .test-report.xml: `python scripts/test_durations.py
# .test-report.xml` refreshes the table when files grow or new slow ones appear.
rest_log="$(mktemp)"
MPJOB_KEEP_CLUSTER=1 uv run --no-sync pytest -n "${MPJOB_TEST_WORKERS:-4}" --dist loadfile --no-loadscope-reorder \
  --junitxml=.test-report.xml -m "not e2e" "$@" | tee "$rest_log"
rest=${PIPESTATUS[0]}
wait "$e2e_pid"
e2e=$?
echo "=== e2e (tests/e2e, one process beside the workers) ==="
cat "$e2e_log"
# The last lines are what a CI page shows: name every test that failed or errored there.
if grep -qhE '^(FAILED|ERROR) ' "$rest_log" "$e2e_log"; then
  echo "=== tests that failed or errored (their output is above) ==="
  grep -hE '^(FAILED|ERROR) ' "$rest_log" "$e2e_log"
  echo "=== where each stopped (the last frames of its traceback) ==="
  uv run --no-sync python scripts/failures.py .test-report.xml .test-report-e2e.xml
fi
rm -f "$e2e_log" "$rest_log"
if [[ $was_running -eq 0 && -z "${MPJOB_KEEP_CLUSTER:-}" ]]; then
  uv run --no-sync python -m tests.cluster down >/dev/null
fi
# A path given as an argument may hold no test of one part: pytest says 5 (nothing collected).
if [[ $rest -eq 5 && $e2e -eq 5 ]]; then
  echo "test: pytest collected no tests" >&2
  exit 1
fi
for rc in $rest $e2e; do
  [[ $rc -ne 0 && $rc -ne 5 ]] && exit "$rc"
done
exit 0

"""A startup of the operator that fails once its Controller is assembled stops that Controller:
kopf runs no cleanup for a startup that failed, and retries it, so the retry's Controller would
otherwise run beside the first one's watches and workers (two caches, two work queues
reconciling the same jobs)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.unit.operator.fake_apiserver import NAMESPACE, HalfCluster, serve

pytestmark = pytest.mark.unit

#: kopf's startup handler run as kopf runs it, twice: the first time the cache's second watch
#: cannot start (a thread the process cannot start: RLIMIT_NPROC, memory), the second time, kopf's
#: retry, it starts and waits for the first listing, which the fake API server refuses (403) until
#: the startup is cancelled. It prints, as JSON, what each run left running.
STARTS_TWICE = """
import asyncio, json, sys, threading, time
import kopf
from mpjob.controller import handlers, watch
from mpjob.controller.config import OperatorConfig
started = watch.ListWatch.start
def second_fails(self):
    if sum(t.name.startswith("mpjob-watch-") for t in threading.enumerate()) == 1:
        raise RuntimeError("can't start new thread")
    started(self)
def ours():
    return sorted(t.name for t in threading.enumerate() if t.name.startswith("mpjob-"))
def settled(until, within=30.0):
    deadline = time.monotonic() + within
    while not until(ours()) and time.monotonic() < deadline:
        time.sleep(0.05)
    return ours()
async def main():
    memo = kopf.Memo(config=OperatorConfig(namespaces=(sys.argv[1],), workers=2))
    watch.ListWatch.start = second_fails
    try:
        await handlers.configure(settings=kopf.OperatorSettings(), watched_jobs={}, finished_jobs={}, memo=memo)
        failed = None
    except RuntimeError as exc:
        failed = str(exc)
    after_failure = await asyncio.to_thread(settled, lambda names: not names)
    kept = "controller" in memo
    watch.ListWatch.start = started
    again = handlers.configure(settings=kopf.OperatorSettings(), watched_jobs={}, finished_jobs={}, memo=memo)
    retry = asyncio.create_task(again)
    retried = await asyncio.to_thread(settled, lambda names: sum(n.startswith("mpjob-watch-") for n in names) == 3)
    retry.cancel()
    await asyncio.gather(retry, return_exceptions=True)
    after_cancel = await asyncio.to_thread(settled, lambda names: not names)
    print(json.dumps({"failed": failed, "kept": kept, "after_failure": after_failure, "retried": retried,
                      "after_cancel": after_cancel}), flush=True)
asyncio.run(main())
"""


def test_a_startup_that_fails_after_the_controller_is_assembled_stops_it_before_kopf_retries(tmp_path: Path) -> None:
    with serve(HalfCluster(), tmp_path) as kubeconfig:
        env = {"PATH": "/usr/bin:/bin", "KUBECONFIG": str(kubeconfig), "PYTHONPATH": os.environ.get("PYTHONPATH", "")}
        done = subprocess.run(
            [sys.executable, "-c", STARTS_TWICE, NAMESPACE],
            env=env, capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
    assert done.returncode == 0 and done.stdout, done.stderr[-3000:]
    seen = json.loads(done.stdout.splitlines()[-1])
    assert seen["failed"] == "can't start new thread", seen
    # The first Controller's watch and workers are stopped, and kopf's memo no longer names it.
    assert (seen["after_failure"], seen["kept"]) == ([], False), seen
    # kopf's retry runs one Controller: its three watches and one queue's workers, none of the first's.
    watches = [f"mpjob-watch-{kind}-{NAMESPACE}" for kind in ("events", "jobs", "pods")]
    assert seen["retried"] == sorted([*watches, "mpjob-work-0", "mpjob-work-1", "mpjob-work-retry"]), seen
    assert seen["after_cancel"] == [], seen

"""A stop ends the operator's own threads before the process does: a thread of ours still running
Python while the interpreter finalizes can abort it (SIGABRT on Python 3.11: it is ended with
pthread_exit as it next takes the GIL, which aborts in native frames or while it holds stderr's
lock). The cache's watches and the queue's workers are stopped and joined; a watch in a request
the API server never answers is named, and stays blocked in its socket until the process ends."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
from collections.abc import Hashable
from pathlib import Path

import pytest
from kubernetes import client, config

from mpjob.controller.cache import ChildCache
from mpjob.controller.workqueue import WorkQueue
from tests.helpers import wait_for
from tests.unit.operator.fake_apiserver import NAMESPACE, HalfCluster, serve

pytestmark = pytest.mark.unit

JOBS = f"/apis/batch/v1/namespaces/{NAMESPACE}/jobs"
PODS = f"/api/v1/namespaces/{NAMESPACE}/pods"
EVENTS = f"/api/v1/namespaces/{NAMESPACE}/events"


def configuration_of(kubeconfig: Path) -> client.Configuration:
    """The client configuration of the fake API server the kubeconfig names."""
    configuration = client.Configuration()
    config.load_kube_config(config_file=str(kubeconfig), client_configuration=configuration)
    return configuration


def test_a_stopped_cache_has_ended_every_watch_but_the_one_the_server_never_answers(tmp_path: Path) -> None:
    cluster = HalfCluster(hang=JOBS)  # jobs: never answered; pods and events: 403, retried with backoff
    with serve(cluster, tmp_path) as kubeconfig:
        api = client.ApiClient(configuration_of(kubeconfig))
        cache = ChildCache(changed=lambda key: None)
        cache.start([NAMESPACE], client.BatchV1Api(api), client.CoreV1Api(api))
        wait_for(lambda: all(cluster.requests(p) for p in (JOBS, PODS, EVENTS)), 60, message="every listing")
        assert cache.stop(timeout=3) == [f"mpjob-watch-jobs-{NAMESPACE}"]
        cluster.released.set()


def test_a_closed_queue_has_ended_its_idle_workers_and_names_a_busy_one() -> None:
    busy, release = threading.Event(), threading.Event()

    def handle(key: Hashable, tick: bool) -> None:
        busy.set()
        release.wait(60)

    queue = WorkQueue(handle, workers=3, name="w")
    queue.add("slow")
    wait_for(busy.is_set, 60, 0.01, "the key handled")
    still = queue.close(timeout=1)
    assert len(still) == 1 and still[0] in ("w-0", "w-1", "w-2"), still
    release.set()
    assert queue.close(timeout=30) == []


#: A process as `mpjob operator` is before kopf's signal handlers are in place: the pre-kopf stop
#: installed, kopf's event loop running, a thread blocked in a request that is never answered
#: (non-daemon here, so that a stop that finalizes the interpreter waits for it, as surely as the
#: daemon watches abort it only sometimes) and a thread logging as the cache's retries do.
BEFORE_KOPF = """
import asyncio, logging, threading
from mpjob.controller import main
main.configure_logging(verbose=False)
main.stop_on_signals()
threading.Thread(target=threading.Event().wait, name="unanswered").start()
def retries():
    while True:
        logging.getLogger("mpjob.operator.cache").warning("listing jobs: 403 Forbidden; retrying")
threading.Thread(target=retries, daemon=True).start()
async def startup():
    print("started", flush=True)
    while True:
        await asyncio.sleep(0.01)
asyncio.run(startup())
"""


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_stop_before_kopf_runs_ends_the_process_at_once_whatever_its_threads_do(tmp_path: Path, signum: int) -> None:
    log = tmp_path / "operator.log"  # a file, as a container's log: a pipe nobody reads would fill and block
    with log.open("w") as err:
        child = subprocess.Popen([sys.executable, "-c", BEFORE_KOPF], stdout=subprocess.PIPE, stderr=err, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline() == "started\n"
        child.send_signal(signum)
        code = child.wait(timeout=20)
    finally:
        child.kill()
    said = log.read_text(errors="replace")
    assert code == 0, said[-2000:]
    assert f"{signal.Signals(signum).name} received before the operator started: stopping" in said
    assert "Traceback" not in said and "Logging error" not in said


#: The pre-kopf stop installed, then nothing but waiting for a signal.
WAITING = """
import signal
from mpjob.controller import main
main.stop_on_signals()
print("started", flush=True)
while True:
    signal.pause()
"""


def test_a_stop_before_kopf_runs_ends_the_process_when_its_line_cannot_be_written() -> None:
    """stderr a pipe whose reader is gone (a log collector restarted): writing the line raised
    BrokenPipeError from the handler where the main thread stood, and the process went on, or died
    of the traceback, but never took its clean exit."""
    child = subprocess.Popen([sys.executable, "-c", WAITING], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stderr is not None
        assert child.stdout.readline() == "started\n"
        child.stderr.close()  # the reader is gone: the child's write to stderr fails with EPIPE
        child.send_signal(signal.SIGTERM)
        assert child.wait(timeout=20) == 0
    finally:
        child.kill()

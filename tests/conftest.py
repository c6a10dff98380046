"""Shared fixtures. Integration and e2e tests get a real kube-apiserver: the cluster named by
$KUBECONFIG when set, else a running `make cluster`, else one started for the session."""

from __future__ import annotations

import contextlib
import json
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client, config
from kubernetes.client.rest import ApiException

from mpjob_contract.environment import SCRATCH_ENV
from tests.cluster.controlplane import Layout, down, exclusive, running, start_kueue, start_s3, up
from tests.cluster.s3 import S3Server
from tests.helpers import Meeting, build_cache, rendezvous

REPO = Path(__file__).resolve().parents[1]

# One math thread per process: the suite runs tests and their trainer processes side by side,
# and torch's idle OpenMP threads spinning beside them take cores from the work that is left.
# Set before anything imports torch; the processes tests start (trainers, operators, the test
# cluster's node agent and so its pods) inherit it.
os.environ.setdefault("OMP_NUM_THREADS", "1")
# The kernels torch.compile builds are kept beside the test cluster's builds (the same cache
# root as tests/cluster/build.sh), not in /tmp: a fresh clone on a machine with a warm build
# cache compiles from cache (a cold compile of the bench's tiny model is ~10 s a precision).
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(build_cache() / "inductor"))
# The wait before an attempt that retries a failure (mpjob.planning.backoff: 10 s, doubled per
# failure in a row) shortened for the operators and `mpjob run`s tests start: a test of a retried
# failure then waits a fraction of a second; the tests of the wait itself set their own.
os.environ.setdefault("MPJOB_ATTEMPT_BACKOFF_SECONDS", "0.2")


#: Seconds each test file took in a recent whole run (scripts/test_durations.py refreshes it).
DURATIONS = REPO / "tests" / "durations.json"


def slowest_files_first(items: list[pytest.Item]) -> list[pytest.Item]:
    """The items with the slowest test files first (a file's tests stay together and in order).
    Parallel workers take files from the front as they free up (scripts/test.sh passes
    --no-loadscope-reorder), so the long files start early and the short ones fill the end,
    instead of one worker finishing a long file alone. A file the table lacks counts as fast."""
    seconds: dict[str, float] = json.loads(DURATIONS.read_text()) if DURATIONS.exists() else {}
    first_seen: dict[str, int] = {}
    for index, item in enumerate(items):
        first_seen.setdefault(item.nodeid.split("::")[0], index)

    def key(pair: tuple[int, pytest.Item]) -> tuple[float, int, int]:
        path = pair[1].nodeid.split("::")[0]
        return (-seconds.get(path, 0.0), first_seen[path], pair[0])

    return [item for _, item in sorted(enumerate(items), key=key)]


def pytest_configure(config: pytest.Config) -> None:
    """The process that starts parallel workers (pytest-xdist), before it starts them: one
    warm-start server of each kind serves them all (tests/warm)."""
    workers = config.getoption("numprocesses", default=None)
    if not _worker(config) and isinstance(workers, int) and workers > 1:
        from tests import warm

        warm.share_with_workers()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _worker(config):
        items[:] = slowest_files_first(items)
    for item in items:
        if "gpu" in item.keywords:
            try:
                import torch

                has_cuda = torch.cuda.is_available()
            except ImportError:
                has_cuda = False
            if not has_cuda:
                item.add_marker(pytest.mark.skip(reason="needs CUDA"))


CLUSTER_WAS_RUNNING = pytest.StashKey[bool]()


def _worker(config: pytest.Config) -> bool:
    """Whether this process is one of several parallel test workers (pytest-xdist)."""
    return hasattr(config, "workerinput")


def pytest_sessionstart(session: pytest.Session) -> None:
    """The one process that outlives every worker notes whether a test cluster was running
    before the tests: the tests start it when they need it, and it stops it at the end if not."""
    if not _worker(session.config) and not os.environ.get("KUBECONFIG"):
        session.config.stash[CLUSTER_WAS_RUNNING] = bool(running(Layout.from_env()))


def pytest_sessionfinish(session: pytest.Session) -> None:
    was_running = session.config.stash.get(CLUSTER_WAS_RUNNING, True)
    if not _worker(session.config) and not was_running and not os.environ.get("MPJOB_KEEP_CLUSTER"):
        down(Layout.from_env())


@pytest.fixture(scope="session", autouse=True)
def trainer_scratch(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The trainers' scratch folder (SCRATCH_ENV: a bucket store's spool, a profile's) for the
    session, as a pod names its own: not /tmp, where what the trainers tests kill left stayed.
    The processes tests start inherit it; pytest keeps the last few sessions' folders only."""
    with pytest.MonkeyPatch.context() as patch:
        folder = tmp_path_factory.mktemp("scratch")
        patch.setenv(SCRATCH_ENV, str(folder))
        yield folder


@pytest.fixture
def meeting() -> Iterator[Meeting]:
    """Where the ranks a test starts and leaves running meet (tests.helpers.rendezvous): each
    call a store of its own, served until the test ends."""
    with contextlib.ExitStack() as stores:
        yield lambda world: stores.enter_context(rendezvous(world))


@pytest.fixture(scope="session")
def kubeconfig() -> str:
    """Path of a kubeconfig for a real cluster: $KUBECONFIG's, or the test cluster's, started
    by the first worker that needs it and shared by all of them."""
    if os.environ.get("KUBECONFIG"):
        return os.environ["KUBECONFIG"]
    layout = Layout.from_env()
    with exclusive(layout):
        up(layout)  # reuses a running, ready cluster
    return str(layout.kubeconfig)


@pytest.fixture(scope="session")
def s3_server() -> S3Server:
    """The test cluster's S3 server (versitygw), started when it is not running yet: it needs
    no control plane, so store tests use it without one (it stops with the cluster)."""
    layout = Layout.from_env()
    with exclusive(layout):
        return start_s3(layout)


@pytest.fixture(scope="session")
def api_client(kubeconfig: str) -> client.ApiClient:
    return config.new_client_from_config(kubeconfig)


@pytest.fixture(scope="session")
def core(api_client: client.ApiClient) -> client.CoreV1Api:
    return client.CoreV1Api(api_client)


@pytest.fixture(scope="session")
def batch(api_client: client.ApiClient) -> client.BatchV1Api:
    return client.BatchV1Api(api_client)


@pytest.fixture(scope="session")
def cluster_bin() -> Path:
    """Directory with kubectl and helm built for the test cluster."""
    from tests.cluster.controlplane import binaries

    return binaries()


@pytest.fixture
def namespace(core: client.CoreV1Api) -> Iterator[str]:
    name = f"t-{uuid.uuid4().hex[:8]}"
    core.create_namespace({"metadata": {"name": name, "labels": {"mpjob.dev/test": "true"}}})
    yield name
    core.delete_namespace(name, propagation_policy="Background")


@pytest.fixture(scope="module")
def kueue(api_client: client.ApiClient) -> None:
    """Kueue's controller on the test cluster (started once, by version); against a cluster
    named by $KUBECONFIG it must be installed there, else the module's tests are skipped."""
    if not os.environ.get("KUBECONFIG"):
        layout = Layout.from_env()
        with exclusive(layout):
            start_kueue(layout)
    try:
        client.ApiextensionsV1Api(api_client).read_custom_resource_definition("workloads.kueue.x-k8s.io")
    except ApiException as exc:
        pytest.skip(f"Kueue is not installed on this cluster ({exc.status})")

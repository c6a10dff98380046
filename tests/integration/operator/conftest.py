"""An operator process per test namespace, and helpers to drive MixedPrecisionJobs."""

from __future__ import annotations

import contextlib
import copy
import fcntl
import json
import os
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from mpjob_contract import api
from tests import warm
from tests.helpers import paced, process_state, wait_for

REPO = Path(__file__).resolve().parents[3]
CRD = REPO / "crds" / "mixedprecisionjobs.mpjob.dev.yaml"


@contextlib.contextmanager
def crd_lock(kubeconfig: str) -> Iterator[None]:
    """One CRD writer at a time across the test workers. A test that installs a CRD of its own for
    a while (test_hostile_documents' free-form one) holds it throughout, so that a worker whose
    first test starts meanwhile does not put the shipped CRD back under it."""
    with open(Path(kubeconfig).parent / "crd.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def install_crd(api_client: client.ApiClient, body: dict[str, Any]) -> None:
    """Replace the installed CRD with `body`."""
    ext = client.ApiextensionsV1Api(api_client)
    current = ext.read_custom_resource_definition(body["metadata"]["name"])
    body = copy.deepcopy(body)
    body["metadata"]["resourceVersion"] = current.metadata.resource_version
    ext.replace_custom_resource_definition(body["metadata"]["name"], body)


@contextlib.contextmanager
def another_crd(
    api_client: client.ApiClient, kubeconfig: str, change: Callable[[dict[str, Any]], None]
) -> Iterator[None]:
    """The shipped CRD as `change` makes it (given its version's openAPIV3Schema) while the block
    runs, the shipped one again after. Objects stored meanwhile stay as they are. The CRD lock is
    held throughout: another worker's first test once installed the shipped CRD in between."""
    shipped = yaml.safe_load(CRD.read_text())
    other = copy.deepcopy(shipped)
    change(other["spec"]["versions"][0]["schema"]["openAPIV3Schema"])
    with crd_lock(kubeconfig):
        install_crd(api_client, other)
        try:
            yield
        finally:
            install_crd(api_client, shipped)


@pytest.fixture(scope="session")
def crd_installed(api_client: client.ApiClient, kubeconfig: str) -> None:
    with crd_lock(kubeconfig):
        install_shipped_crd(api_client)


@pytest.fixture
def shipped_crd(crd_installed: None, kubeconfig: str) -> Iterator[None]:
    """For a test of what the shipped CRD refuses: no other CRD (test_hostile_documents' free-form
    one) is installed while it runs, on any worker."""
    with crd_lock(kubeconfig):
        yield


def install_shipped_crd(api_client: client.ApiClient) -> None:
    ext = client.ApiextensionsV1Api(api_client)
    body = yaml.safe_load(CRD.read_text())

    def installed() -> bool:
        """This checkout's CRD is on the cluster. Parallel workers install it at once: the
        write that loses (a 409 on create or on replace) reads and writes again."""
        try:
            current = ext.read_custom_resource_definition(body["metadata"]["name"])
            body["metadata"]["resourceVersion"] = current.metadata.resource_version
            ext.replace_custom_resource_definition(body["metadata"]["name"], body)
        except client.rest.ApiException as exc:
            if exc.status != 404:
                raise
            body["metadata"].pop("resourceVersion", None)
            ext.create_custom_resource_definition(body)
        return True

    wait_for(installed, 30, message="the CRD installed")

    def established() -> bool:
        crd = ext.read_custom_resource_definition(body["metadata"]["name"])
        return any(c.type == "Established" and c.status == "True" for c in crd.status.conditions or [])

    wait_for(established, 30, message="CRD established")


class Operator:
    def __init__(
        self,
        kubeconfig: str,
        namespace: str,
        log: Path,
        env: dict[str, str] | None = None,
        *,
        also: tuple[str, ...] = (),
        metrics_port: int = 0,
        forked: bool = True,
    ) -> None:
        self.kubeconfig, self.namespace, self.log = kubeconfig, namespace, log
        self.metrics_port = metrics_port  # 0: no metrics endpoint
        self.env = env or {}
        self.also = also  # more namespaces to serve (watches there too)
        #: started by the warm-start server (False: a fresh interpreter, for a test that reads
        #: the process's own memory: a forked one's counts the server's pages too)
        self.forked = forked
        self.proc: warm.Popen | subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        env = {**os.environ, "KUBECONFIG": self.kubeconfig, "MPJOB_TICK_SECONDS": "1", **self.env}
        out = self.log.open("ab")
        self.proc = (warm.Popen if self.forked else subprocess.Popen)(
            [
                sys.executable,
                "-m",
                "mpjob.cli",
                "operator",
                *(arg for ns in (self.namespace, *self.also) for arg in ("-n", ns)),
                "--metrics-port",
                str(self.metrics_port),
                "--health-port",
                "0",
            ],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def _signal(self, sig: signal.Signals) -> bool:
        """Send `sig` to the operator's process group; False when it had ended already (a
        forked operator is reaped by its server, so its group can be gone before poll says so)."""
        if not self.proc or self.proc.poll() is not None:
            return False
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            try:  # a child forked a moment ago may not lead its own group yet
                os.kill(self.proc.pid, sig)
                return True
            except ProcessLookupError:
                code = self.proc.wait(timeout=60)
            with self.log.open("a") as log:  # said where a test's failure would send a reader
                log.write(f"test: the operator had ended (status {code}) before it was sent {sig.name}\n")
            return False
        return True

    def kill(self) -> None:
        if self._signal(signal.SIGKILL):
            assert self.proc is not None
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:  # said, not waited on forever: what holds it up
                raise AssertionError(f"the operator outlived SIGKILL by 60 s: {process_state(self.proc.pid)}") from None

    def stop(self) -> None:
        if self._signal(signal.SIGTERM):
            assert self.proc is not None
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.kill()

    @classmethod
    @contextlib.contextmanager
    def running(cls, kubeconfig: str, namespace: str, log: Path, **options: Any) -> Iterator[Operator]:
        """An operator serving `namespace` for the block (`options`: the constructor's), stopped after it."""
        op = cls(kubeconfig, namespace, log, **options)
        op.start()
        try:
            yield op
        finally:
            op.stop()


@pytest.fixture
def operator(kubeconfig: str, namespace: str, crd_installed: None, tmp_path: Path) -> Iterator[Operator]:
    with Operator.running(kubeconfig, namespace, tmp_path / "operator.log") as op:
        yield op


class Jobs:
    def __init__(self, api_client: client.ApiClient, namespace: str) -> None:
        self.custom = client.CustomObjectsApi(api_client)
        self.batch = client.BatchV1Api(api_client)
        self.core = client.CoreV1Api(api_client)
        self.namespace = namespace

    def create(self, name: str, spec: dict[str, Any]) -> None:
        self.custom.create_namespaced_custom_object(
            api.GROUP,
            api.VERSION,
            self.namespace,
            api.PLURAL,
            {"apiVersion": api.API_VERSION, "kind": api.KIND, "metadata": {"name": name}, "spec": spec},
        )

    def get(self, name: str) -> dict[str, Any]:
        return self.custom.get_namespaced_custom_object(api.GROUP, api.VERSION, self.namespace, api.PLURAL, name)

    def patch_spec(self, name: str, spec: dict[str, Any]) -> None:
        self.custom.patch_namespaced_custom_object(
            api.GROUP, api.VERSION, self.namespace, api.PLURAL, name, {"spec": spec}
        )

    def status(self, name: str) -> dict[str, Any]:
        return self.get(name).get("status") or {}

    def wait_phase(self, name: str, phases: str | tuple[str, ...], timeout: float = 180) -> dict[str, Any]:
        wanted = (phases,) if isinstance(phases, str) else phases
        try:
            return wait_for(
                lambda: (s := self.status(name)).get("phase") in wanted and s,
                timeout,
                interval=0.5,
                message=f"{name} phase in {wanted}",
            )
        except AssertionError as exc:  # say the phase it ended in, not the one it started in
            raise AssertionError(f"{exc}; phase at the end: {self.status(name).get('phase')}") from None

    def wait_status(
        self, name: str, predicate: Callable[[dict[str, Any]], bool], timeout: float, message: str
    ) -> dict[str, Any]:
        """The job's status once `predicate` holds for it; on timeout the error shows the last one."""
        try:
            return wait_for(lambda: predicate(s := self.status(name)) and s, timeout, interval=0.5, message=message)
        except AssertionError as exc:
            raise AssertionError(f"{exc}; status at the end: {self.status(name)}") from None

    def events(self, name: str, *reasons: str, timeout: float = 30) -> list[Any]:
        """The Events about `name` once one of each of `reasons` is among them. The operator posts a
        plan's Events after it writes the plan's status, so a status seen is not yet its Events."""

        def listed() -> tuple[list[Any]] | None:
            found = self._events(name)
            return (found,) if set(reasons) <= {e.reason for e in found} else None

        try:
            (found,) = wait_for(listed, timeout, interval=0.25, message=f"Events {reasons} about {name}")
        except AssertionError as exc:
            raise AssertionError(f"{exc}; Events seen: {[e.reason for e in self._events(name)]}") from None
        return found

    def _events(self, name: str) -> list[Any]:
        selector = f"involvedObject.name={name}"
        return list(self.core.list_namespaced_event(self.namespace, field_selector=selector).items)

    def attempt_jobs(self, name: str) -> list[str]:
        return sorted(
            j.metadata.name
            for j in self.batch.list_namespaced_job(self.namespace, label_selector=f"mpjob.dev/job={name}").items
        )

    def checkpoints(self, kubeconfig: str, claim: str, name: str) -> Path:
        """The job's own checkpoint folder, `<namespace>/<name>/<uid>` below the claim's root (the
        test node agent keeps a claim as a local directory)."""
        uid = self.get(name)["metadata"]["uid"]
        return Path(kubeconfig).parent / "volumes" / self.namespace / claim / self.namespace / name / uid

    def pvc(self, name: str) -> None:
        self.core.create_namespaced_persistent_volume_claim(
            self.namespace,
            {
                "metadata": {"name": name},
                "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
            },
        )


@pytest.fixture
def jobs(api_client: client.ApiClient, namespace: str) -> Jobs:
    return Jobs(api_client, namespace)


#: The length of a run that the test ends itself (a suspend, a deletion, a lost pod).
UNTIL_STOPPED = 100_000


def paced_if_until_stopped(args: dict[str, Any], steps: int) -> dict[str, Any]:
    """A builtin task's `args` for a run of `steps`: one the test ends itself trains at 20 ms a
    step, so that while the test waits on the cluster it leaves the cores to what it waits on
    instead of racing through steps nobody reads."""
    return {**args, "stepDelay": paced(0.02)} if steps == UNTIL_STOPPED else dict(args)


def gpt_spec(claim: str, steps: int = 60, every: int = 10, **over: Any) -> dict[str, Any]:
    args = paced_if_until_stopped({"nLayer": 1, "nHead": 2, "nEmbd": 32, "blockSize": 32, "corpusBytes": 20000}, steps)
    spec: dict[str, Any] = {
        "task": {"builtin": "gpt", "args": args},
        "training": {"steps": steps, "batchSize": 4, "logEvery": 5},
        "precision": {"mode": "fp16", "fallback": ["bf16", "fp32"]},
        "checkpoint": {"everySteps": every, "volume": {"persistentVolumeClaim": {"claimName": claim}}},
        "resources": {"gpusPerWorker": 1},
    }
    spec.update(over)
    return spec


def pod_events(kubeconfig: str, namespace: str, attempt: str) -> list[dict[str, Any]]:
    """The trainer's JSON event lines from the logs of an attempt's pods (test node agent)."""
    logs = Path(kubeconfig).parent / "logs" / "pods"
    out = []
    for path in logs.glob(f"{namespace}_{attempt}-*_trainer.log"):
        for line in path.read_text().splitlines():
            if line.startswith("{"):
                out.append(json.loads(line))
    return out


def operator_samples(port: int, *prefixes: str) -> dict[str, float]:
    """The samples (`name{labels}` -> value) whose names start with one of `prefixes` that an
    operator's metrics endpoint on `port` serves (no `_created` series)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
        text = answer.read(1 << 20).decode()
    return {
        line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(prefixes) and "_created" not in line
    }


Spec = Callable[..., dict[str, Any]]

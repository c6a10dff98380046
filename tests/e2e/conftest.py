"""The product as a user meets it: `helm install`, `kubectl apply`, `kubectl get -w`, `helm test`.

Runs unchanged against any cluster named by $KUBECONFIG (kind, a cloud cluster; set
MPJOB_E2E_VALUES to a values file naming your images) or, by default, the test control plane,
whose node agent runs each pod's command as a local process: the operator Deployment's pod runs
`mpjob operator` under the chart's ServiceAccount token, so a missing RBAC rule fails here.

The release watches only its own namespace, so it never touches other tests' jobs.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
import yaml
from kubernetes import client, watch
from kubernetes.client.rest import ApiException

from mpjob_contract import api
from tests.helpers import free_port, paced, wait_for

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "helm/mpjob"
EXAMPLES = REPO / "examples"


@dataclass
class Cli:
    """kubectl and helm against the cluster under test."""

    kubectl_bin: str
    helm_bin: str
    kubeconfig: str

    def run(self, argv: list[str], stdin: str | None = None, check: bool = True, timeout: float = 600) -> str:
        result = subprocess.run(
            argv,
            input=stdin,
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**os.environ, "KUBECONFIG": self.kubeconfig},
        )
        if check and result.returncode != 0:
            raise AssertionError(
                f"{' '.join(argv[:4])} ... exited {result.returncode}:\n{result.stdout}\n{result.stderr}"
            )
        return result.stdout

    def kubectl(self, *args: str, stdin: str | None = None, check: bool = True) -> str:
        return self.run([self.kubectl_bin, "--kubeconfig", self.kubeconfig, *args], stdin=stdin, check=check)

    def helm(self, *args: str, check: bool = True, timeout: float = 600) -> str:
        return self.run([self.helm_bin, "--kubeconfig", self.kubeconfig, *args], check=check, timeout=timeout)


@pytest.fixture(scope="session")
def cli(kubeconfig: str) -> Cli:
    def find(name: str) -> str:
        found = os.environ.get(f"MPJOB_{name.upper()}") or shutil.which(name)
        if found:
            return found
        from tests.cluster.controlplane import binaries

        return str(binaries() / name)

    return Cli(find("kubectl"), find("helm"), kubeconfig)


@dataclass
class Release:
    name: str
    namespace: str
    values: list[str]
    cli: Cli
    install_output: str = ""
    trainer_image: str = "mpjob-trainer:0.1.0"
    installed: bool = False
    #: Values given as JSON (`--set-json`): numbers that are not integers.
    json_values: list[str] = field(default_factory=list)

    def install_args(self, *extra: str) -> list[str]:
        args = [str(CHART), "-n", self.namespace, "--wait", "--timeout", "3m"]
        for item in self.values:
            args += ["--set", item]
        for item in self.json_values:
            args += ["--set-json", item]
        if os.environ.get("MPJOB_E2E_VALUES"):
            args += ["-f", os.environ["MPJOB_E2E_VALUES"]]
        return args + list(extra)


@pytest.fixture(scope="session")
def custom(api_client: client.ApiClient) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(api_client)


@pytest.fixture(scope="module")
def release_namespace(core: client.CoreV1Api) -> Iterator[str]:
    """A namespace for one release and its jobs; deleted afterwards (jobs first)."""
    name = f"mpjob-e2e-{uuid.uuid4().hex[:6]}"
    core.create_namespace({"metadata": {"name": name, "labels": {"mpjob.dev/test": "true"}}})
    yield name
    core.delete_namespace(name, propagation_policy="Background")


@pytest.fixture(scope="module")
def release(cli: Cli, release_namespace: str) -> Iterator[Release]:
    """The chart's values for this cluster: only this namespace, ports free on a shared test host."""
    rel = Release(
        name="mpjob",
        namespace=release_namespace,
        cli=cli,
        values=[
            f"watchNamespaces={{{release_namespace}}}",
            f"operator.metricsPort={free_port()}",
            f"operator.healthPort={free_port()}",
            "operator.tickSeconds=2",
            "operator.bindAddress=podIP",  # pods share this host's network here
        ],
        # The suite's wait before an attempt that retries a failure (tests/conftest.py): the
        # chart's operator runs in a pod, with the chart's settings only (`--set` reads 0.2 as a string).
        json_values=[f"operator.attemptBackoffSeconds={os.environ['MPJOB_ATTEMPT_BACKOFF_SECONDS']}"],
    )
    yield rel
    if rel.installed:
        cli.helm("uninstall", rel.name, "-n", rel.namespace, "--wait", check=False)


# ------------------------------------------------------------------ jobs


def example_docs(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((EXAMPLES / f"{name}.yaml").read_text()) if d]


def example(name: str) -> dict[str, Any]:
    (doc,) = example_docs(name)
    return doc


def endless(name: str) -> dict[str, Any]:
    """The quickstart renamed, as a tiny bf16 MLP that trains until stopped: a job that is
    still running whenever a test looks. It trains at a pace (20 ms a step: task.args.stepDelay)
    so that it leaves the cores to the control plane and the operator the test is watching."""
    job = example("quickstart")
    job["metadata"]["name"] = name
    args = {"inputs": 8, "hidden": 16, "layers": 1, "samples": 512, "stepDelay": paced(0.02)}
    job["spec"]["task"] = {"builtin": "mlp", "args": args}
    job["spec"]["training"] = {"steps": 1_000_000, "batchSize": 8, "logEvery": 5}
    job["spec"]["precision"] = {"mode": "bf16", "fallback": ["fp32"]}
    return job


def cpu_sized(job: dict[str, Any], **training: Any) -> dict[str, Any]:
    """The same story on CPU in about a minute: a tiny GPT, a few steps, frequent checkpoints.
    Precision, fallback ladder, workers, GPUs per worker and volume stay as the example has them."""
    args = job["spec"]["task"]["args"]
    tiny = {"nLayer": 1, "nHead": 2, "nEmbd": 32, "blockSize": 32, "corpusBytes": 20000}
    if "overflowAtStep" in args:
        tiny["overflowAtStep"] = 25
    job["spec"]["task"]["args"] = tiny
    job["spec"]["training"] = {"steps": 60, "batchSize": 4, "logEvery": 5, **training}
    job["spec"]["checkpoint"]["everySteps"] = 10
    return job


class Jobs:
    def __init__(self, cli: Cli, custom: client.CustomObjectsApi, core: client.CoreV1Api, namespace: str) -> None:
        self.cli, self.custom, self.core, self.namespace = cli, custom, core, namespace

    def apply(self, *docs: dict[str, Any]) -> None:
        """`kubectl apply -f -`, as a user would apply an example file."""
        self.cli.kubectl("apply", "-n", self.namespace, "-f", "-", stdin=yaml.safe_dump_all(docs))

    def claims(self, *names: str) -> list[dict[str, Any]]:
        """The example's checkpoint claims, applied and bound (or waiting for their first pod,
        on storage classes that bind late) before any job uses them."""
        docs = [d for d in example_docs("volumes/checkpoints-pvc") if d["metadata"]["name"] in names]
        self.apply(*docs)
        storage = client.StorageV1Api(self.core.api_client)

        def ready(name: str) -> bool:
            pvc = self.core.read_namespaced_persistent_volume_claim(name, self.namespace)
            if pvc.status.phase == "Bound":
                return True
            klass = pvc.spec.storage_class_name
            return bool(klass) and storage.read_storage_class(klass).volume_binding_mode == "WaitForFirstConsumer"

        for name in names:
            wait_for(lambda name=name: ready(name), 60, message=f"claim {name} bound")
        return docs

    def listed(self) -> dict[str, dict[str, Any] | None]:
        """Every MixedPrecisionJob of the namespace: name -> status."""
        items = self.custom.list_namespaced_custom_object(api.GROUP, api.VERSION, self.namespace, api.PLURAL)
        return {j["metadata"]["name"]: j.get("status") for j in items["items"]}

    def get(self, name: str) -> dict[str, Any]:
        return self.custom.get_namespaced_custom_object(api.GROUP, api.VERSION, self.namespace, api.PLURAL, name)

    def status(self, name: str) -> dict[str, Any]:
        return self.get(name).get("status") or {}

    def wait_phase(self, name: str, phases: tuple[str, ...], timeout: float) -> dict[str, Any]:
        return wait_for(
            lambda: (s := self.status(name)).get("phase") in phases and s,
            timeout,
            interval=1,
            message=f"{name} in {phases} (now {self.status(name).get('phase')})",
        )

    def pods(self, selector: str) -> list[Any]:
        return self.core.list_namespaced_pod(self.namespace, label_selector=selector).items

    def checkpoint_sha256(self, claim: str, path: str, image: str) -> str:
        """sha256 of the state.pt of the checkpoint at `path` (as the trainer saw it: in its job's
        own folder of the claim), read by a pod that mounts the claim."""
        name = f"ckpt-reader-{uuid.uuid4().hex[:6]}"
        mount = "/checkpoints"
        relative = "/".join(PurePosixPath(path).parts[-4:])  # <namespace>/<job>/<uid>/step-N, below the claim
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name},
            "spec": {
                "restartPolicy": "Never",
                "automountServiceAccountToken": False,
                "securityContext": {"runAsNonRoot": True, "runAsUser": 1000, "runAsGroup": 1000},
                "containers": [
                    {
                        "name": "reader",
                        "image": image,
                        "command": [
                            "sh",
                            "-c",
                            f"sha256sum {shlex.quote(f'{mount}/{relative}/state.pt')} > /dev/termination-log",
                        ],
                        "volumeMounts": [{"name": "ckpt", "mountPath": mount, "readOnly": True}],
                    }
                ],
                "volumes": [{"name": "ckpt", "persistentVolumeClaim": {"claimName": claim, "readOnly": True}}],
            },
        }
        self.core.create_namespaced_pod(self.namespace, pod)

        def done() -> Any:
            p = self.core.read_namespaced_pod(name, self.namespace)
            return p if p.status.phase in ("Succeeded", "Failed") else None

        finished = wait_for(done, 120, interval=0.5, message=f"checkpoint reader {name}")
        terminated = finished.status.container_statuses[0].state.terminated
        assert finished.status.phase == "Succeeded", terminated.message
        self.core.delete_namespaced_pod(name, self.namespace, grace_period_seconds=0)
        return terminated.message.split()[0]


@pytest.fixture
def jobs(cli: Cli, custom: client.CustomObjectsApi, core: client.CoreV1Api, release_namespace: str) -> Jobs:
    return Jobs(cli, custom, core, release_namespace)


@dataclass
class PhaseWatch:
    """Every (phase, precision, attempt) a watch on one MixedPrecisionJob sees, in order
    (what `kubectl get mpj -w` prints)."""

    custom: client.CustomObjectsApi
    namespace: str
    name: str
    seen: list[tuple[str, str | None, int]] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def start(self) -> PhaseWatch:
        threading.Thread(target=self._run, daemon=True).start()
        return self

    def _run(self) -> None:
        rv = None
        while not self.stop.is_set():
            try:
                stream = watch.Watch().stream(
                    self.custom.list_namespaced_custom_object,
                    api.GROUP,
                    api.VERSION,
                    self.namespace,
                    api.PLURAL,
                    field_selector=f"metadata.name={self.name}",
                    resource_version=rv,
                    timeout_seconds=20,
                )
                for event in stream:
                    obj = event["object"]
                    rv = obj["metadata"]["resourceVersion"]
                    status = obj.get("status") or {}
                    entry = (status.get("phase", ""), status.get("precision"), status.get("attempt", 0))
                    if status.get("phase") and (not self.seen or self.seen[-1] != entry):
                        self.seen.append(entry)
                    if self.stop.is_set():
                        return
            except ApiException as exc:
                if exc.status == 410:
                    rv = None
            except Exception:  # a dropped connection: watch again from the last version seen
                continue

    def phases(self) -> list[tuple[str, str | None]]:
        return [(phase, precision) for phase, precision, _ in self.seen]

    def stop_after(self, phases: tuple[str, ...], timeout: float = 30) -> None:
        """Stop once the watch itself has seen one of `phases`: a status read elsewhere may run
        ahead of the watch's events, and stopping at once would cut the story short."""
        try:
            wait_for(
                lambda: any(seen[0] in phases for seen in self.seen), timeout, message=f"the watch to see {phases}"
            )
        finally:
            self.stop.set()

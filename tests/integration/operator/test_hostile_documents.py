"""Documents nested deeper than a JSON parser reads by default, on the real control plane: the
shipped CRD refuses them at apply (test_admission.py); one stored anyway (under a CRD from before
the bound, whose task.args were free-form) neither stops the operator nor the jobs of other
namespaces; and /healthz fails while the operator's watches are dead, and recovers with them."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from mpjob.controller.watch import FAILING_SECONDS
from tests import warm
from tests.helpers import free_port, wait_for
from tests.integration.operator.conftest import Jobs, Operator, another_crd
from tests.integration.operator.test_hostile_children import standin
from tests.unit.operator.cases import bad, nested_json

pytestmark = pytest.mark.integration
LEVELS = 1500  # what kopf's json.loads failed on: RecursionError near 1,000 on Python 3.11


class Watching(Operator):
    """An operator serving several namespaces, with its /healthz on `health_port`."""

    def __init__(self, kubeconfig: str, namespaces: list[str], log: Path, health_port: int) -> None:
        super().__init__(kubeconfig, namespaces[0], log)
        self.namespaces, self.health_port = namespaces, health_port

    def start(self) -> None:
        env = {**os.environ, "KUBECONFIG": self.kubeconfig, "MPJOB_TICK_SECONDS": "1"}
        flags = [f"--namespace={ns}" for ns in self.namespaces]
        command = [sys.executable, "-m", "mpjob.cli", "operator", *flags, "--metrics-port", "0"]
        command += ["--bind-address", "127.0.0.1", "--health-port", str(self.health_port)]
        out = self.log.open("ab")
        self.proc = warm.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)

    def health(self) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.health_port}/healthz", timeout=15) as answer:
                return answer.status, answer.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()
        except (urllib.error.URLError, ConnectionError) as exc:  # not serving (yet, or any more)
            return 0, str(exc)


def kubectl(cluster_bin: Path, kubeconfig: str, *args: str) -> subprocess.CompletedProcess[str]:
    command = [str(cluster_bin / "kubectl"), "--kubeconfig", kubeconfig, *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=60)


@pytest.fixture
def free_form_crd(api_client: client.ApiClient, crd_installed: None, kubeconfig: str) -> Iterator[None]:
    """The CRD as it was before task.args were bounded (free-form), for this test."""

    def free_form(schema: dict[str, Any]) -> None:
        args = schema["properties"]["spec"]["properties"]["task"]["properties"]["args"]
        del args["additionalProperties"]
        args["x-kubernetes-preserve-unknown-fields"] = True

    with another_crd(api_client, kubeconfig, free_form):
        yield


@pytest.fixture
def other_namespace(core: client.CoreV1Api) -> Iterator[str]:
    name = f"t-{uuid.uuid4().hex[:8]}"
    core.create_namespace({"metadata": {"name": name, "labels": {"mpjob.dev/test": "true"}}})
    yield name
    core.delete_namespace(name, propagation_policy="Background")


def store_deep_job(cluster_bin: Path, kubeconfig: str, namespace: str, name: str, tmp_path: Path) -> None:
    """A job whose task.args nest LEVELS deep, stored (kubectl sends it as written, in JSON)."""
    manifest = bad("spec.task.args", "HERE")
    manifest["metadata"] = {"name": name, "namespace": namespace}
    manifest["spec"]["task"] = {"builtin": "mlp", "args": {"deep": "HERE"}}
    path = tmp_path / f"{name}.json"
    path.write_text(nested_json(manifest, LEVELS))

    def stored() -> bool:  # until the API server validates with the free-form CRD
        return kubectl(cluster_bin, kubeconfig, "create", "-f", str(path)).returncode == 0

    wait_for(stored, 30, interval=1, message=f"{name} stored under the free-form CRD")


def phase_and_message(cluster_bin: Path, kubeconfig: str, namespace: str, name: str) -> tuple[str, str]:
    """Read with kubectl: this test's own client would fail on the body as kopf did."""
    out = kubectl(cluster_bin, kubeconfig, "-n", namespace, "get", "mpj", name, "-o", "jsonpath={.status}")
    status = json.loads(out.stdout or "{}")
    return status.get("phase", ""), status.get("message", "")


def test_a_stored_object_too_deep_to_parse_fails_alone_and_the_operator_stays_up(
    free_form_crd: None,
    api_client: client.ApiClient,
    namespace: str,
    other_namespace: str,
    kubeconfig: str,
    cluster_bin: Path,
    tmp_path: Path,
) -> None:
    store_deep_job(cluster_bin, kubeconfig, namespace, "deep-listed", tmp_path)  # in the first listing
    operator = Watching(kubeconfig, [namespace, other_namespace], tmp_path / "operator.log", free_port())
    operator.start()
    try:
        store_deep_job(cluster_bin, kubeconfig, other_namespace, "deep-watched", tmp_path)  # a watch event
        fine = Jobs(api_client, other_namespace)
        fine.create("fine", standin(steps=3))
        assert fine.wait_phase("fine", ("Succeeded", "Failed"), 180)["phase"] == "Succeeded"
        for ns, name in ((namespace, "deep-listed"), (other_namespace, "deep-watched")):

            def refused(ns: str = ns, name: str = name) -> bool:
                phase, message = phase_and_message(cluster_bin, kubeconfig, ns, name)
                return phase == "Failed" and "spec.task.args.deep.deep.deep.deep" in message

            wait_for(refused, 60, interval=1, message=f"{name} failed, naming the field")
            assert Jobs(api_client, ns).attempt_jobs(name) == []  # nothing ran for it
        assert operator.proc is not None and operator.proc.poll() is None, "the operator exited"
        assert operator.health()[0] == 200
        log = operator.log.read_text()
        assert "RecursionError" not in log and "maximum recursion depth" not in log, log[-3000:]
    finally:
        operator.stop()


def test_a_job_whose_managed_fields_nest_1500_deep_runs_and_so_do_the_others(
    crd_installed: None,
    api_client: client.ApiClient,
    namespace: str,
    other_namespace: str,
    kubeconfig: str,
    cluster_bin: Path,
    tmp_path: Path,
) -> None:
    """metadata.managedFields[].fieldsV1 is free-form on every Kubernetes object, no CRD can bound
    it, and the API server keeps what a client sends there: the operator reads such a job (and
    its children's events) whatever the shipped CRD says."""
    manifest = {"apiVersion": "mpjob.dev/v1alpha1", "kind": "MixedPrecisionJob", "spec": standin(steps=3)}
    entry = {"manager": "hostile", "operation": "Update", "apiVersion": "mpjob.dev/v1alpha1"}
    entry |= {"fieldsType": "FieldsV1", "fieldsV1": "HERE"}
    manifest["metadata"] = {"name": "deep-meta", "namespace": namespace, "managedFields": [entry]}
    path = tmp_path / "deep-meta.json"
    path.write_text(json.dumps(manifest).replace('"HERE"', '{"f:deep": ' * LEVELS + "{}" + "}" * LEVELS))
    created = kubectl(cluster_bin, kubeconfig, "create", "-f", str(path))
    assert created.returncode == 0, created.stderr
    custom = client.CustomObjectsApi(api_client)
    raw = custom.get_namespaced_custom_object(
        "mpjob.dev", "v1alpha1", namespace, "mixedprecisionjobs", "deep-meta", _preload_content=False
    )
    assert raw.data.count(b'"f:deep"') >= LEVELS  # kept as sent (read as bytes: json.loads would fail)
    operator = Watching(kubeconfig, [namespace, other_namespace], tmp_path / "operator.log", free_port())
    operator.start()
    try:
        fine = Jobs(api_client, other_namespace)
        fine.create("fine", standin(steps=3))
        assert fine.wait_phase("fine", ("Succeeded", "Failed"), 180)["phase"] == "Succeeded"

        def deep_one_done() -> str:
            return phase_and_message(cluster_bin, kubeconfig, namespace, "deep-meta")[0] in ("Succeeded", "Failed")

        wait_for(deep_one_done, 120, interval=1, message="deep-meta finished")
        assert phase_and_message(cluster_bin, kubeconfig, namespace, "deep-meta")[0] == "Succeeded"
        assert operator.proc is not None and operator.proc.poll() is None, "the operator exited"
        assert "maximum recursion depth" not in operator.log.read_text()
    finally:
        operator.stop()


# ------------------------------------------------------------------ liveness


class Gate(threading.Thread):
    """A TCP relay to the API server that can be shut (connections cut, new ones refused) and
    opened again on the same port: the operator's watches die and come back with it."""

    def __init__(self, target: tuple[str, int]) -> None:
        super().__init__(daemon=True)
        self.target, self.port = target, free_port()
        self.open = threading.Event()
        self.conns: list[socket.socket] = []
        self.listener: socket.socket | None = None

    def run(self) -> None:
        while True:
            self.open.wait()
            listener = socket.create_server(("127.0.0.1", self.port), reuse_port=False)
            listener.settimeout(0.2)
            self.listener = listener
            while self.open.is_set():
                try:
                    conn, _ = listener.accept()
                except TimeoutError:
                    continue
                try:
                    upstream = socket.create_connection(self.target)
                except OSError:
                    conn.close()
                    continue
                self.conns += [conn, upstream]
                for a, b in ((conn, upstream), (upstream, conn)):
                    threading.Thread(target=_pump, args=(a, b), daemon=True).start()
            listener.close()

    def set_open(self, is_open: bool) -> None:
        if is_open:
            self.open.set()
            return
        self.open.clear()
        for conn in self.conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        self.conns.clear()


def _pump(src: socket.socket, dst: socket.socket) -> None:
    try:
        while data := src.recv(65536):
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)


@pytest.fixture
def gated_kubeconfig(kubeconfig: str, tmp_path: Path) -> Iterator[tuple[str, Gate]]:
    config = yaml.safe_load(Path(kubeconfig).read_text())
    server = config["clusters"][0]["cluster"]["server"]
    host, port = server.removeprefix("https://").rsplit(":", 1)
    gate = Gate((host, int(port)))
    gate.start()
    gate.set_open(True)
    config["clusters"][0]["cluster"]["server"] = f"https://{host}:{gate.port}"
    path = tmp_path / "gated-kubeconfig"
    path.write_text(yaml.safe_dump(config))
    yield str(path), gate
    gate.set_open(False)


def test_healthz_fails_while_the_watches_are_dead_and_recovers_with_them(
    gated_kubeconfig: tuple[str, Gate], crd_installed: None, namespace: str, tmp_path: Path
) -> None:
    kubeconfig, gate = gated_kubeconfig
    operator = Watching(kubeconfig, [namespace], tmp_path / "operator.log", free_port())
    operator.start()
    try:
        _, body = wait_for(lambda: (h := operator.health())[0] == 200 and h, 60, interval=1, message="healthy")
        assert json.loads(body) == {"watches": "alive"}
        gate.set_open(False)  # every watch fails from now on: connections cut, new ones refused
        limit = FAILING_SECONDS + 10 + 10  # + kopf's 10 s probe cache; kopf itself stops after ~54 s

        def unhealthy() -> bool:
            assert operator.proc is not None and operator.proc.poll() is None, "exited before the probe failed"
            return operator.health()[0] == 500

        wait_for(unhealthy, limit, interval=1, message="unhealthy")  # alive, but blind: the probe says so
        gate.set_open(True)
        wait_for(lambda: operator.health()[0] == 200, 60, interval=2, message="healthy again")
        assert "mpjob-watch-pods-" in operator.log.read_text()  # the probe's reason, in kopf's log line
    finally:
        operator.stop()

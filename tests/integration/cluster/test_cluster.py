"""The test control plane and node agent behave like a cluster: Jobs, GPU scheduling,
graceful deletion, ServiceAccount credentials, headless-Service DNS."""

from __future__ import annotations

import json
import sys
import textwrap
import time
from pathlib import Path

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from tests.helpers import wait_for

pytestmark = pytest.mark.integration
PY = sys.executable


def _pod(name: str, code: str, **spec: object) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": "Never",
            "containers": [{"name": "main", "image": "python", "command": [PY, "-c", code]}],
            **spec,
        },
    }


def _job(name: str, code: str, completions: int = 2, **pod_spec: object) -> dict:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {
            "completions": completions,
            "parallelism": completions,
            "completionMode": "Indexed",
            "backoffLimit": 0,
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    **pod_spec,
                    "containers": [{"name": "main", "image": "python", "command": [PY, "-c", code]}],
                }
            },
        },
    }


def _job_condition(batch: client.BatchV1Api, ns: str, name: str) -> tuple[str, str] | None:
    job = batch.read_namespaced_job(name, ns)
    for cond in job.status.conditions or []:
        if cond.type in ("Failed", "Complete") and cond.status == "True":
            return cond.type, cond.reason or ""
    return None


def test_indexed_job_failure_carries_exit_code_and_termination_message(batch, core, namespace) -> None:
    code = textwrap.dedent("""
        import json, os
        report = {'reason': 'x', 'index': os.environ['JOB_COMPLETION_INDEX']}
        open('/dev/termination-log', 'w').write(json.dumps(report))
        raise SystemExit(3)
    """)
    job = _job("fails", code)
    job["spec"]["template"]["spec"]["containers"][0]["env"] = [
        {
            "name": "JOB_COMPLETION_INDEX",
            "valueFrom": {
                "fieldRef": {"fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"}
            },
        }
    ]
    batch.create_namespaced_job(namespace, job)
    result = wait_for(lambda: _job_condition(batch, namespace, "fails"), 90, message="job fails")
    assert result == ("Failed", "BackoffLimitExceeded")
    pods = core.list_namespaced_pod(namespace, label_selector="job-name=fails").items
    terminated = [
        p.status.container_statuses[0].state.terminated
        for p in pods
        if p.status.container_statuses and p.status.container_statuses[0].state.terminated
    ]
    assert terminated, "no terminated container status"
    for t in terminated:
        assert t.exit_code == 3
        report = json.loads(t.message)
        assert report["reason"] == "x" and report["index"] in ("0", "1")


def test_indexed_job_success_completes(batch, namespace) -> None:
    batch.create_namespaced_job(namespace, _job("works", "print('ok')"))
    assert wait_for(lambda: _job_condition(batch, namespace, "works"), 90, message="job completes")[0] == "Complete"


GPU_TOLERATION = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
GPU_AFFINITY = {
    "nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [
                {"matchExpressions": [{"key": "nvidia.com/gpu.compute.major", "operator": "Gt", "values": ["7"]}]}
            ]
        }
    }
}


def _gpu_pod(name: str, gpus: int, tolerate: bool = True) -> dict:
    extra = {"affinity": GPU_AFFINITY, "tolerations": GPU_TOLERATION} if tolerate else {}
    pod = _pod(name, "import time; time.sleep(60)", **extra)
    pod["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": str(gpus)}} if gpus else {}
    return pod


def test_restarted_container_keeps_its_pod_ip_and_ends_succeeded(core, namespace) -> None:
    # OnFailure: the first run fails, the agent restarts the container, the second run
    # succeeds. The pod must keep one IP (a second would make its status unwritable).
    code = textwrap.dedent("""
        import pathlib
        marker = pathlib.Path('/scratch/ran-once')
        if not marker.exists():
            marker.write_text('1')
            raise SystemExit(1)
    """)
    pod = _pod("flaky", code, restartPolicy="OnFailure", volumes=[{"name": "scratch", "emptyDir": {}}])
    pod["spec"]["containers"][0]["volumeMounts"] = [{"name": "scratch", "mountPath": "/scratch"}]
    core.create_namespaced_pod(namespace, pod)

    def succeeded() -> client.V1Pod | None:
        found = core.read_namespaced_pod("flaky", namespace)
        return found if found.status.phase == "Succeeded" else None

    done = wait_for(succeeded, 60, message="flaky pod Succeeded after one restart")
    assert done.status.container_statuses[0].restart_count == 1
    assert done.status.container_statuses[0].state.terminated.exit_code == 0
    assert [ip.ip for ip in done.status.pod_ips] == [done.status.pod_ip]


def test_gpu_scheduling(core, namespace) -> None:
    core.create_namespaced_pod(namespace, _gpu_pod("one-gpu", 1))
    core.create_namespaced_pod(namespace, _gpu_pod("three-gpus", 3))
    core.create_namespaced_pod(namespace, _gpu_pod("nine-gpus", 9))
    core.create_namespaced_pod(namespace, _gpu_pod("no-toleration", 0, tolerate=False))

    assert (
        wait_for(lambda: core.read_namespaced_pod("one-gpu", namespace).spec.node_name, 60, message="one-gpu scheduled")
        == "gpu-node-0"
    )

    def unschedulable() -> bool:
        pod = core.read_namespaced_pod("nine-gpus", namespace)
        return any(
            c.type == "PodScheduled" and c.status == "False" and c.reason == "Unschedulable"
            for c in pod.status.conditions or []
        )

    wait_for(unschedulable, 60, message="nine-gpus unschedulable")  # more than any node holds
    assert core.read_namespaced_pod("nine-gpus", namespace).spec.node_name is None
    # Three fit the shared GPU node (8 GPUs); the pods never tolerate the other one's taint.
    assert wait_for(lambda: core.read_namespaced_pod("three-gpus", namespace).spec.node_name, 60) == "gpu-node-0"
    assert (
        wait_for(
            lambda: core.read_namespaced_pod("no-toleration", namespace).spec.node_name,
            60,
            message="no-toleration scheduled",
        )
        == "cpu-node-0"
    )


def test_the_agent_renews_each_nodes_lease(api_client) -> None:
    """The node lifecycle controller reads a node's Lease in kube-node-lease as its heartbeat."""
    coord = client.CoordinationV1Api(api_client)
    nodes = ("gpu-node-0", "cpu-node-0")  # no test removes these

    def renewed(node: str) -> object:
        return coord.read_namespaced_lease(node, "kube-node-lease").spec.renew_time

    first = wait_for(lambda: {n: renewed(n) for n in nodes}, 30, message="both nodes' Leases")
    wait_for(lambda: all(renewed(n) > first[n] for n in nodes), 30, message="both Leases renewed")


def test_deleting_a_running_pod_sends_sigterm_within_the_grace_period(core, namespace, kubeconfig) -> None:
    claim = "signals"
    code = textwrap.dedent("""
        import signal, sys, time, pathlib
        out = pathlib.Path('/data/signal')
        def handle(signum, frame):
            out.write_text('SIGTERM')
            sys.exit(0)
        signal.signal(signal.SIGTERM, handle)
        pathlib.Path('/data/started').write_text('yes')
        time.sleep(300)
    """)
    core.create_namespaced_persistent_volume_claim(
        namespace,
        {
            "metadata": {"name": claim},
            "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
        },
    )
    pod = _pod(
        "sleeper",
        code,
        terminationGracePeriodSeconds=20,
        volumes=[{"name": "data", "persistentVolumeClaim": {"claimName": claim}}],
    )
    pod["spec"]["containers"][0]["volumeMounts"] = [{"name": "data", "mountPath": "/data"}]
    core.create_namespaced_pod(namespace, pod)
    volume = Path(kubeconfig).parent / "volumes" / namespace / claim
    wait_for(lambda: (volume / "started").exists(), 60, message="process started")
    started = time.monotonic()
    core.delete_namespaced_pod("sleeper", namespace)

    def gone() -> bool:
        try:
            core.read_namespaced_pod("sleeper", namespace)
        except ApiException as exc:
            return exc.status == 404
        return False

    wait_for(gone, 30, message="pod gone")
    assert time.monotonic() - started < 20
    assert (volume / "signal").read_text() == "SIGTERM"


def test_service_account_credentials_only_when_automounted(core, api_client, namespace, kubeconfig) -> None:
    rbac = client.RbacAuthorizationV1Api(api_client)
    core.create_namespaced_service_account(namespace, {"metadata": {"name": "lister"}})
    rbac.create_namespaced_role(
        namespace,
        {"metadata": {"name": "list-pods"}, "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}]},
    )
    rbac.create_namespaced_role_binding(
        namespace,
        {
            "metadata": {"name": "lister"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "list-pods"},
            "subjects": [{"kind": "ServiceAccount", "name": "lister", "namespace": namespace}],
        },
    )
    code = textwrap.dedent(f"""
        import json, os, pathlib
        from kubernetes import client, config
        out = {{'kubeconfig': bool(os.environ.get('KUBECONFIG'))}}
        if out['kubeconfig']:
            api = config.new_client_from_config()
            core = client.CoreV1Api(api)
            out['pods'] = len(core.list_namespaced_pod('{namespace}').items) >= 1
            for what, call in (('secrets', lambda: core.list_namespaced_secret('{namespace}')),
                               ('other', lambda: core.list_namespaced_pod('default'))):
                try:
                    call(); out[what] = 200
                except client.rest.ApiException as exc:
                    out[what] = exc.status
        open('/dev/termination-log', 'w').write(json.dumps(out))
    """)
    core.create_namespaced_pod(
        namespace, _pod("with-token", code, serviceAccountName="lister", automountServiceAccountToken=True)
    )
    core.create_namespaced_pod(
        namespace, _pod("without-token", code, serviceAccountName="lister", automountServiceAccountToken=False)
    )

    def result(name: str) -> dict | None:
        pod = core.read_namespaced_pod(name, namespace)
        statuses = pod.status.container_statuses or []
        if statuses and statuses[0].state.terminated:
            return json.loads(statuses[0].state.terminated.message or "null") or {"empty": True}
        return None

    with_token = wait_for(lambda: result("with-token"), 60, message="with-token finished")
    assert with_token == {"kubeconfig": True, "pods": True, "secrets": 403, "other": 403}
    assert wait_for(lambda: result("without-token"), 60, message="without-token finished") == {"kubeconfig": False}


def test_pods_of_a_job_reach_each_other_through_a_headless_service(core, batch, namespace) -> None:
    core.create_namespaced_service(
        namespace,
        {
            "metadata": {"name": "peers"},
            "spec": {
                "clusterIP": "None",
                "publishNotReadyAddresses": True,
                "selector": {"job-name": "echo"},
                "ports": [{"port": 7000}],
            },
        },
    )
    code = textwrap.dedent(f"""
        import os, socket, time
        index = int(os.environ['INDEX'])
        if index == 0:
            srv = socket.create_server((os.environ['POD_IP'], 7000))
            conn, _ = srv.accept()
            conn.sendall(b'echo:' + conn.recv(100))
            conn.close()
        else:
            peer = 'echo-0.peers.{namespace}.svc'
            for _ in range(300):
                try:
                    sock = socket.create_connection((peer, 7000), timeout=1)
                    break
                except OSError:
                    time.sleep(0.1)
            sock.sendall(b'hello')
            reply = sock.recv(100)
            open('/dev/termination-log', 'w').write(reply.decode())
            assert reply == b'echo:hello', reply
    """)
    job = _job("echo", code, subdomain="peers")
    job["spec"]["template"]["spec"]["containers"][0]["env"] = [
        {
            "name": "INDEX",
            "valueFrom": {
                "fieldRef": {"fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"}
            },
        }
    ]
    batch.create_namespaced_job(namespace, job)
    assert wait_for(lambda: _job_condition(batch, namespace, "echo"), 90, message="echo job done")[0] == "Complete"


def test_a_pods_script_is_forked_by_the_clusters_warm_start_server(core, namespace, kubeconfig, tmp_path) -> None:
    """The pods' ranks start warm (tests/warm): a silent fall back to fresh interpreters would
    cost every cluster test its time again without failing anything. The script's exit status
    and output still come back as the container's."""
    server = Path(kubeconfig).parent / "warm" / "trainer.sock"
    wait_for(server.exists, 120, message="the cluster's warm-start server")  # it starts beside the agent
    probe, seen = tmp_path / "probe.py", tmp_path / "seen.json"
    probe.write_text(
        "import json, pathlib, sys\n"
        "pathlib.Path(sys.argv[1]).write_text(json.dumps({'torch': 'torch' in sys.modules}))\n"
        "raise SystemExit(3)\n"
    )
    pod = _pod("probe", "")
    pod["spec"]["containers"][0]["command"] = [PY, str(probe), str(seen)]  # the agent runs pods on this machine
    core.create_namespaced_pod(namespace, pod)

    def exit_code() -> int | None:
        statuses = core.read_namespaced_pod("probe", namespace).status.container_statuses or []
        state = statuses[0].state if statuses else None
        return state.terminated.exit_code if state and state.terminated else None

    assert wait_for(exit_code, 90, message="the probe pod to end") == 3
    assert json.loads(seen.read_text()) == {"torch": True}  # torch was there before its first line


def test_an_operator_pod_is_forked_by_the_clusters_server_of_the_mpjob_command(
    core, namespace, kubeconfig, tmp_path
) -> None:
    """The chart's operator pods run `mpjob operator`; the `mpjob` command's warm-start server
    forks it (here a probe of that name writes whether the server's imports were there)."""
    server = Path(kubeconfig).parent / "warm" / "cli.sock"
    wait_for(server.exists, 120, message="the cluster's warm-start server of the mpjob command")
    probe, seen = tmp_path / "mpjob", tmp_path / "seen.json"
    probe.write_text(
        "import json, pathlib, sys\n"
        "pathlib.Path(sys.argv[2]).write_text(json.dumps({'cli': 'mpjob.cli' in sys.modules}))\n"
    )
    pod = _pod("operator-probe", "")
    pod["spec"]["containers"][0]["command"] = [PY, str(probe), "operator", str(seen)]
    core.create_namespaced_pod(namespace, pod)

    def ended() -> str | None:
        phase = core.read_namespaced_pod("operator-probe", namespace).status.phase
        return phase if phase in ("Succeeded", "Failed") else None

    phase = wait_for(ended, 90, message="the probe pod to end")
    assert phase == "Succeeded" and json.loads(seen.read_text()) == {"cli": True}

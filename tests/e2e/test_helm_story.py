"""The install-and-recover story, in the order a user lives it: helm install, kubectl apply a
recovering job and watch it, helm test, helm upgrade under a running job, two DDP workers that
lose a pod, helm uninstall. One release for the module; tests run in file order. A queued job
is admitted, preempted and readmitted by a real Kueue in test_kueue.py."""

from __future__ import annotations

import time

import pytest
from kubernetes import client

from tests.e2e.conftest import Cli, Jobs, PhaseWatch, Release, cpu_sized, endless, example
from tests.helpers import paced, wait_for

pytestmark = pytest.mark.e2e

OPERATOR_SELECTOR = "app.kubernetes.io/component=operator,app.kubernetes.io/instance=mpjob"


def operator_pods(core: client.CoreV1Api, namespace: str) -> list[client.V1Pod]:
    return [p for p in core.list_namespaced_pod(namespace, label_selector=OPERATOR_SELECTOR).items]


def test_helm_install_starts_the_operator_under_its_own_service_account(
    release: Release, cli: Cli, core: client.CoreV1Api
) -> None:
    started = time.monotonic()
    release.install_output = cli.helm("install", release.name, *release.install_args())
    release.installed = True
    print(f"helm install --wait: {time.monotonic() - started:.1f}s")
    (pod,) = operator_pods(core, release.namespace)
    assert pod.status.phase == "Running"
    assert pod.spec.service_account_name == "mpjob" and pod.spec.containers[0].command == ["mpjob", "operator"]
    assert f"--namespace={release.namespace}" in pod.spec.containers[0].args
    notes = release.install_output.split("NOTES:", 1)[1]
    ns = release.namespace
    for command in (
        f"kubectl apply -n {ns} -f examples/quickstart.yaml",
        f"kubectl get -n {ns} mpj -w",
        f"kubectl describe -n {ns} mpj quickstart",
        f"helm test -n {ns} mpjob",
    ):
        assert command in notes


def test_an_fp16_job_that_overflows_recovers_in_bf16_from_its_checkpoint(
    release: Release, jobs: Jobs, cli: Cli, core: client.CoreV1Api
) -> None:
    jobs.claims("mpjob-checkpoints")
    job = cpu_sized(example("fp16-recovery"))
    job["spec"]["precision"]["inPlace"] = False  # the restart story: a Job per attempt, Recovering between
    watcher = PhaseWatch(jobs.custom, release.namespace, "fp16-recovery").start()
    try:
        jobs.apply(job)
        status = jobs.wait_phase("fp16-recovery", ("Succeeded", "Failed"), 600)
        watcher.stop_after(("Succeeded", "Failed"))
    finally:
        watcher.stop.set()
    assert status["phase"] == "Succeeded", status
    print("watched:", watcher.seen)
    # What `kubectl get mpj -w` shows: fp16, the recovery, bf16, done.
    phases = watcher.phases()
    story = [("Running", "fp16"), ("Recovering", "bf16"), ("Running", "bf16"), ("Succeeded", "bf16")]
    positions = [phases.index(step) if step in phases else -1 for step in story]
    assert -1 not in positions and positions == sorted(positions), phases
    first, second = status["attempts"]
    assert (first["precision"], first["reason"], first["exitCode"]) == ("fp16", "NumericFault", 42)
    assert (second["precision"], second["reason"]) == ("bf16", "Succeeded")
    assert 0 < second["startStep"] <= 25, "resumed from the last good checkpoint before the overflow"
    # `kubectl describe` tells the story in its Events.
    described = cli.kubectl("describe", "-n", release.namespace, "mpj", "fp16-recovery")
    events = described.split("Events:", 1)[1]
    for reason in ("AttemptStarted", "PrecisionFallback", "AttemptEnded", "Succeeded"):
        assert reason in events
    # The final checkpoint on the volume is the one the status names, byte for byte.
    last = status["lastCheckpoint"]
    assert (last["step"], last["precision"]) == (60, "bf16")
    assert jobs.checkpoint_sha256("mpjob-checkpoints", last["path"], release.trainer_image) == last["sha256"]
    # The chart's default networkPolicy.enabled: each attempt got its NetworkPolicy, controlled by its
    # Job and kept by the pods the operator saw running (the operator's role allows both; nothing on this
    # test cluster enforces the policy itself).
    networking, batch = client.NetworkingV1Api(core.api_client), client.BatchV1Api(core.api_client)
    for attempt in ("fp16-recovery-a0", "fp16-recovery-a1"):
        policy = networking.read_namespaced_network_policy(attempt, release.namespace)
        (owner,) = [ref for ref in policy.metadata.owner_references if ref.controller]
        assert (owner.kind, owner.uid) == ("Job", batch.read_namespaced_job(attempt, release.namespace).metadata.uid)
        assert {ref.kind for ref in policy.metadata.owner_references if not ref.controller} <= {"Pod"}
        assert policy.spec.pod_selector.match_labels["mpjob.dev/attempt"] == attempt[-1]


def test_helm_test_runs_a_tiny_job_to_succeeded(release: Release, cli: Cli, jobs: Jobs) -> None:
    out = cli.helm("test", release.name, "-n", release.namespace, "--timeout", "5m")
    assert "Phase:          Succeeded" in out
    # The test's own pod, account and role are gone once it passed; its job too.
    core = client.CoreV1Api(jobs.custom.api_client)
    assert not core.list_namespaced_pod(release.namespace, label_selector="app.kubernetes.io/component=test").items
    assert not [j for j in jobs.listed() if j.startswith("helm-test-")]


def test_helm_upgrade_leaves_a_running_job_running(
    release: Release, jobs: Jobs, cli: Cli, core: client.CoreV1Api
) -> None:
    jobs.apply(endless("long-run"))
    wait_for(lambda: jobs.status("long-run").get("step", 0) > 0, 180, interval=1, message="long-run progressing")
    (trainer,) = jobs.pods("mpjob.dev/job=long-run")
    (old_operator,) = operator_pods(core, release.namespace)

    cli.helm("upgrade", release.name, *release.install_args("--set", "operator.tickSeconds=3"))
    release.values.append("operator.tickSeconds=3")

    wait_for(
        lambda: (
            [p.metadata.uid for p in operator_pods(core, release.namespace)] not in ([], [old_operator.metadata.uid])
        ),
        120,
        message="a new operator pod",
    )
    (new_operator,) = wait_for(lambda: operator_pods(core, release.namespace), 60, message="one operator")
    assert "--tick-seconds=3" in new_operator.spec.containers[0].args
    # The trainer kept running through the upgrade: same pod, same attempt, still progressing.
    (still,) = jobs.pods("mpjob.dev/job=long-run")
    assert still.metadata.uid == trainer.metadata.uid and still.status.phase == "Running"
    before = jobs.status("long-run")["step"]
    wait_for(
        lambda: jobs.status("long-run")["step"] > before, 120, interval=1, message="progress under the new operator"
    )
    status = jobs.status("long-run")
    assert status["phase"] == "Running" and len(status["attempts"]) == 1
    # The new operator acts on it: suspend checkpoints and stops the attempt.
    cli.kubectl(
        "patch",
        "-n",
        release.namespace,
        "mpj",
        "long-run",
        "--type=merge",
        "-p",
        '{"spec":{"runPolicy":{"suspend":true}}}',
    )
    jobs.wait_phase("long-run", ("Suspended",), 180)


def test_two_ddp_workers_rendezvous_and_resume_after_losing_a_pod(
    release: Release, jobs: Jobs, core: client.CoreV1Api
) -> None:
    jobs.claims("mpjob-checkpoints-shared")
    job = cpu_sized(example("ddp-2workers"), steps=400)
    # At a pace (100 ms a step, 40 s in all): unpaced, on idle cores, the tiny model trained
    # all 400 steps in 5 s, before the test saw its first checkpoint and could take a pod away.
    job["spec"]["task"]["args"]["stepDelay"] = paced(0.1)
    jobs.apply(job)
    service = wait_for(lambda: core.read_namespaced_service("ddp-2workers-a0", release.namespace), 60)
    assert service.spec.cluster_ip == "None", "rendezvous through a headless Service"
    # Both ranks step together (DDP cannot step with one), and a checkpoint is written.
    wait_for(
        lambda: (jobs.status("ddp-2workers").get("lastCheckpoint") or {}).get("step", 0) >= 10,
        300,
        interval=1,
        message="a checkpoint from the two workers",
    )
    pods = jobs.pods("mpjob.dev/job=ddp-2workers,mpjob.dev/attempt=0")
    assert len(pods) == 2 and {p.status.phase for p in pods} == {"Running"}
    worker = next(p for p in pods if p.metadata.annotations["batch.kubernetes.io/job-completion-index"] == "1")
    core.delete_namespaced_pod(worker.metadata.name, release.namespace)

    status = wait_for(
        lambda: len((s := jobs.status("ddp-2workers")).get("attempts", [])) == 2 and s,
        300,
        interval=1,
        message="a second attempt",
    )
    first = status["attempts"][0]
    assert first["reason"] in ("PodDeleted", "Preempted", "InfraError"), first
    status = jobs.wait_phase("ddp-2workers", ("Succeeded", "Failed"), 900)
    assert status["phase"] == "Succeeded", status
    print("attempts:", [(a["precision"], a["reason"], a["startStep"], a.get("endStep")) for a in status["attempts"]])
    first, second = status["attempts"]
    assert first["precision"] == second["precision"] == "bf16", "a lost pod is no reason to change precision"
    assert second["startStep"] >= 10, "resumed from a checkpoint"
    assert len(jobs.pods("mpjob.dev/job=ddp-2workers,mpjob.dev/attempt=1")) == 2


def test_helm_uninstall_removes_the_operator_and_keeps_crd_jobs_and_checkpoints(
    release: Release, jobs: Jobs, cli: Cli, core: client.CoreV1Api, api_client: client.ApiClient
) -> None:
    kept = jobs.listed()
    assert "fp16-recovery" in kept
    before = kept["fp16-recovery"]
    cli.helm("uninstall", release.name, "-n", release.namespace, "--wait")
    release.installed = False
    wait_for(lambda: not operator_pods(core, release.namespace), 120, message="operator pod gone")
    assert not client.AppsV1Api(api_client).list_namespaced_deployment(release.namespace).items
    rbac = client.RbacAuthorizationV1Api(api_client)
    assert not [r for r in rbac.list_namespaced_role(release.namespace).items if r.metadata.name == "mpjob"]
    crd = client.ApiextensionsV1Api(api_client).read_custom_resource_definition("mixedprecisionjobs.mpjob.dev")
    assert crd.metadata.name == "mixedprecisionjobs.mpjob.dev"
    assert jobs.listed().keys() == kept.keys(), "every MixedPrecisionJob outlives the operator"
    # Nothing of the release is left in its namespace (hooks included).
    instance = "app.kubernetes.io/instance=mpjob"
    assert not core.list_namespaced_service_account(release.namespace, label_selector=instance).items
    assert not core.list_namespaced_config_map(release.namespace, label_selector=instance).items
    assert not rbac.list_namespaced_role_binding(release.namespace, label_selector=instance).items
    assert jobs.status("fp16-recovery") == before
    assert core.read_namespaced_persistent_volume_claim("mpjob-checkpoints", release.namespace).status.phase == "Bound"
    last = before["lastCheckpoint"]
    assert jobs.checkpoint_sha256("mpjob-checkpoints", last["path"], release.trainer_image) == last["sha256"]
    # Jobs carry no finalizer: with the operator gone, `kubectl delete mpj` still completes, and
    # garbage collection takes the attempt Jobs while the checkpoint volume stays.
    assert not any(jobs.get(name)["metadata"].get("finalizers") for name in kept)
    cli.kubectl("delete", "-n", release.namespace, "mpj", "fp16-recovery", "--wait=true", "--timeout=60s")
    assert "fp16-recovery" not in jobs.listed()
    wait_for(
        lambda: not core.list_namespaced_pod(release.namespace, label_selector="mpjob.dev/job=fp16-recovery").items,
        120,
        message="attempt pods garbage-collected",
    )
    assert core.read_namespaced_persistent_volume_claim("mpjob-checkpoints", release.namespace).status.phase == "Bound"

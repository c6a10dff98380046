"""The operator on the real control plane, with the node agent running the real trainer."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.helpers import wait_for
from tests.integration.operator.conftest import UNTIL_STOPPED, Jobs, Operator, gpt_spec, pod_events

pytestmark = pytest.mark.integration

OVERFLOW = {"nLayer": 1, "nHead": 2, "nEmbd": 32, "blockSize": 32, "corpusBytes": 20000, "overflowAtStep": 25}


def test_fp16_overflow_falls_back_to_bf16_and_succeeds(
    operator: Operator, jobs: Jobs, namespace: str, cluster_bin: Path, kubeconfig: str
) -> None:
    jobs.pvc("ckpt")
    spec = gpt_spec("ckpt")
    spec["task"]["args"] = OVERFLOW
    spec["precision"]["inPlace"] = False  # the restart path (test_in_place.py has the other)
    jobs.create("recover", spec)
    status = jobs.wait_phase("recover", ("Succeeded", "Failed"), 240)
    assert status["phase"] == "Succeeded", status
    first, second = status["attempts"]
    assert (first["precision"], first["reason"], first["exitCode"]) == ("fp16", "NumericFault", 42)
    assert (second["precision"], second["reason"]) == ("bf16", "Succeeded")
    assert second["startStep"] == 20 > 0
    assert status["precision"] == "bf16" and status["lastCheckpoint"]["step"] == 60
    fallback = next(c for c in status["conditions"] if c["type"] == "PrecisionFallback")
    assert fallback["status"] == "True" and fallback["reason"] == "NumericFault"
    assert jobs.attempt_jobs("recover") == ["recover-a0", "recover-a1"]
    events = jobs.events("recover", "AttemptStarted", "PrecisionFallback", "AttemptEnded", "Succeeded")
    assert {"AttemptStarted", "PrecisionFallback", "AttemptEnded", "Succeeded"} <= {e.reason for e in events}
    kubectl = subprocess.run(
        [str(cluster_bin / "kubectl"), "--kubeconfig", kubeconfig, "-n", namespace, "get", "mpj"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    columns = ["NAME", "PHASE", "PRECISION", "STEP", "LOSS", "SCALE", "ATTEMPT", "WORKERS", "AGE"]
    assert kubectl.split("\n")[0].split() == columns
    assert kubectl.split("\n")[1].split()[:3] == ["recover", "Succeeded", "bf16"]
    # The checkpoint the status names is on the volume, with that sha256.
    manifest = jobs.checkpoints(kubeconfig, "ckpt", "recover") / "step-000000060" / "manifest.json"
    assert status["lastCheckpoint"]["sha256"] in manifest.read_text()


def test_a_deleted_pod_resumes_in_the_same_precision(
    operator: Operator, jobs: Jobs, namespace: str, kubeconfig: str
) -> None:
    jobs.pvc("ckpt")
    spec = gpt_spec("ckpt", steps=UNTIL_STOPPED, every=20)
    spec["precision"] = {"mode": "bf16", "fallback": ["fp32"]}
    jobs.create("evicted", spec)
    volume = jobs.checkpoints(kubeconfig, "ckpt", "evicted")
    wait_for(lambda: list(volume.glob("step-*/manifest.json")), 180, message="a checkpoint")
    pods = jobs.core.list_namespaced_pod(namespace, label_selector="mpjob.dev/job=evicted,mpjob.dev/attempt=0")
    jobs.core.delete_namespaced_pod(pods.items[0].metadata.name, namespace)
    status = wait_for(
        lambda: len((s := jobs.status("evicted")).get("attempts", [])) == 2 and s, 120, message="second attempt"
    )
    first, second = status["attempts"]
    assert first["reason"] in ("Preempted", "PodDeleted") and second["precision"] == "bf16"
    # The trainer decides where it resumes; the operator records it from the trainer's metrics.
    resumed = wait_for(lambda: jobs.status("evicted")["attempts"][1]["startStep"], 60, message="resume step")
    assert resumed >= 20
    wait_for(
        lambda: any(e["event"] == "resume" for e in pod_events(kubeconfig, namespace, "evicted-a1")),
        120,
        message="attempt 1 resumed from a checkpoint",
    )
    jobs.patch_spec("evicted", {"runPolicy": {"suspend": True}})  # stop the long run quickly
    jobs.wait_phase("evicted", "Suspended", 60)


def test_a_task_module_that_does_not_import_fails_without_retry(operator: Operator, jobs: Jobs) -> None:
    jobs.pvc("ckpt")
    spec = gpt_spec("ckpt")
    spec["task"] = {"module": "not_installed.tasks:make_task"}
    jobs.create("broken", spec)
    status = jobs.wait_phase("broken", ("Failed", "Succeeded"), 120)
    assert status["phase"] == "Failed"
    assert len(status["attempts"]) == 1 and status["attempts"][0]["reason"] == "ConfigError"
    assert "not_installed" in status["message"]
    assert jobs.attempt_jobs("broken") == ["broken-a0"]


def test_every_precision_failing_ends_failed(operator: Operator, jobs: Jobs) -> None:
    jobs.pvc("ckpt")
    spec = gpt_spec("ckpt")
    spec["task"]["args"] = {**OVERFLOW, "overflowAtStep": 2, "overflowGain": 1e39}  # beyond fp32's range too
    spec["precision"]["guard"] = {"replaySteps": 0}  # no fp32 replay: each precision is tried
    jobs.create("hopeless", spec)
    status = jobs.wait_phase("hopeless", ("Failed", "Succeeded"), 240)
    assert status["phase"] == "Failed"
    assert [a["precision"] for a in status["attempts"]] == ["fp16", "bf16", "fp32"]
    assert all(a["reason"] == "NumericFault" for a in status["attempts"])
    failed = next(c for c in status["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == "NoPrecisionLeft" and "fp32" in failed["message"]


def test_operator_killed_at_any_point_never_duplicates_an_attempt(operator: Operator, jobs: Jobs) -> None:
    jobs.pvc("ckpt")
    spec = gpt_spec("ckpt", steps=60)
    spec["task"]["args"] = OVERFLOW
    jobs.create("sturdy", spec)
    wait_for(lambda: jobs.attempt_jobs("sturdy"), 60, message="first Job")
    operator.kill()  # right after the first attempt was created
    operator.start()
    wait_for(lambda: len(jobs.status("sturdy").get("attempts", [])) == 2, 180, message="fallback attempt")
    operator.kill()  # right after the fallback
    operator.start()
    status = jobs.wait_phase("sturdy", ("Succeeded", "Failed"), 240)
    assert status["phase"] == "Succeeded"
    assert [(a["index"], a.get("inPlace")) for a in status["attempts"]] == [(0, None), (1, True)]
    assert jobs.attempt_jobs("sturdy") == ["sturdy-a0"]  # the fallback was made in place


def test_suspend_then_resume_continues_from_the_checkpoint(
    operator: Operator, jobs: Jobs, namespace: str, kubeconfig: str
) -> None:
    jobs.pvc("ckpt")
    spec = gpt_spec("ckpt", steps=UNTIL_STOPPED, every=20)
    spec["precision"] = {"mode": "bf16"}
    jobs.create("pausable", spec)
    volume = jobs.checkpoints(kubeconfig, "ckpt", "pausable")
    wait_for(lambda: list(volume.glob("step-*/manifest.json")), 120, message="a checkpoint")
    jobs.patch_spec("pausable", {"runPolicy": {"suspend": True}})
    status = jobs.wait_phase("pausable", "Suspended", 60)
    assert status["attempts"][0]["reason"] == "Suspended"
    wait_for(lambda: not jobs.attempt_jobs("pausable"), 60, message="attempt Job removed")
    # The pod checkpoints on SIGTERM after its Job is gone: read the volume once the pod stopped.
    selector = "mpjob.dev/job=pausable"
    pods = jobs.core.list_namespaced_pod
    wait_for(lambda: not pods(namespace, label_selector=selector).items, 60, message="attempt pod gone")
    stopped = max(int(p.parent.name.split("-")[1]) for p in volume.glob("step-*/manifest.json"))
    assert stopped >= 20
    jobs.patch_spec("pausable", {"runPolicy": {"suspend": False}, "training": {"steps": stopped + 20}})
    status = jobs.wait_phase("pausable", "Succeeded", 240)
    assert [a["precision"] for a in status["attempts"]] == ["bf16", "bf16"]
    assert status["attempts"][1]["startStep"] == stopped  # resumed from the SIGTERM checkpoint


def test_a_suspended_attempt_ends_where_its_trainer_stopped(
    operator: Operator, jobs: Jobs, namespace: str, kubeconfig: str
) -> None:
    """The suspension ends the attempt at once; its trainer checkpoints on SIGTERM afterwards and
    reports that step when it stops: the attempt's endStep and the job's lastCheckpoint say it."""
    jobs.pvc("ckpt")
    spec = gpt_spec("ckpt", steps=UNTIL_STOPPED, every=20)
    spec["precision"] = {"mode": "bf16"}
    jobs.create("halted", spec)
    jobs.wait_status("halted", lambda s: (s.get("lastCheckpoint") or {}).get("step", 0) >= 20, 120, "a checkpoint")
    jobs.patch_spec("halted", {"runPolicy": {"suspend": True}})
    jobs.wait_phase("halted", "Suspended", 60)
    pods = jobs.core.list_namespaced_pod
    wait_for(lambda: not pods(namespace, label_selector="mpjob.dev/job=halted").items, 60, message="attempt pod gone")
    volume = jobs.checkpoints(kubeconfig, "ckpt", "halted")
    stopped = max(int(p.parent.name.split("-")[1]) for p in volume.glob("step-*/manifest.json"))
    status = jobs.wait_status(
        "halted", lambda s: s["attempts"][0].get("endStep") == stopped, 30, f"attempt 0 ended at step {stopped}"
    )
    assert (status["lastCheckpoint"]["step"], status["step"], status["phase"]) == (stopped, stopped, "Suspended")


def test_ttl_removes_children_and_keeps_the_job(operator: Operator, jobs: Jobs) -> None:
    jobs.pvc("ckpt")
    spec = gpt_spec("ckpt", steps=10)
    spec["precision"] = {"mode": "bf16"}
    spec["runPolicy"] = {"ttlSecondsAfterFinished": 2}
    jobs.create("short", spec)
    jobs.wait_phase("short", "Succeeded", 120)
    wait_for(lambda: not jobs.attempt_jobs("short"), 60, message="children removed after the TTL")
    assert jobs.status("short")["phase"] == "Succeeded"
    assert jobs.core.read_namespaced_persistent_volume_claim("ckpt", jobs.namespace)  # user data kept


def test_deleting_the_job_removes_its_children_but_not_the_volume(operator: Operator, jobs: Jobs) -> None:
    jobs.pvc("ckpt")
    spec = gpt_spec("ckpt", steps=UNTIL_STOPPED, every=50)
    spec["precision"] = {"mode": "bf16"}
    jobs.create("doomed", spec)
    wait_for(lambda: jobs.attempt_jobs("doomed"), 60, message="attempt Job")
    jobs.custom.delete_namespaced_custom_object(
        "mpjob.dev", "v1alpha1", jobs.namespace, "mixedprecisionjobs", "doomed", propagation_policy="Foreground"
    )

    def children() -> list[str]:
        services = jobs.core.list_namespaced_service(jobs.namespace, label_selector="mpjob.dev/job=doomed").items
        return jobs.attempt_jobs("doomed") + [s.metadata.name for s in services]

    wait_for(lambda: not children(), 120, message="children garbage-collected")
    assert jobs.core.read_namespaced_persistent_volume_claim("ckpt", jobs.namespace)


def test_a_job_carries_no_finalizer_and_deletes_with_the_operator_gone(operator: Operator, jobs: Jobs) -> None:
    """The periodic tick is an index plus one loop, not a kopf timer (which would put a finalizer on
    every job): after `helm uninstall` a job still deletes, and its children follow."""
    jobs.pvc("ckpt")
    spec = gpt_spec("ckpt", steps=UNTIL_STOPPED, every=50)
    spec["precision"] = {"mode": "bf16"}
    jobs.create("orphan", spec)
    # Live progress comes from the ticker: it runs without a timer's finalizer.
    wait_for(lambda: jobs.status("orphan").get("step", 0) > 0, 120, message="live progress from the ticker")
    assert not jobs.get("orphan")["metadata"].get("finalizers")
    operator.stop()
    jobs.custom.delete_namespaced_custom_object(
        "mpjob.dev", "v1alpha1", jobs.namespace, "mixedprecisionjobs", "orphan", propagation_policy="Background"
    )

    def gone() -> bool:
        return not any(
            i["metadata"]["name"] == "orphan"
            for i in jobs.custom.list_namespaced_custom_object(
                "mpjob.dev", "v1alpha1", jobs.namespace, "mixedprecisionjobs"
            )["items"]
        )

    wait_for(gone, 30, message="the job deleted with no operator running")
    wait_for(lambda: not jobs.attempt_jobs("orphan"), 120, message="children garbage-collected")
    assert jobs.core.read_namespaced_persistent_volume_claim("ckpt", jobs.namespace)

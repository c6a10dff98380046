"""Pods the scheduler finds no node for: before, the job only said "waiting for its pods" for as
long as that lasted (a claim that does not exist, more GPUs than any node has, a nodeSelector no
node matches). Now PodsScheduled=False carries the scheduler's words and names the spec's field
to change, a Warning Event says it once per change, and the condition turns True once placed."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from mpjob.controller.records import pod_view
from mpjob.planning.reconcile import JobView, PodView, reconcile
from mpjob.planning.scheduling import fix
from mpjob_contract.api import MixedPrecisionJobSpec, MixedPrecisionJobStatus

pytestmark = pytest.mark.unit
T0 = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
NO_CLAIM = '0/7 nodes are available: persistentvolumeclaim "ckpt" not found. not found'
NO_GPUS = "0/2 nodes are available: 1 Insufficient nvidia.com/gpu, 1 node(s) had untolerated taint {gpu: present}."
NO_MATCH = "0/2 nodes are available: 2 node(s) didn't match Pod's node affinity/selector."


def spec(**over: object) -> MixedPrecisionJobSpec:
    base = {
        "task": {"builtin": "gpt"},
        "precision": {"mode": "fp16"},
        "resources": {"gpusPerWorker": 12},
        "checkpoint": {"volume": {"persistentVolumeClaim": {"claimName": "ckpt"}}},
        "template": {"nodeSelector": {"pool": "nowhere"}},
    }
    return MixedPrecisionJobSpec.model_validate({**base, **over})


def pending(said: str | None) -> dict[int, JobView]:
    since = "2026-11-22T12:00:01Z"
    pod = PodView("j-a0-0-x", 0, "Pending", alive=True, unschedulable_since=since, unschedulable_message=said)
    return {0: JobView(0, pods=(pod,))}


def condition(status: MixedPrecisionJobStatus, type_: str) -> tuple[str, str, str] | None:
    found = next((c for c in status.conditions if c.type == type_), None)
    return (found.status, found.reason, found.message) if found else None


def started() -> MixedPrecisionJobStatus:
    return reconcile(spec(), MixedPrecisionJobStatus(), 1, {}, T0).status


def test_an_unschedulable_pod_is_said_at_once_with_the_field_to_change_and_once() -> None:
    plan = reconcile(spec(), started(), 1, pending(NO_CLAIM), T0 + timedelta(seconds=5))
    assert plan.status.phase == "Pending"
    found = condition(plan.status, "PodsScheduled")
    assert found is not None and found[:2] == ("False", "Unschedulable"), found
    assert NO_CLAIM in found[2] and "checkpoint.volume.persistentVolumeClaim.claimName" in found[2]
    assert "'ckpt'" in found[2] and "does not exist" in found[2]
    assert [(e.type, e.reason, e.message) for e in plan.events] == [("Warning", "Unschedulable", found[2])]
    again = reconcile(spec(), plan.status, 1, pending(NO_CLAIM), T0 + timedelta(seconds=10))
    assert again.events == [] and again.status == plan.status  # said once, the job keeps waiting


def test_the_condition_turns_true_once_the_pod_is_placed() -> None:
    status = reconcile(spec(), started(), 1, pending(NO_GPUS), T0).status
    placed = {0: JobView(0, pods=(PodView("j-a0-0-x", 0, "Running", alive=True),))}
    plan = reconcile(spec(), status, 1, placed, T0 + timedelta(seconds=30))
    assert plan.status.phase == "Running"
    assert condition(plan.status, "PodsScheduled") == ("True", "PodsScheduled", "attempt 0's pods were scheduled")


def test_a_job_whose_pods_were_placed_at_once_carries_no_such_condition() -> None:
    placed = {0: JobView(0, pods=(PodView("j-a0-0-x", 0, "Pending", alive=True),))}
    assert condition(reconcile(spec(), started(), 1, placed, T0).status, "PodsScheduled") is None


@pytest.mark.parametrize(
    ("said", "named"),
    [
        (NO_GPUS, "resources.gpusPerWorker=12"),
        ("0/2 nodes are available: 2 node(s) had untolerated taint {gpu: present}.", "template.tolerations"),
        (NO_MATCH, "template.nodeSelector={'pool': 'nowhere'}"),
        ("0/1 nodes are available: 1 Insufficient memory.", "resources.requests"),
        ('0/1 nodes are available: persistentvolumeclaim "data" not found.', "'data' (template.volumes)"),
    ],
)
def test_the_fix_names_the_field_that_asks_for_what_no_node_has(said: str, named: str) -> None:
    assert named in fix(spec(), said)


def test_a_node_short_of_a_resource_is_the_fix_not_other_nodes_selector_or_taints() -> None:
    said = fix(spec(), NO_GPUS + " 1 node(s) didn't match Pod's node affinity/selector.")
    assert "gpusPerWorker" in said and "nodeSelector" not in said and "tolerations" not in said


def test_a_message_the_spec_cannot_change_is_said_as_it_is() -> None:
    assert fix(spec(), "0/1 nodes are available: 1 node(s) were unschedulable.") == ""
    plan = reconcile(spec(), started(), 1, pending(None), T0)
    found = condition(plan.status, "PodsScheduled")
    assert found is not None and found[2] == "attempt 0: the scheduler finds no node for pod j-a0-0-x: no reason given"


def test_the_pod_view_keeps_the_schedulers_and_the_kubelets_words() -> None:
    index = {"batch.kubernetes.io/job-completion-index": "0"}
    placed = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": NO_GPUS}
    waiting = {"reason": "CreateContainerConfigError", "message": 'secret "keys" not found'}
    trainer = {"name": "trainer", "state": {"waiting": waiting}}
    asks = {"name": "trainer", "resources": {"limits": {"nvidia.com/gpu": "16"}}}
    body = {
        "metadata": {"name": "j-a0-0-x", "annotations": index},
        "spec": {"containers": [asks]},
        "status": {"phase": "Pending", "conditions": [placed], "containerStatuses": [trainer]},
    }
    view = pod_view(body)
    assert (view.unschedulable_message, view.config_error, view.alive) == (NO_GPUS, 'secret "keys" not found', True)
    assert view.gpus == 16


@pytest.mark.parametrize("generation", [None, 1], ids=["job-of-an-older-operator", "a-trainer-started"])
def test_a_pod_made_before_an_edit_of_gpus_per_worker_is_said_short_of_what_it_asks(generation: int | None) -> None:
    """Before, the hint was worded from the spec as it is: after an edit from 16 to 8 GPUs that the
    attempt's Job does not ask yet (a Job with no spec generation, or one a trainer of which already
    started: neither is made again), it said no node had 8 GPUs free and to lower it."""
    since = "2026-11-22T12:00:01Z"
    waits = PodView("j-a0-1-x", 1, "Pending", True, unschedulable_since=since, unschedulable_message=NO_GPUS, gpus=16)
    runs = PodView("j-a0-0-x", 0, "Running", True, started_at=since, gpus=16)
    edited = spec(resources={"gpusPerWorker": 8}, workers=2)
    status = reconcile(spec(workers=2), MixedPrecisionJobStatus(), 1, {}, T0).status
    plan = reconcile(edited, status, 2, {0: JobView(0, pods=(runs, waits), generation=generation)}, T0)
    found = condition(plan.status, "PodsScheduled")
    assert found is not None and found[0] == "False", found
    assert found[2].endswith(
        "no node has the 16 GPUs the pod asks free (its Job was made when resources.gpusPerWorker was 16; "
        "the spec's 8 is not asked by its pods yet): add GPU nodes"
    )
    assert plan.delete == [], "the Job is kept: a trainer of it started, or its generation is not known"
    same = "no node has resources.gpusPerWorker=8 GPUs free: lower it, or add GPU nodes"
    assert fix(edited, NO_GPUS, asked=8) == fix(edited, NO_GPUS) == same  # asks what the spec says, or not known


@pytest.mark.parametrize(
    ("edit", "phase"),
    [({"runPolicy": {"activeDeadlineSeconds": 60}}, "Failed"), ({"runPolicy": {"suspend": True}}, "Suspended")],
    ids=["past-its-deadline", "suspended"],
)
def test_a_job_that_stops_while_its_pods_find_no_node_no_longer_says_they_wait(edit: dict, phase: str) -> None:
    """A job that ended (or was suspended) while its pods were unschedulable kept PodsScheduled=False,
    reason Unschedulable, for good; now settled as AwaitingWorkers is: reason the phase, Unknown
    (its pods were never placed: True would claim what was not seen)."""
    waiting = reconcile(spec(), started(), 1, pending(NO_CLAIM), T0 + timedelta(seconds=5)).status
    stopped = reconcile(spec(**edit), waiting, 2, pending(NO_CLAIM), T0 + timedelta(seconds=70))
    assert stopped.status.phase == phase
    said = condition(stopped.status, "PodsScheduled")
    assert said == ("Unknown", phase, f"attempt 0 no longer waits for a node: the job is {phase}"), said
    assert all(e.reason != "Unschedulable" for e in stopped.events)


@pytest.mark.parametrize(
    ("waiting", "kind"),
    [(pending(NO_CLAIM), "PodsScheduled"), ({0: JobView(0, create_error='exceeded quota: "gpus"')}, "PodsCreated")],
    ids=["unschedulable", "not-created"],
)
def test_a_resumed_attempts_pods_placed_turn_the_condition_a_suspension_left_unknown_true(
    waiting: dict[int, JobView], kind: str
) -> None:
    """Suspended while its pods waited, the condition went Unknown; the resumed attempt's pods,
    made and placed at once, say so where the Unknown would have stayed."""
    stuck = reconcile(spec(), started(), 1, waiting, T0 + timedelta(seconds=5)).status
    assert condition(stuck, kind) is not None and condition(stuck, kind)[0] == "False"  # type: ignore[index]
    held = reconcile(spec(runPolicy={"suspend": True}), stuck, 2, waiting, T0 + timedelta(seconds=10)).status
    assert condition(held, kind) is not None and condition(held, kind)[:2] == ("Unknown", "Suspended")  # type: ignore[index]
    resumed = reconcile(spec(), held, 3, {}, T0 + timedelta(seconds=20)).status
    assert [a.index for a in resumed.attempts] == [0, 1] and condition(resumed, kind)[0] == "Unknown"  # type: ignore[index]
    placed = {1: JobView(1, pods=(PodView("j-a1-0-x", 0, "Running", alive=True),))}
    plan = reconcile(spec(), resumed, 3, placed, T0 + timedelta(seconds=30))
    assert plan.status.phase == "Running"
    said = "scheduled" if kind == "PodsScheduled" else "created"
    assert condition(plan.status, kind) == ("True", kind, f"attempt 1's pods were {said}")

"""A trainer image the kubelet cannot pull: before, the first ErrImagePull (a registry that
throttled once, a tag pushed a minute late) failed the job for good. Now the pod waits as the
kubelet tries again: PodsCreated=False, reason ImagePullBackOff, in the kubelet's words and naming
where the image comes from; the job runs once a pull succeeds, and fails after
runPolicy.podCreationTimeoutSeconds when none does. A name the kubelet cannot parse
(InvalidImageName), which it never tries again, still fails the job at once."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from mpjob.controller.records import pod_view
from mpjob.planning.reconcile import JobView, PodView, reconcile
from mpjob_contract.api import MixedPrecisionJobSpec, MixedPrecisionJobStatus

pytestmark = pytest.mark.unit
T0 = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)
IMAGE = "registry.example:5000/team/trainer:2"
PULL = f'failed to pull and unpack image "{IMAGE}": unexpected status from HEAD request: 429 Too Many Requests'


def spec(image: str | None = IMAGE) -> MixedPrecisionJobSpec:
    body: dict[str, Any] = {"task": {"builtin": "gpt"}, "precision": {"mode": "fp16"}}
    body["runPolicy"] = {"podCreationTimeoutSeconds": 60}
    return MixedPrecisionJobSpec.model_validate({**body, **({"image": image} if image else {})})


def pod(reason: str, message: str | None) -> dict[str, Any]:
    waiting = {"reason": reason, **({"message": message} if message else {})}
    return {
        "metadata": {"name": "j-a0-0-x", "annotations": {"batch.kubernetes.io/job-completion-index": "0"}},
        "status": {"phase": "Pending", "containerStatuses": [{"name": "trainer", "state": {"waiting": waiting}}]},
    }


def waiting(view: PodView) -> dict[int, JobView]:
    return {0: JobView(0, pods=(view,))}


def started(s: MixedPrecisionJobSpec) -> MixedPrecisionJobStatus:
    return reconcile(s, MixedPrecisionJobStatus(), 1, {}, T0).status


def pods_created(status: MixedPrecisionJobStatus) -> tuple[str, str, str]:
    found = next(c for c in status.conditions if c.type == "PodsCreated")
    return found.status, found.reason, found.message


@pytest.mark.parametrize(
    ("reason", "message", "words"),
    [
        ("ErrImagePull", PULL, PULL),
        ("ImagePullBackOff", f'Back-off pulling image "{IMAGE}": ErrImagePull: {PULL}', PULL),  # 1.31 and later
        ("ImagePullBackOff", f'Back-off pulling image "{IMAGE}"', f'Back-off pulling image "{IMAGE}"'),
        ("ErrImagePull", None, "ErrImagePull"),
    ],
    ids=["pulling", "backing-off", "backing-off-before-1.31", "no-words"],
)
def test_a_pull_the_kubelet_tries_again_leaves_the_pod_alive_with_its_words(
    reason: str, message: str | None, words: str
) -> None:
    view = pod_view(pod(reason, message))
    assert (view.alive, view.platform_reason, view.image_error) == (True, None, words)


def test_a_name_the_kubelet_cannot_parse_ends_the_pod() -> None:
    view = pod_view(pod("InvalidImageName", 'couldn\'t parse image name "Bad"'))
    assert (view.alive, view.platform_reason) == (False, "InvalidImageName")


def test_a_failing_pull_is_said_at_once_and_once_while_the_job_waits() -> None:
    s = spec()
    first = pod_view(pod("ErrImagePull", PULL))
    plan = reconcile(s, started(s), 1, waiting(first), T0 + timedelta(seconds=5))
    said = pods_created(plan.status)
    assert plan.status.phase == "Pending" and said[:2] == ("False", "ImagePullBackOff"), plan.status
    assert PULL in said[2] and f"spec.image={IMAGE!r}" in said[2] and "imagePullSecrets" in said[2]
    assert [(e.type, e.reason) for e in plan.events] == [("Warning", "ImagePullBackOff")]
    assert plan.status.attempts[-1].finish_time is None and plan.delete == []
    backing_off = pod_view(pod("ImagePullBackOff", f'Back-off pulling image "{IMAGE}": ErrImagePull: {PULL}'))
    again = reconcile(s, plan.status, 1, waiting(backing_off), T0 + timedelta(seconds=20))
    assert again.events == [] and again.status == plan.status  # the kubelet's retry is no news


def test_an_image_of_the_operators_default_says_spec_image_is_unset() -> None:
    s = spec(image=None)
    plan = reconcile(s, started(s), 1, waiting(pod_view(pod("ErrImagePull", PULL))), T0 + timedelta(seconds=5))
    assert "the operator's default (spec.image unset)" in pods_created(plan.status)[2]


def test_the_job_runs_once_the_pull_succeeds_in_the_same_attempt() -> None:
    s = spec()
    status = reconcile(s, started(s), 1, waiting(pod_view(pod("ErrImagePull", PULL))), T0).status
    runs = PodView("j-a0-0-x", 0, "Running", alive=True, started_at="2026-12-03T12:02:00Z")
    plan = reconcile(s, status, 1, waiting(runs), T0 + timedelta(seconds=40))
    assert plan.status.phase == "Running" and pods_created(plan.status)[0] == "True"
    assert len(plan.status.attempts) == 1 and plan.status.attempts[0].finish_time is None


def test_a_pull_failing_past_the_pod_creation_timeout_fails_the_job_with_the_kubelets_words() -> None:
    s = spec()
    held = waiting(pod_view(pod("ImagePullBackOff", f'Back-off pulling image "{IMAGE}": ErrImagePull: {PULL}')))
    status = reconcile(s, started(s), 1, held, T0 + timedelta(seconds=59)).status
    assert status.phase == "Pending"
    plan = reconcile(s, status, 1, held, T0 + timedelta(seconds=60))
    assert plan.status.phase == "Failed" and PULL in (plan.status.message or "")
    assert "podCreationTimeoutSeconds=60" in (plan.status.message or "")


def test_an_image_name_the_kubelet_cannot_parse_fails_the_job_at_once() -> None:
    s = spec()
    view = pod_view(pod("InvalidImageName", 'couldn\'t parse image name "Bad"'))
    plan = reconcile(s, started(s), 1, waiting(view), T0 + timedelta(seconds=5))
    assert plan.status.attempts[0].reason == "ImagePullError" and plan.status.phase == "Failed", plan.status
    assert 'couldn\'t parse image name "Bad"' in (plan.status.message or "")  # the kubelet's words

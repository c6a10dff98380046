"""runPolicy.progressDeadlineSeconds on the real control plane: an attempt whose data loader
hangs at step 25 (its metrics endpoint answers on, showing a step that no longer moves) is
ended Stalled once its step has stood still 30 s as the operator's reads saw (counted from the
progressTime its status keeps, also across an operator restart), its pod cut
(deleted, before its Job, with cutoff.CUT_GRACE_SECONDS: SIGKILL comes 10 s after SIGTERM, not
60, since the hung rank cannot act on SIGTERM), and the next attempt goes on in the same precision from the step-20
checkpoint to Succeeded. And a rank that crashes while its peer cannot act on SIGTERM: the
peer's pod is cut too, rather than left the grace period the Job controller's deletion gives it."""

from __future__ import annotations

import contextlib
import re
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, watch

from mpjob.planning.cutoff import CUT_GRACE_SECONDS
from mpjob.planning.status import read_stamp
from tests.helpers import free_port, paced, wait_for
from tests.integration.operator.conftest import Jobs, Operator, operator_samples
from tests.integration.operator.test_status_command import mpjob_status
from tests.unit.localrun.stall_task import SPEC, stalled_then_retried

pytestmark = pytest.mark.integration

CLAIM = {"persistentVolumeClaim": {"claimName": "ckpt"}}


@contextlib.contextmanager
def deletion_graces(api_client: client.ApiClient, namespace: str) -> Iterator[dict[str, list[int]]]:
    """Each pod of `namespace` deleted meanwhile -> the grace periods it was deleted with, in the
    order the API server's watch showed them (every change; the node's last removal is a 0)."""
    graces: dict[str, list[int]] = {}
    pods, stream, stopping = client.CoreV1Api(api_client), watch.Watch(), threading.Event()

    def follow() -> None:
        try:
            for event in stream.stream(pods.list_namespaced_pod, namespace, timeout_seconds=600):
                meta = event["object"].metadata
                seen = graces.setdefault(meta.name, [])
                if meta.deletion_grace_period_seconds is not None and meta.deletion_grace_period_seconds not in seen:
                    seen.append(meta.deletion_grace_period_seconds)
        except Exception:
            if not stopping.is_set():  # stopping closes the stream under the read
                raise

    watcher = threading.Thread(target=follow, daemon=True)
    watcher.start()
    try:
        yield graces
    finally:
        stopping.set()
        stream.stop()


def progress_time(status: dict[str, Any]) -> str | None:
    return status["attempts"][-1].get("progressTime")


def away_past_deadline(status: dict[str, Any]) -> datetime:
    """With no operator running, wait until the 30 s deadline has passed since the progressTime
    `status` shows; the moment it has."""
    since = read_stamp(progress_time(status) or "")
    wait_for(lambda: datetime.now(UTC) >= since + timedelta(seconds=31), 60, message="the deadline passed")
    return datetime.now(UTC)


def test_an_attempt_whose_step_stands_still_past_its_deadline_is_cut_and_retried(
    kubeconfig: str, jobs: Jobs, api_client: client.ApiClient, namespace: str, crd_installed: None, tmp_path: Path
) -> None:
    """Three operators in turn, no operator running for a deadline between them. The first is
    stopped a few steps in (steps of 0.5 s): while none looks, the step moves on to 25 and hangs.
    The second must not judge a stall on the first's 31-s-old progressTime: its own first reading
    shows the step moved, and it is stopped once it has recorded that. The third finds the step
    where the second saw it a deadline ago (`mpjob status` says how long ago it moved) and ends
    the attempt at once, rather than counting 30 s anew from its own first reading."""
    jobs.pvc("ckpt")
    args = {**SPEC["task"]["args"], "stepDelay": paced(0.5)}
    spec = {**SPEC, "task": {**SPEC["task"], "args": args}, "checkpoint": {**SPEC["checkpoint"], "volume": CLAIM}}
    port, log = free_port(), tmp_path / "operator.log"
    with deletion_graces(api_client, namespace) as graces:
        with Operator.running(kubeconfig, namespace, log):
            jobs.create("hung", spec)
            first = jobs.wait_status("hung", lambda s: s.get("step", 0) >= 3 and progress_time(s), 120, "step 3")
        back = away_past_deadline(first)
        with Operator.running(kubeconfig, namespace, log):
            seen = jobs.wait_status(
                "hung",
                lambda s: len(s["attempts"]) > 1 or (s["step"] == 25 and progress_time(s) != progress_time(first)),
                60,
                "the second operator's own reading of step 25",
            )
        assert len(seen["attempts"]) == 1 and "finishTime" not in seen["attempts"][0], seen["attempts"]
        assert read_stamp(progress_time(seen) or "") >= back - timedelta(seconds=1), (back, seen["attempts"])
        restarted = away_past_deadline(seen)
        told = mpjob_status("hung", "-n", namespace, "--kubeconfig", kubeconfig)
        (line,) = [line for line in told.stdout.splitlines() if line.startswith("  attempt 0:")]
        ago = re.fullmatch(r"  attempt 0: bf16 steps 0-\? running, its step last moved (\d+) s ago", line)
        assert ago and int(ago[1]) >= 30, line
        with Operator.running(kubeconfig, namespace, log, metrics_port=port):
            status = jobs.wait_phase("hung", ("Succeeded", "Failed"), 300)
            assert operator_samples(port, "mpjob_operator_pods_cut_total ") == {"mpjob_operator_pods_cut_total": 1.0}
    stalled_then_retried(status, "rank 0's metrics")
    judged = read_stamp(status["attempts"][0]["finishTime"]) - restarted
    assert judged < timedelta(seconds=15), (judged, status["attempts"][0])
    (said,) = [e for e in jobs.events("hung", "RanksCut") if e.reason == "RanksCut"]
    assert said.message.startswith("hung-a0-0-") and "10-s grace" in said.message, said.message
    (cut,) = [seen for name, seen in graces.items() if name.startswith("hung-a0-")]
    # Its first deletion (the one a kubelet keeps) was the cut, not its Job's with its own 60 s:
    # a hung rank cannot checkpoint. (0: the node removes the pod once it has stopped.)
    assert cut[0] == CUT_GRACE_SECONDS, graces


def test_a_peer_of_a_rank_that_crashed_is_cut_not_left_its_grace_period(
    operator: Operator, jobs: Jobs, api_client: client.ApiClient, namespace: str
) -> None:
    """Both ranks fetch step 26's batch: rank 1 crashes there (exit 1: the Job fails), rank 0
    hangs there, where SIGTERM cannot reach it, as a rank blocked on a dead peer in NCCL."""
    jobs.pvc("ckpt")
    args = {**SPEC["task"]["args"], "crashAfter": {"0": 25 * 4}}
    spec = {**SPEC, "workers": 2, "task": {**SPEC["task"], "args": args}, "runPolicy": {}}
    with deletion_graces(api_client, namespace) as graces:
        jobs.create("crash", {**spec, "checkpoint": {**SPEC["checkpoint"], "volume": CLAIM}})
        status = jobs.wait_phase("crash", ("Succeeded", "Failed"), 300)
    assert (status["phase"], status["step"]) == ("Succeeded", 40), status
    first, second = status["attempts"]
    assert (first["reason"], first["endStep"]) == ("InfraError", 25), first
    assert (second["precision"], second["startStep"], second["reason"]) == ("bf16", 20, "Succeeded"), second
    (cut,) = [seen for name, seen in graces.items() if name.startswith("crash-a0-0-")]
    # Cut, where the Job controller's own deletion gives 60 s; the two race (cutoff's module doc),
    # so which came first is not asserted.
    assert CUT_GRACE_SECONDS in cut, graces

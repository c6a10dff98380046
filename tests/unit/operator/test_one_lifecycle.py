"""One lifecycle: the same attempt endings through the operator's reconcile and through
`mpjob run`'s path give the same attempts[], phase and conditions.

The operator side is the pure reconcile over observed Jobs and pods (plain data). The local
side is the real LocalRun with only its process start replaced: each attempt "runs" by
returning the scripted pods' outcome, read by the same `outcome_of` the runner uses.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from mpjob.localrun.runner import LocalRun
from mpjob.localrun.stops import Stop
from mpjob.planning.classify import AttemptOutcome
from mpjob.planning.planner import StartAttempt
from mpjob.planning.reconcile import JobView, PodView, outcome_of, reconcile
from mpjob_contract.api import MixedPrecisionJob, MixedPrecisionJobSpec, MixedPrecisionJobStatus
from mpjob_contract.codes import Reason
from mpjob_contract.report import CheckpointRef, TerminationReport
from tests.unit.operator.cases import CLAIM

pytestmark = pytest.mark.unit
T0 = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
SUSPEND = "suspend"


def report(reason: Reason, step: int, ckpt: int | None) -> str:
    """A report that does not say where its attempt began (startStep unset): the plan's start stands."""
    ref = CheckpointRef(step=ckpt, path=f"/c/step-{ckpt}", sha256="ab", precision="fp16") if ckpt else None
    ended = TerminationReport(reason=reason, step=step, precision="fp16", last_good_checkpoint=ref, message="m")
    return ended.to_message()


def pod(
    code: int | None,
    message: str | None = None,
    *,
    index: int = 0,
    deleting: bool = False,
    platform: str | None = None,
) -> PodView:
    phase = "Succeeded" if code == 0 else "Failed"
    return PodView(f"p{index}", index, phase, False, code, message, platform_reason=platform, deleting=deleting)


OK = (pod(0, report(Reason.SUCCEEDED, 60, 60)),)
FAULT = (pod(42, report(Reason.NUMERIC_FAULT, 30, 20)),)
PREEMPTED = (pod(44, report(Reason.PREEMPTED, 40, 40)),)
# Evicted: the pod's DisruptionTarget condition (the cluster's word), the trainer checkpointed on SIGTERM.
EVICTED = (pod(44, report(Reason.PREEMPTED, 40, 40), platform="EvictionByEvictionAPI"),)
DELETED = (pod(137, deleting=True),)
CONFIG = (pod(43, report(Reason.CONFIG_ERROR, 0, None)),)
# Two workers: worker 1 faults, worker 0 was stopped by the launcher after it.
FAULT_2 = (pod(44, report(Reason.PREEMPTED, 30, 20)), pod(42, report(Reason.NUMERIC_FAULT, 30, 20), index=1))

SCENARIOS: dict[str, tuple[dict[str, Any], list[Any]]] = {
    "success": ({}, [OK]),
    "numeric-fault-then-success": ({}, [FAULT, OK]),
    "preempted-then-success": ({}, [PREEMPTED, OK]),
    "deleted-pod-then-success": ({}, [DELETED, OK]),
    "config-error": ({}, [CONFIG]),
    "every-precision-failing": ({}, [FAULT, FAULT, FAULT]),
    "attempts-exhausted": ({"runPolicy": {"maxAttempts": 2}}, [DELETED, DELETED]),
    "disruptions-use-no-attempt": ({"runPolicy": {"maxAttempts": 2}}, [EVICTED, EVICTED, EVICTED, OK]),
    "self-reported-preemptions-are-charged": ({"runPolicy": {"maxAttempts": 2}}, [PREEMPTED, PREEMPTED]),
    "suspensions-use-no-attempt": ({"runPolicy": {"maxAttempts": 2}}, [SUSPEND, SUSPEND, SUSPEND, OK]),
    "two-workers-one-faults": ({"workers": 2}, [FAULT_2, OK]),
    "suspend-then-resume": ({}, [SUSPEND, OK]),
}


def job_spec(**over: Any) -> MixedPrecisionJobSpec:
    base = {
        "task": {"builtin": "gpt"},
        "precision": {"mode": "fp16", "fallback": ["bf16", "fp32"]},
        "resources": {"gpusPerWorker": 0},
        "checkpoint": CLAIM,  # a new Job reaches the checkpoints, as a local run's new processes do
    }
    return MixedPrecisionJobSpec.model_validate({**base, **over})


def through_the_operator(spec: MixedPrecisionJobSpec, endings: list[Any]) -> MixedPrecisionJobStatus:
    status, now, gen = MixedPrecisionJobStatus(), T0, 1
    status = reconcile(spec, status, gen, {}, now).status
    for ending in endings:
        now += timedelta(seconds=10)
        index = status.attempts[-1].index
        if ending == SUSPEND:
            suspended = spec.model_copy(update={"run_policy": spec.run_policy.model_copy(update={"suspend": True})})
            status = reconcile(suspended, status, gen + 1, {index: JobView(index)}, now).status
            status = reconcile(spec, status, gen + 2, {}, now).status
            continue
        finished = "Complete" if all(p.exit_code == 0 for p in ending) else "Failed"
        status = reconcile(spec, status, gen, {index: JobView(index, finished, pods=ending)}, now).status
    return status


class ScriptedRun(LocalRun):
    """LocalRun whose attempts end as scripted instead of starting trainer processes."""

    def __init__(self, spec: MixedPrecisionJobSpec, out: Path, endings: list[Any]) -> None:
        job = MixedPrecisionJob.model_validate(
            {"apiVersion": "mpjob.dev/v1alpha1", "kind": "MixedPrecisionJob", "metadata": {"name": "j"}, "spec": spec}
        )
        super().__init__(job, out, _QuietView())
        self.endings = list(endings)

    def _run_attempt(self, start: StartAttempt) -> AttemptOutcome:
        ending = self.endings.pop(0)
        if ending == SUSPEND:  # Ctrl-C: the trainer was asked to stop and left before it wrote a report
            self.ctrl_c.stop = Stop.ASKED
            return AttemptOutcome(exit_code=44)
        return outcome_of(JobView(start.index, pods=ending))


class _QuietView:
    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: None


def through_mpjob_run(spec: MixedPrecisionJobSpec, endings: list[Any], out: Path) -> MixedPrecisionJobStatus:
    run = ScriptedRun(spec, out, endings)
    status = run.run()
    while run.endings:  # interrupted: run again with the same --out, as the user would
        run = ScriptedRun(spec, out, run.endings)
        status = run.run()
    return status


def summary(status: MixedPrecisionJobStatus) -> dict[str, Any]:
    attempts = [
        (a.index, a.precision, a.start_step, a.end_step, a.world_size, a.reason, a.exit_code, a.charged)
        for a in status.attempts
    ]
    conditions = sorted((c.type, c.status, c.reason) for c in status.conditions)
    last = status.last_checkpoint.step if status.last_checkpoint else None
    wasted = [(a.wasted_steps, a.samples) for a in status.attempts]
    spans = [s.model_dump() for s in status.timeline.precision] if status.timeline else []
    summed = status.cost.wasted_steps if status.cost else None
    return {
        "phase": status.phase,
        "attempts": attempts,
        "conditions": conditions,
        "lastCheckpoint": last,
        "wasted": (wasted, summed),
        "spans": spans,
    }


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_the_operator_and_mpjob_run_walk_the_same_lifecycle(name: str, tmp_path: Path) -> None:
    over, endings = SCENARIOS[name]
    spec = job_spec(**over)
    operator = summary(through_the_operator(spec, endings))
    local = summary(through_mpjob_run(spec, endings, tmp_path / "run"))
    assert local == operator
    assert operator["phase"] in ("Succeeded", "Failed")


def test_the_scenarios_tell_the_stories_their_names_promise(tmp_path: Path) -> None:
    phases = {name: summary(through_the_operator(job_spec(**o), e)) for name, (o, e) in SCENARIOS.items()}
    assert [a[1] for a in phases["numeric-fault-then-success"]["attempts"]] == ["fp16", "bf16"]
    assert phases["numeric-fault-then-success"]["attempts"][1][2] == 20  # resumed from the last good checkpoint
    assert phases["numeric-fault-then-success"]["wasted"] == ([(10, 480), (None, 640)], 10)  # 20..30 trained twice
    assert [a[1] for a in phases["every-precision-failing"]["attempts"]] == ["fp16", "bf16", "fp32"]
    assert phases["every-precision-failing"]["phase"] == "Failed"
    assert phases["config-error"]["attempts"] == [(0, "fp16", 0, 0, 1, "ConfigError", 43, True)]
    assert [a[5] for a in phases["attempts-exhausted"]["attempts"]] == ["PodDeleted", "PodDeleted"]
    assert phases["attempts-exhausted"]["phase"] == "Failed"
    # An attempt the cluster disrupted (DisruptionTarget) uses none of runPolicy.maxAttempts ...
    assert [a[5] for a in phases["disruptions-use-no-attempt"]["attempts"]] == ["Evicted"] * 3 + ["Succeeded"]
    assert phases["disruptions-use-no-attempt"]["phase"] == "Succeeded"
    # ... nor does the user's own suspension; a trainer's own word (exit 44, Preempted) is charged.
    assert [a[5] for a in phases["suspensions-use-no-attempt"]["attempts"]] == ["Suspended"] * 3 + ["Succeeded"]
    assert phases["suspensions-use-no-attempt"]["phase"] == "Succeeded"
    assert [a[5] for a in phases["self-reported-preemptions-are-charged"]["attempts"]] == ["Preempted"] * 2
    assert phases["self-reported-preemptions-are-charged"]["phase"] == "Failed"
    assert phases["two-workers-one-faults"]["attempts"][0][4:] == (2, "NumericFault", 42, True)
    assert [a[5] for a in phases["suspend-then-resume"]["attempts"]] == ["Suspended", "Succeeded"]
    assert [a[5] for a in phases["deleted-pod-then-success"]["attempts"]] == ["PodDeleted", "Succeeded"]

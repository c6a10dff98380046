"""Changes the trainer made in its running processes (spec.precision.inPlace), recorded by the
rules a restart's ending is recorded by (planned in mpjob.planning.inplace).

- `changed_in_place`: the trainer said it changed (report.InPlaceChange: its
  `precisionChanged` line to `mpjob run`, its metrics or termination report to the operator):
  the attempt ends as a numeric fault ends it, or its re-promotion (`lifecycle.conclude`, the
  same events and conditions), and the next one is recorded as begun with `inPlace: true` and
  its recoverySeconds, and running (phase and Running condition) from the change's moment; no
  Job or process is started for it.
- `record`: the operator's side: the changes a reading or a report names that the status does
  not hold yet, each once (an operator restarted in between reads them again and skips those
  it recorded: a change names the attempt it began).
An attempt begun in place runs in the Job its chain of changes began with (`history.job_index`)."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

from mpjob.planning import lifecycle as lc
from mpjob.planning import status as st
from mpjob.planning.classify import Action, AttemptOutcome, classify, under_policy
from mpjob.planning.planner import StartAttempt
from mpjob_contract.api import AttemptStatus, MixedPrecisionJobSpec
from mpjob_contract.codes import ExitCode, Reason
from mpjob_contract.policy import FaultPolicy
from mpjob_contract.report import ChangeKind, InPlaceChange, TerminationReport
from mpjob_contract.vocabulary import settled

#: What ends the attempt before an in-place change of each kind, as a restart's report says it.
ENDED_BY: dict[ChangeKind, tuple[Reason, ExitCode]] = {
    "fallback": (Reason.NUMERIC_FAULT, ExitCode.NUMERIC_FAULT),
    "repromote": (Reason.REPROMOTE, ExitCode.REPROMOTE),
    "microBatch": (Reason.OUT_OF_DEVICE_MEMORY, ExitCode.OUT_OF_DEVICE_MEMORY),
}


def changed_in_place(
    plan: lc.Plan,
    spec: MixedPrecisionJobSpec,
    *,
    attempt: StartAttempt | AttemptStatus,
    change: InPlaceChange,
    when: lc.When,
    capability: tuple[int, int] | str | None = "spec",
    checkpoint_dir: str | None = None,
) -> StartAttempt | None:
    """End `attempt` on the trainer's word that it changed in place, and record the attempt it goes on
    in (None: the plan finished the job instead, rare by the trainer's bounds: its processes end)."""
    reason, code = ENDED_BY[change.kind]
    report = TerminationReport(
        reason=reason, step=change.step, start_step=attempt.start_step, precision=change.from_precision,  # type: ignore[arg-type]
        rule=change.rule if change.kind == "fallback" else None, message=change.message,
    )  # fmt: skip
    outcome = AttemptOutcome(code, report)
    began = next((a.start_time for a in plan.status.attempts if a.index == attempt.index), None)
    when = lc.When(moment(change.at, when.at, earliest=began), when.generation)  # when the trainer changed
    lc.conclude(plan, ruling(spec, outcome), attempt=attempt, outcome=outcome, when=when, capability=capability,
                checkpoint_dir=checkpoint_dir, resumed_at=change.start_step,
                went_on_in=change.to_precision)  # fmt: skip
    if not plan.create:
        return None
    # Begun by conclude in the change's precision (went_on_in), from where it went on (resumed_at).
    entry = next(a for a in plan.status.attempts if a.index == plan.create[0].index)
    entry.in_place, entry.recovery_seconds = True, change.recovery_seconds
    begun = plan.create[0]
    lc.running(plan, when)  # its processes run on: no pods to wait for (conclude began it awaiting them)
    if change.micro_batch is not None and change.grad_accumulation is not None:  # the split the trainer made
        entry.micro_batch, entry.grad_accumulation = change.micro_batch, change.grad_accumulation
        begun = replace(begun, micro_batch=change.micro_batch, grad_accumulation=change.grad_accumulation)
    lc.announce(plan, spec, entry)  # it runs already: no Job is made for it
    return begun


def ruling(spec: MixedPrecisionJobSpec, outcome: AttemptOutcome) -> MixedPrecisionJobSpec:
    """The spec a change's ending is ruled by: the job's, unless its faultPolicy, edited since the
    attempt's launch (the trainer changed by the policy launched with it), would neither make the
    change nor fail the fault: then the built-in table's, the change as made (an edit reaches the
    attempts launched after it; one that fails the fault still ends the job)."""
    table = classify(outcome)
    if under_policy(table, spec.fault_policy, outcome.report).action in (table.action, Action.FAIL):
        return spec
    return spec.model_copy(update={"fault_policy": FaultPolicy()})


def moment(at: float | None, now: str, *, earliest: str | None = None) -> str:
    """The change's moment as the status writes times, held to [`earliest`, `now`] (another
    node's clock, or the trainer's word): `now` when not said, or past what a date holds."""
    try:
        said = now if at is None else min(st.stamp(datetime.fromtimestamp(at, UTC)), now)
    except (ValueError, OverflowError, OSError):  # past the year 9999: no moment a clock read
        said = now
    return max(said, earliest) if earliest is not None else said


def record(
    plan: lc.Plan,
    spec: MixedPrecisionJobSpec,
    changes: list[InPlaceChange],
    when: lc.When,
    *,
    capability: tuple[int, int] | str | None = "spec",
    checkpoint_dir: str | None = None,
) -> StartAttempt | None:
    """Record the changes that begin the attempt after the running one, in order (the others
    are recorded already, or not this job's attempts); the last attempt begun, if any. No Job
    or process is created for it."""
    begun = None
    for change in changes:
        current = plan.status.attempts[-1] if plan.status.attempts else None
        if current is None or current.finish_time is not None or change.attempt != current.index + 1:
            continue
        if change.from_precision != settled(current.precision, change.from_precision):
            continue  # not the attempt the status holds running: a reading of something else
        current.precision = change.from_precision  # an `auto` attempt's measurement, if no reading said it
        at = {"when": when, "capability": capability, "checkpoint_dir": checkpoint_dir}
        begun = changed_in_place(plan, spec, attempt=current, change=change, **at) or begun  # type: ignore[arg-type]
        plan.create.clear()
    return begun

"""An attempt's launch contract (mpjob_contract.launch.AttemptLaunch), made from what the planner
decided: the attempt it starts (`planner.StartAttempt`) and what it may change in its running
processes (`inplace.InPlacePlan`). One mapping for both runners: the operator's pods
(builders.attempt) and `mpjob run`'s processes (localrun.launching)."""

from __future__ import annotations

from mpjob.planning.inplace import InPlacePlan
from mpjob.planning.planner import StartAttempt
from mpjob_contract.api import MixedPrecisionJobSpec
from mpjob_contract.launch import AttemptLaunch, InPlaceChanges


def attempt_launch(
    spec: MixedPrecisionJobSpec,
    start: StartAttempt,
    in_place: InPlacePlan,
    *,
    job_name: str,
    namespace: str,
    checkpoint_dir: str,
    resume_from: str | None,
    job_uid: str | None = None,
    lineage: dict[int, list[str]] | None = None,
) -> AttemptLaunch:
    """The launch of attempt `start` of job `job_name` (`job_uid`: None for a local run), with its
    checkpoints in `checkpoint_dir` and resumed from `resume_from` (None: the trainer takes the
    newest valid checkpoint there), written by the Jobs of `lineage` (history.lineage; None: not
    judged, a local run)."""
    return AttemptLaunch(
        job_name=job_name,
        namespace=namespace,
        job_uid=job_uid,
        attempt=start.index,
        precision=start.precision,
        resume_from=resume_from,
        micro_batch=start.micro_batch,
        grad_accumulation=start.grad_accumulation,
        repromote_after_steps=start.repromote_after_steps,
        repromote_counts_from=start.repromote_counts_from,
        workers=start.workers,
        recovering_since=start.recovering_since,
        in_place_to=in_place.to,
        promote_in_place_to=in_place.promote_to,
        in_place_splits=in_place.splits,
        in_place_measured={p: changes(plan) for p, plan in in_place.measured.items()},
        checkpoint_dir=checkpoint_dir,
        lineage=lineage,
        spec=spec,
    )


def changes(plan: InPlacePlan) -> InPlaceChanges:
    """The launch's words for what `plan` allows in place."""
    return InPlaceChanges(in_place_to=plan.to, promote_in_place_to=plan.promote_to, in_place_splits=plan.splits)

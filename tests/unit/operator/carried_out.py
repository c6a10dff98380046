"""A pure plan as the operator carries it out, for tests that read what it says: each Job it
asks for made (`lifecycle.made`, as the controller calls it), which says and counts started
the attempts whose first Job it is."""

from __future__ import annotations

from mpjob.planning import lifecycle as lc
from mpjob.planning.classify import AttemptOutcome
from mpjob.planning.plan import Plan, When
from mpjob.planning.planner import StartAttempt, first_attempt
from mpjob_contract.api import MixedPrecisionJobSpec, MixedPrecisionJobStatus


def made(spec: MixedPrecisionJobSpec, plan: Plan) -> Plan:
    """`plan`, each Job it creates made (a UID recorded on its attempt's entry)."""
    for start in plan.create:
        lc.made(plan, spec, start.index, f"job-uid-{start.index}-{len(plan.status.attempts)}")
    return plan


def said(spec: MixedPrecisionJobSpec, plan: Plan, *reasons: str) -> list[str]:
    """The messages of the Events with `reasons` that `plan`, carried out, posts."""
    return [e.message for e in made(spec, plan).told if e.reason in reasons]


def through(job: MixedPrecisionJobSpec, when: When, *outcomes: AttemptOutcome) -> tuple[Plan, list[StartAttempt]]:
    """The job's attempts through the lifecycle, each ending as the next of `outcomes`: the plan
    the last left, and every attempt started (the first included)."""
    plan = Plan(status=MixedPrecisionJobStatus())
    lc.begin(plan, job, first_attempt(job), when)
    started = [plan.create[0]]
    for outcome in outcomes:
        nxt = Plan(status=plan.status)
        lc.conclude(nxt, job, attempt=started[-1], outcome=outcome, when=when, capability=None)
        assert nxt.create, nxt.status.message
        plan.status = nxt.status
        started.append(nxt.create[0])
    return plan, started

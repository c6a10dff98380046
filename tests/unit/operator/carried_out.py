"""A pure plan as the operator carries it out, for tests that read what it says: each Job it
asks for made (`lifecycle.made`, as the controller calls it), which says and counts started
the attempts whose first Job it is."""

from __future__ import annotations

from mpjob.planning import lifecycle as lc
from mpjob.planning.plan import Plan
from mpjob_contract.api import MixedPrecisionJobSpec


def made(spec: MixedPrecisionJobSpec, plan: Plan) -> Plan:
    """`plan`, each Job it creates made (a UID recorded on its attempt's entry)."""
    for start in plan.create:
        lc.made(plan, spec, start.index, f"job-uid-{start.index}-{len(plan.status.attempts)}")
    return plan


def said(spec: MixedPrecisionJobSpec, plan: Plan, *reasons: str) -> list[str]:
    """The messages of the Events with `reasons` that `plan`, carried out, posts."""
    return [e.message for e in made(spec, plan).told if e.reason in reasons]

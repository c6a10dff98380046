"""A MixedPrecisionJob being deleted, on the real control plane: once it carries a
deletionTimestamp the operator starts nothing more for it. Deleted with
--cascade=foreground while its pods wait for a node, the garbage collector deletes its attempt's
Job before the job itself; an operator that took that for a Job deleted by hand made it again (a
Warning JobRecreated, the attempt's pods anew) for as long as the job stayed, and for good once
only another finalizer held it: trainers ran for a job the user had deleted."""

from __future__ import annotations

import time

import pytest

from mpjob_contract import api
from tests.helpers import wait_for
from tests.integration.operator.conftest import Jobs, Operator
from tests.integration.operator.test_hostile_children import condition, standin

pytestmark = pytest.mark.integration

#: Another controller's finalizer that keeps the job readable once the garbage collector is done.
HOLD = "test.mpjob.dev/hold"
#: How long the job, its children gone, is watched for a new one: several of the operator's ticks.
WATCHED_SECONDS = 6.0


def test_a_job_deleted_in_the_foreground_while_its_pods_wait_gets_no_new_job(operator: Operator, jobs: Jobs) -> None:
    jobs.create("going", standin(template={"nodeSelector": {"pool": "nowhere"}}))
    jobs.wait_status(
        "going", lambda s: condition(s, "PodsScheduled").get("status") == "False", 60, "its pods wait for a node"
    )
    assert jobs.attempt_jobs("going") == ["going-a0"]
    patch = {"metadata": {"finalizers": [HOLD]}}
    jobs.custom.patch_namespaced_custom_object(api.GROUP, api.VERSION, jobs.namespace, api.PLURAL, "going", patch)
    jobs.custom.delete_namespaced_custom_object(
        api.GROUP, api.VERSION, jobs.namespace, api.PLURAL, "going", propagation_policy="Foreground"
    )
    try:
        # The garbage collector has deleted its dependents: only the other finalizer holds it.
        wait_for(
            lambda: jobs.get("going")["metadata"].get("finalizers") == [HOLD], 60, message="foreground deletion done"
        )
        deadline = time.monotonic() + WATCHED_SECONDS
        while time.monotonic() < deadline:  # it must stay so: each pass is a check that can fail
            status = jobs.status("going")
            made = jobs.attempt_jobs("going")
            recreated = [e.message for e in jobs._events("going") if e.reason == "JobRecreated"]
            assert (made, recreated, len(status.get("attempts", []))) == ([], [], 1), (made, recreated, status)
            time.sleep(0.5)
    finally:
        jobs.custom.patch_namespaced_custom_object(
            api.GROUP, api.VERSION, jobs.namespace, api.PLURAL, "going", {"metadata": {"finalizers": None}}
        )

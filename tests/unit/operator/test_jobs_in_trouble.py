"""The operator's jobs-in-trouble gauge (mpjob_operator_jobs_in_trouble{condition}): the alert
AttemptsBackingOff watches its BackingOff count, so it counts what `kubectl describe mpj` shows,
from the statuses the real planning leaves: a job whose next attempt waits out its backoff, a job
whose checkpoints lapsed, and neither once the job has finished or the trouble has passed."""

from __future__ import annotations

from datetime import timedelta

import pytest
from prometheus_client import REGISTRY

from mpjob.controller.ticker import TROUBLES, Standing, publish_phases, standing
from mpjob.planning import backoff
from mpjob.planning.lapse import LAPSED_INTERVALS
from mpjob.planning.reconcile import reconcile
from mpjob_contract.api import MixedPrecisionJobStatus
from tests.unit.operator.test_backoff import NOW, S, crashed, read_back
from tests.unit.operator.test_lapse import EVERY, failed, feed, fresh, saved, step

pytestmark = pytest.mark.unit


def in_trouble(condition: str) -> float | None:
    return REGISTRY.get_sample_value("mpjob_operator_jobs_in_trouble", {"condition": condition})


def backing_off() -> MixedPrecisionJobStatus:
    first = reconcile(S, MixedPrecisionJobStatus(), 1, {}, NOW, retries=backoff.JOB_CONTROLLER).status
    return reconcile(S, read_back(first), 1, crashed(0), NOW, retries=backoff.JOB_CONTROLLER).status


def lapsed() -> MixedPrecisionJobStatus:
    status, _ = feed(fresh(), [step(n) for n in range(1, 21)] + [saved(20)])
    outage = []
    for n in range(21, 21 + LAPSED_INTERVALS * EVERY):
        outage += [step(n)] + ([failed(n, n // EVERY - 2)] if n % EVERY == 0 else [])
    return feed(status, outage)[0]


def test_a_job_waiting_out_its_backoff_is_counted_until_its_attempt_is_made() -> None:
    waiting = backing_off()
    assert standing(waiting) == Standing("Pending", frozenset({"BackingOff"}))
    later = NOW + timedelta(seconds=10)
    made = reconcile(S, read_back(waiting), 1, {}, later, retries=backoff.JOB_CONTROLLER)
    assert [s.index for s in made.create] == [1] and standing(made.status).troubles == frozenset()


def test_a_job_whose_checkpoints_lapsed_is_counted_until_a_save_catches_up() -> None:
    status = lapsed()
    assert standing(status) == Standing("Running", frozenset({"CheckpointsFailing"}))
    caught_up, _ = feed(status, [saved(60)])
    assert standing(caught_up).troubles == frozenset()


def test_a_finished_job_is_in_no_trouble_whatever_its_conditions_still_say() -> None:
    status = lapsed()
    status.phase = "Failed"
    assert standing(status) == Standing("Failed")


def test_the_gauge_counts_each_trouble_over_the_jobs_and_zero_when_none_has_it() -> None:
    publish_phases({"a": standing(backing_off()), "b": standing(lapsed()), "c": standing(backing_off())})
    assert [in_trouble(t) for t in TROUBLES] == [2, 1]
    assert REGISTRY.get_sample_value("mpjob_operator_jobs", {"phase": "Pending"}) == 2
    publish_phases({"b": Standing("Running")})
    assert [in_trouble(t) for t in TROUBLES] == [0, 0]

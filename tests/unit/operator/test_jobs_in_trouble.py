"""The operator's jobs-in-trouble gauge (mpjob_operator_jobs_in_trouble{condition}): the alerts
AttemptsBackingOff and PodsNotStarting watch it, so it counts what `kubectl describe mpj` shows,
from the statuses the real planning leaves: a job whose next attempt waits out its backoff, a job
whose checkpoints lapsed, a job whose pods cannot start (its image not pulled), and none once the
job has finished or the trouble has passed."""

from __future__ import annotations

from datetime import timedelta

import pytest
from prometheus_client import REGISTRY

from mpjob.controller.records import pod_view
from mpjob.controller.ticker import TROUBLES, Standing, publish_phases, standing
from mpjob.planning import backoff
from mpjob.planning.lapse import LAPSED_INTERVALS
from mpjob.planning.reconcile import JobView, PodView, reconcile
from mpjob_contract.api import MixedPrecisionJobStatus
from tests.unit.operator.test_backoff import NOW, S, crashed, read_back
from tests.unit.operator.test_image_pulls import PULL, T0, pod, spec, started, waiting
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


def unpulled() -> MixedPrecisionJobStatus:
    return reconcile(spec(), started(spec()), 1, waiting(pod_view(pod("ErrImagePull", PULL))), T0).status


def test_a_job_whose_image_cannot_be_pulled_is_counted_until_its_pod_runs() -> None:
    status = unpulled()
    assert standing(status) == Standing("Pending", frozenset({"ImagePullBackOff"}))
    runs = {0: JobView(0, pods=(PodView("j-a0-0-x", 0, "Running", alive=True),))}
    assert standing(reconcile(spec(), status, 1, runs, T0).status).troubles == frozenset()


def test_a_finished_job_is_in_no_trouble_whatever_its_conditions_still_say() -> None:
    status = lapsed()
    status.phase = "Failed"
    assert standing(status) == Standing("Failed")


def test_the_gauge_counts_each_trouble_over_the_jobs_and_zero_when_none_has_it() -> None:
    jobs = {"a": backing_off(), "b": lapsed(), "c": backing_off(), "d": unpulled()}
    publish_phases({name: standing(status) for name, status in jobs.items()})
    assert {t: in_trouble(t) for t in TROUBLES} == {
        "BackingOff": 2,
        "CheckpointsFailing": 1,
        "FailedCreate": 0,
        "CreateContainerConfigError": 0,
        "ImagePullBackOff": 1,
    }
    assert REGISTRY.get_sample_value("mpjob_operator_jobs", {"phase": "Pending"}) == 3
    publish_phases({"b": Standing("Running")})
    assert [in_trouble(t) for t in TROUBLES] == [0] * len(TROUBLES)

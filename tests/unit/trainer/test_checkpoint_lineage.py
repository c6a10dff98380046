"""A stray attempt's checkpoints are never resumed from (checkpoint.lineage): every checkpoint names
the attempt and the Job that wrote it, each launch names the Job each earlier attempt ran in, and a
resume or a rollback passes over one written from another Job (logged, left where it is), on the
volume store and the bucket store alike."""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from mpjob_contract import events
from mpjob_contract.api import MixedPrecisionJobSpec
from mpjob_contract.environment import ATTEMPT_JOB_ENV
from mpjob_contract.launch import AttemptLaunch
from mpjob_trainer.checkpoint import CheckpointStore, CheckpointTaken, resume
from mpjob_trainer.checkpoint.lineage import Lineage
from mpjob_trainer.checkpoint.manifest import MANIFEST, Manifest, folder_name
from mpjob_trainer.checkpoint.s3 import BucketCheckpointStore
from mpjob_trainer.events import EventLog
from tests.unit.trainer.memory_bucket import SETTINGS, MemoryBucket

pytestmark = pytest.mark.unit

JOB = "ns/job/uid"
#: The Jobs attempts 0 and 1 ran in, as the job's status records them; attempt 1's stray Job.
EARLIER = {0: ["job-a0"], 1: ["job-a1"]}
STRAY = "job-a1-stray"
Open = Callable[[Lineage, list[dict[str, Any]]], CheckpointStore | BucketCheckpointStore]


def _manifest(attempt: int | None, job: str | None) -> Manifest:
    return Manifest(200, "fp16", "d1", 2, {}, job=JOB, attempt=attempt, attempt_job=job)


@pytest.mark.parametrize(
    ("attempt", "job", "outside"),
    [
        (None, None, False),  # a local run's, or a trainer's from before: judged as before
        (2, "job-a2-first", False),  # the attempt's own, from a Job of it made earlier
        (1, "job-a1", False),
        (0, "job-a0", False),
        (1, STRAY, True),  # made after attempt 1 had ended
        (3, "job-a3", True),  # a later attempt's: it cannot have run before this one
        (5, "job-a5", True),
    ],
)
def test_a_checkpoint_is_outside_the_lineage_only_when_its_job_is_not_the_one_recorded(
    attempt: int | None, job: str | None, outside: bool
) -> None:
    lineage = Lineage(2, "job-a2", EARLIER)
    assert (lineage.outside(_manifest(attempt, job)) is not None) == outside


def test_an_attempt_the_status_records_no_job_for_or_no_longer_holds() -> None:
    lineage = Lineage(4, "job-a4", {0: ["job-a0"], 2: [], 3: ["job-a3"]})  # attempt 1: dropped (bounded history)
    problem = lineage.outside(_manifest(2, "job-a2"))
    assert problem is not None and "no Job" in problem and "attempt 2" in problem
    assert lineage.outside(_manifest(1, "job-a1")) is None
    assert Lineage(4, "job-a4", None).outside(_manifest(2, "job-a2")) is None  # a local run judges nothing


def test_a_checkpoint_of_a_job_its_attempt_ran_in_before_it_was_made_again_is_of_the_lineage(
    open_store: Open,
) -> None:
    """Attempt 1's first Job saved 10 and 20 and was deleted while it ran; the Job made again in
    attempt 1 ended it before saving: attempt 2 goes on from 20, not from 10 or step 0."""
    first = open_store(Lineage(1, "job-a1-first", {0: ["job-a0"]}), [])
    for step in (10, 20):
        _save(first, step, "fp16")
    log: list[dict[str, Any]] = []
    store = open_store(Lineage(2, "job-a2", {0: ["job-a0"], 1: ["job-a1-first", "job-a1"]}), log)
    loaded = resume.load(store)
    assert loaded is not None and loaded[0].step == 20 and log == []
    assert store.lineage.outside(_manifest(1, STRAY)) is not None  # a stray of it still is not


def test_the_launch_and_the_pod_say_the_lineage() -> None:
    spec = MixedPrecisionJobSpec.model_validate({"task": {"builtin": "mlp"}})
    said = {"0": ["u0"], "1": [], "2": ["u2"]}  # as JSON carries it
    launch = AttemptLaunch.model_validate(
        {"jobName": "j", "precision": "fp16", "attempt": 3, "lineage": said, "spec": spec}
    )
    lineage = Lineage.of(launch, {ATTEMPT_JOB_ENV: "u3"})
    assert lineage == Lineage(3, "u3", {0: ["u0"], 1: [], 2: ["u2"]})
    assert Lineage.of(launch, {}).job is None


def _volume(root: Path) -> Open:
    def open_(lineage: Lineage, log: list[dict[str, Any]]) -> CheckpointStore:
        return CheckpointStore(root, 5, "d1", lambda e, **f: log.append({"event": e, **f}), job=JOB, lineage=lineage)

    return open_


def _bucket() -> Open:
    bucket = MemoryBucket()

    def open_(lineage: Lineage, log: list[dict[str, Any]]) -> BucketCheckpointStore:
        return BucketCheckpointStore(
            f"{SETTINGS.url}/ns/job/uid", SETTINGS, keep=5, config_digest="d1", job=JOB, bucket=bucket,
            log=lambda e, **f: log.append({"event": e, **f}), lineage=lineage,
        )  # fmt: skip

    return open_


@pytest.fixture(params=["volume", "bucket"])
def open_store(request: pytest.FixtureRequest, tmp_path: Path) -> Open:
    return _volume(tmp_path) if request.param == "volume" else _bucket()


def _save(store: CheckpointStore | BucketCheckpointStore, step: int, precision: str) -> None:
    store.write(step, precision, {"step": step, "w": torch.full((4,), float(step))})


def _stray_ahead(open_store: Open) -> tuple[CheckpointStore | BucketCheckpointStore, list[dict[str, Any]]]:
    """Attempt 1 (fp16) saved steps 10 and 20; its stray Job, resumed from 10 as attempt 1 was,
    saved 30 and 40 in fp16 too (and was cut at 45); attempt 2's store, and its log."""
    _save(open_store(Lineage(1, "job-a1", {0: ["job-a0"]}), []), 10, "fp16")
    _save(open_store(Lineage(1, "job-a1", {0: ["job-a0"]}), []), 20, "fp16")
    stray = open_store(Lineage(1, STRAY, {0: ["job-a0"]}), [])
    for step in (30, 40):
        _save(stray, step, "fp16")
    log: list[dict[str, Any]] = []
    return open_store(Lineage(2, "job-a2", EARLIER), log), log


def test_a_resume_passes_over_the_stray_attempts_newer_checkpoints(open_store: Open) -> None:
    store, log = _stray_ahead(open_store)
    loaded = resume.load(store)
    assert loaded is not None and loaded[0].step == 20 and torch.equal(loaded[1]["w"], torch.full((4,), 20.0))
    said = [(e["event"], e["path"]) for e in log]
    assert said == [("checkpointOutsideLineage", str(where)) for step, where in reversed(store.steps()) if step > 20]
    assert all(STRAY in e["problem"] and "attempt 1" in e["problem"] for e in log)
    assert [step for step, _ in store.steps()] == [10, 20, 30, 40]  # said, never deleted


def test_the_named_checkpoints_newer_ones_in_its_precision_are_not_the_strays(open_store: Open) -> None:
    store, _ = _stray_ahead(open_store)
    named = next(str(where) for step, where in store.steps() if step == 10)
    loaded = resume.load(store, named, newer_in="fp16")
    assert loaded is not None and loaded[0].step == 20


def test_a_rollback_goes_back_past_the_strays_checkpoints(open_store: Open) -> None:
    store, _ = _stray_ahead(open_store)
    restored: list[int] = []
    ref, _ = resume.back_to(store, 40, lambda loaded: restored.append(loaded[0].step))
    assert ref.step == 20 and restored == [20]


def test_a_checkpoint_names_the_attempt_and_the_job_that_wrote_it(open_store: Open) -> None:
    written = open_store(Lineage(3, "job-a3", EARLIER), [])
    _save(written, 10, "bf16")
    manifest = written.manifest(written.steps()[0][1])
    assert manifest is not None and (manifest.attempt, manifest.attempt_job) == (3, "job-a3")
    unjudged = open_store(Lineage(4, None, None), [])  # no Job (a local run): nothing stamped
    _save(unjudged, 20, "bf16")
    manifest = unjudged.manifest(unjudged.steps()[1][1])
    assert manifest is not None and (manifest.attempt, manifest.attempt_job) == (None, None)


def test_the_stamp_is_what_the_manifest_file_says(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path, 5, "d1", job=JOB, lineage=Lineage(2, "job-a2", EARLIER))
    _save(store, 10, "bf16")
    doc = json.loads((tmp_path / folder_name(10) / MANIFEST).read_text())
    assert (doc["attempt"], doc["attemptJob"]) == (2, "job-a2")


def test_the_passed_over_checkpoint_is_an_event_line_of_the_trainer(tmp_path: Path) -> None:
    _, _ = _stray_ahead(_volume(tmp_path))
    out = io.StringIO()
    store = CheckpointStore(tmp_path, 5, "d1", EventLog(0, out), job=JOB, lineage=Lineage(2, "job-a2", EARLIER))
    loaded = resume.load(store)
    assert loaded is not None and loaded[0].step == 20
    said = [events.parse_line(line) for line in out.getvalue().splitlines()]
    assert [type(e).__name__ for e in said] == ["CheckpointOutsideLineage"] * 2
    assert [e.path for e in said if isinstance(e, events.CheckpointOutsideLineage)] == [
        str(tmp_path / folder_name(step)) for step in (40, 30)
    ]


def test_a_save_at_a_strays_step_writes_its_own_and_the_strays_is_set_aside_not_pruned(open_store: Open) -> None:
    store, log = _stray_ahead(open_store)
    result = store.write(30, "bf16", {"step": 30, "w": torch.full((4,), -30.0)})
    assert result.ref.step == 30 and result.ref.precision == "bf16"  # its own state, never the stray's
    manifest = store.manifest(store.steps()[2][1])
    assert manifest is not None and (manifest.attempt, manifest.attempt_job) == (2, "job-a2")
    assert [(e["event"], STRAY in e["problem"]) for e in log] == [("checkpointOutsideLineage", True)]
    assert len(store.aside()) == 1  # the stray's, kept
    keeping = open_store(Lineage(2, "job-a2", EARLIER), [])
    keeping.keep = 1
    for step in (50, 60):
        _save(keeping, step, "bf16")
    committed = [step for step, where in keeping.steps() if keeping.manifest(where) is not None]
    assert committed == [20, 40, 60]  # the stray's 40 neither counts nor goes; attempt 1's newest stays
    assert len(keeping.aside()) == 1


def test_a_sharded_checkpoints_manifest_names_its_writer_too(tmp_path: Path) -> None:
    files = {"rank-0.pt": {"sha256": "0" * 64, "bytes": 1}}
    store = CheckpointStore(tmp_path, 5, "d1", job=JOB, lineage=Lineage(2, "job-a2", EARLIER))
    manifest = store.sharded_manifest(10, "bf16", files, world_size=2)
    assert (manifest.layout, manifest.world_size, manifest.attempt, manifest.attempt_job) == ("dcp", 2, 2, "job-a2")


def test_a_stray_saving_a_step_a_later_attempt_saved_leaves_that_checkpoint_as_it_is(open_store: Open) -> None:
    """A stray of attempt 1, made once attempt 2 ran, trains from attempt 1's checkpoints on the
    same schedule: at a step attempt 2 saved already it writes nothing and sets nothing aside."""
    running = open_store(Lineage(2, "job-a2", EARLIER), [])
    _save(running, 30, "bf16")
    log: list[dict[str, Any]] = []
    stray = open_store(Lineage(1, STRAY, {0: ["job-a0"]}), log)
    with pytest.raises(CheckpointTaken):
        stray.write(30, "fp16", {"step": 30, "w": torch.full((4,), -1.0)})
    assert [(e["event"], "after this attempt 1" in e["problem"]) for e in log] == [("checkpointOutsideLineage", True)]
    assert stray.aside() == []
    loaded = resume.load(open_store(Lineage(3, "job-a3", {**EARLIER, 2: ["job-a2"]}), []))
    assert loaded is not None and loaded[0].step == 30 and torch.equal(loaded[1]["w"], torch.full((4,), 30.0))


@pytest.mark.parametrize("last", [{1: ["job-a1"]}, {0: ["job-a0"]}], ids=["attempt-1s", "attempt-0s"])
def test_a_strays_keep_k_leaves_the_checkpoint_the_next_attempt_went_on_from(
    open_store: Open, last: dict[int, list[str]]
) -> None:
    """Attempt 2 went on from step 20, attempt 1's last (or attempt 0's, attempt 1 having saved
    nothing), and has saved nothing yet; attempt 1's stray Job saves 30, 40 and 50 with keep 2.
    Before, its prune counted step 20 as its own and deleted it: attempt 2, restarted as attempt
    3, went back to step 10 (or to step 0). Another Job's newest never goes in a prune."""
    (attempt, (job,)) = next(iter(last.items()))
    for step in (10, 20):
        _save(open_store(Lineage(attempt, job, {0: ["job-a0"]} if attempt else {}), []), step, "fp16")
    stray = open_store(Lineage(1, STRAY, {0: ["job-a0"]}), [])
    stray.keep = 2
    for step in (30, 40, 50):
        _save(stray, step, "fp16")
    assert [step for step, _ in stray.steps()] == [20, 40, 50]  # its own 30 goes, the other Job's 10 too
    loaded = resume.load(open_store(Lineage(3, "job-a3", {**EARLIER, 2: ["job-a2"]}), []))
    assert loaded is not None and loaded[0].step == 20 and torch.equal(loaded[1]["w"], torch.full((4,), 20.0))


def test_keep_k_of_the_lineage_with_no_job_is_as_before(open_store: Open) -> None:
    """A local run (no Job, nothing stamped) keeps its newest `keep`, whoever wrote the older."""
    for attempt, step in ((0, 10), (1, 20), (2, 30), (2, 40)):
        store = open_store(Lineage(attempt, None, None), [])
        store.keep = 2
        _save(store, step, "fp16")
    assert [step for step, _ in store.steps()] == [30, 40]

"""The job summary `mpjob run` and `mpjob status` print, the series `mpjob status` plots from a
status alone, and what `mpjob status` says when it cannot read the job."""

from __future__ import annotations

import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest

from mpjob.localrun.series import series_of_status
from mpjob.summary import SUMMARY_MESSAGE_CHARS, skipped_line, summary_lines
from mpjob_contract.accounting import JobCost
from mpjob_contract.api import MixedPrecisionJobStatus
from mpjob_contract.skipping import SampleRange, Skipped, SkippedStep

pytestmark = pytest.mark.unit

FELL_BACK = MixedPrecisionJobStatus.model_validate(
    {
        "phase": "Succeeded",
        "precision": "bf16",
        "step": 40,
        "attempts": [
            {"index": 0, "precision": "fp16", "startStep": 0, "endStep": 27, "reason": "NumericFault",
             "message": "MaxConsecutiveOverflows: 20 in a row", "loss": 2.5, "lossScale": 1.0},
            {"index": 1, "precision": "bf16", "startStep": 20, "endStep": 40, "reason": "Succeeded", "loss": 1.25},
        ],
        "skipped": {"count": 1, "samples": 1,
                    "steps": [{"step": 12, "cause": "data", "samples": [{"first": 5, "last": 5}]}]},
        "lastCheckpoint": {"step": 40, "path": "/ckpt/step-000000040", "sha256": "ab" * 32, "precision": "bf16"},
        "cost": {"gpuSeconds": 120.0, "wastedGpuSeconds": 30.0, "wastedSteps": 7},
    }
)  # fmt: skip


def test_the_summary_names_each_attempt_the_recoveries_skips_checkpoint_and_cost() -> None:
    assert summary_lines("ns/fell", FELL_BACK) == [
        "ns/fell: Succeeded in bf16 at step 40",
        "  attempt 0: fp16 steps 0-27 NumericFault (MaxConsecutiveOverflows: 20 in a row)",
        "  attempt 1: bf16 steps 20-40 Succeeded",
        "  recoveries: 1 (fp16 -> bf16)",
        "  skipped: 1 step(s), 1 sample(s): step 13 (data: 5)",
        f"  last checkpoint: step 40 (bf16) sha256 {'ab' * 8}",
        "  cost: 120 GPU-seconds, 30 wasted (7 steps trained again)",
    ]


def test_a_job_that_trained_on_no_gpu_still_says_the_steps_its_recoveries_trained_again() -> None:
    on_cpu = FELL_BACK.model_copy(update={"cost": JobCost(wasted_steps=7)})
    assert summary_lines("fell", on_cpu)[-1] == "  cost: 7 steps trained again, no GPU-seconds charged"
    nothing = FELL_BACK.model_copy(update={"cost": JobCost()})
    assert not any("cost" in line for line in summary_lines("fell", nothing))  # no recovery, no GPU: nothing to say


def test_a_skipped_listing_cut_short_says_how_much_it_lists() -> None:
    """A report lists a few samples of each step (its 4 KiB budget): 13, 47, 55, 65 were four of
    step 1's sixteen, and the line read as if they were all."""
    steps = [SkippedStep(step=i, cause="data", samples=[SampleRange(first=i * 4, last=i * 4 + 3)]) for i in range(4)]
    line = skipped_line(Skipped(count=5, samples=80, steps=steps))
    assert line.startswith("  skipped: 5 step(s), 80 sample(s), 4 steps and 16 samples listed: step 1 (data: 0-3), ")
    whole = Skipped(count=1, samples=16, steps=[SkippedStep(step=0, cause="spike")])  # the loop named none
    assert skipped_line(whole) == "  skipped: 1 step(s), 16 sample(s): step 1 (spike: whole step)"


def test_a_statuss_series_has_each_attempts_span_last_loss_and_the_skips() -> None:
    series = series_of_status(FELL_BACK)
    assert [(s.attempt, s.precision, s.start_step, s.end_step) for s in series.spans] == [
        (0, "fp16", 0, 27),
        (1, "bf16", 20, 40),
    ]
    assert [(p.attempt, p.step, p.loss, p.loss_scale) for p in series.points] == [
        (0, 27, 2.5, 1.0),
        (1, 40, 1.25, None),
    ]
    assert [(m.step, m.cause) for m in series.skips] == [(12, "data")]


def test_status_says_clearly_when_the_cluster_cannot_be_reached(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters: [{name: c, cluster: {server: 'https://127.0.0.1:9'}}]\n"
        "contexts: [{name: c, context: {cluster: c, user: u, namespace: team}}]\nusers: [{name: u, user: {}}]\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "mpjob.cli", "status", "job", "--kubeconfig", str(kubeconfig)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1
    assert done.stdout.strip() == "error: cannot reach the cluster at https://127.0.0.1:9: MaxRetryError"
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize(
    ("content", "why"),
    [
        (b"\xff\xfe not text", "not UTF-8 text (byte 0)"),
        (b"clusters: [\n", "not YAML: "),
        (b"- a list\n", "not a kubeconfig (TypeError: "),
    ],
    ids=["not-text", "not-yaml", "not-a-mapping"],
)
def test_status_says_in_one_line_what_is_wrong_with_the_kubeconfig(tmp_path: Path, content: bytes, why: str) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_bytes(content)
    done = subprocess.run(
        [sys.executable, "-m", "mpjob.cli", "status", "job", "--kubeconfig", str(kubeconfig)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (done.returncode, done.stderr) == (1, "")
    assert done.stdout.startswith(f"error: no usable kubeconfig ({why}") and done.stdout.count("\n") == 1, done.stdout


def test_a_running_attempts_line_says_how_long_ago_its_step_last_moved() -> None:
    """`mpjob status` of a hung job: its step's progressTime (runPolicy.progressDeadlineSeconds
    counts from it) as seconds ago; a local run's summary, given no time, says only running."""
    status = MixedPrecisionJobStatus.model_validate(
        {"phase": "Running", "precision": "bf16", "step": 25,
         "attempts": [{"index": 0, "precision": "bf16", "progressTime": "2026-12-01T10:00:00Z"}]}
    )  # fmt: skip
    now = datetime(2026, 12, 1, 10, 0, 42, tzinfo=UTC)
    hung = summary_lines("ns/hung", status, now=now)[1]
    assert hung == "  attempt 0: bf16 steps 0-? running, its step last moved 42 s ago"
    assert summary_lines("ns/hung", status)[1] == "  attempt 0: bf16 steps 0-? running"


def _attempts(*ends: tuple[str, str | None]) -> list[dict[str, object]]:
    return [{"index": i, "precision": p, "reason": r} for i, (p, r) in enumerate(ends)]


def _recoveries_line(status: dict[str, object]) -> list[str]:
    lines = summary_lines("job", MixedPrecisionJobStatus.model_validate(status))
    return [line for line in lines if line.startswith("  recoveries")]


def test_a_resume_after_the_users_stop_is_no_recovery() -> None:
    """Ctrl-C (or runPolicy.suspend) and run again: two attempts, nothing recovered."""
    resumed = _attempts(("fp16", "Suspended"), ("fp16", "Succeeded"))
    counts = {"started": 2, "byReason": {"Suspended": 1, "Succeeded": 1}}
    assert _recoveries_line({"attempts": resumed, "attemptCounts": counts}) == []
    assert _recoveries_line({"attempts": resumed}) == []  # a status without counts: from the entries


def test_recoveries_count_the_fallbacks_and_resumes_after_the_cluster_not_the_stops_or_promotions() -> None:
    ends = _attempts(
        ("fp16", "NumericFault"), ("bf16", "Suspended"), ("bf16", "Repromote"), ("fp16", "Preempted"), ("fp16", None)
    )
    counts = {"started": 5, "byReason": {"NumericFault": 1, "Suspended": 1, "Repromote": 1, "Preempted": 1}}
    expected = ["  recoveries: 2 (fp16 -> bf16 -> fp16)"]  # the precision changes, not every attempt
    assert _recoveries_line({"attempts": ends, "attemptCounts": counts}) == expected
    assert _recoveries_line({"attempts": ends}) == expected


def test_recoveries_count_every_attempt_also_those_attempts_no_longer_lists() -> None:
    """30 preemptions, of which attempts[] keeps the first and the newest 20 (the counts say all)."""
    kept = [{"index": 0, "precision": "bf16", "reason": "Preempted"}]
    kept += [{"index": i, "precision": "bf16", "reason": "Preempted"} for i in range(10, 30)]
    kept[-1]["reason"] = "Succeeded"
    counts = {"started": 30, "byReason": {"Preempted": 29, "Succeeded": 1}, "omitted": 9}
    (line,) = _recoveries_line({"attempts": kept, "attemptCounts": counts})
    assert line == "  recoveries: 29 (bf16 -> ... -> bf16)"  # what the dropped entries ran in is not known


def test_recoveries_in_one_precision_name_no_path() -> None:
    """A preempted attempt and a retry: resumed twice in fp16, no precision changed."""
    ends = _attempts(("fp16", "Preempted"), ("fp16", "Failed"), ("fp16", "Succeeded"))
    assert _recoveries_line({"attempts": ends}) == ["  recoveries: 2 (all in fp16)"]


def test_an_attempt_that_quoted_stderr_keeps_to_one_line() -> None:
    """A message quoting a traceback over several lines is one line, its lines joined; one past
    SUMMARY_MESSAGE_CHARS keeps its beginning and its end (the error), its middle cut."""
    stderr = "exited 1 without a termination report; its stderr ended:\nTraceback (most recent call last):\n"
    said = stderr + '  File "train.py", line 1, in <module>\n\nModuleNotFoundError: No module named x\n'
    ended = [{"index": 0, "precision": "bf16", "reason": "InfraError", "message": said}]
    lines = summary_lines("job", MixedPrecisionJobStatus.model_validate({"attempts": ended}))
    assert lines[1] == (
        "  attempt 0: bf16 steps 0-? InfraError (exited 1 without a termination report; its stderr ended: | "
        'Traceback (most recent call last): | File "train.py", line 1, in <module> | '
        "ModuleNotFoundError: No module named x)"
    )
    ended[0]["message"] = "first line\n" + "x" * 2000 + "\nthe error"
    (line,) = summary_lines("job", MixedPrecisionJobStatus.model_validate({"attempts": ended}))[1:]
    assert "\n" not in line and len(line) < 60 + SUMMARY_MESSAGE_CHARS
    assert "(first line | xxx" in line and "xxx [...] xxx" in line and line.endswith("x | the error)")


def test_a_failed_jobs_headline_names_why_it_stopped_trying() -> None:
    """A job that failed after two of its six attempts said only `Failed in fp16 at step 5`: the
    Failed condition's reason (the same failure twice at one step) is what a user acts on."""
    attempt = {"precision": "fp16", "startStep": 0, "endStep": 5, "reason": "InfraError", "message": "KeyError: 'x'"}
    failed = {"type": "Failed", "status": "True", "reason": "FailedAtTheSameStep", "lastTransitionTime": "t"}
    status = {"phase": "Failed", "precision": "fp16", "step": 5, "conditions": [failed],
              "attempts": [{"index": 0, **attempt}, {"index": 1, **attempt}]}  # fmt: skip
    lines = summary_lines("job", MixedPrecisionJobStatus.model_validate(status))
    assert lines[0] == "job: Failed in fp16 at step 5 (FailedAtTheSameStep)"
    assert summary_lines("ns/fell", FELL_BACK)[0] == "ns/fell: Succeeded in bf16 at step 40"  # only a failure says why


def test_a_job_that_failed_before_any_attempt_says_the_failures_message() -> None:
    """A spec the operator's models refuse fails the job before any attempt (InvalidSpec): the
    field at fault is in the Failed condition's message alone, and `mpjob status` said only
    `Failed at step 0 (InvalidSpec)`."""
    why = "invalid spec: spec.training.steps: must be at least 1, got 0"
    failed = {"type": "Failed", "status": "True", "reason": "InvalidSpec", "message": why, "lastTransitionTime": "t"}
    status = MixedPrecisionJobStatus.model_validate({"phase": "Failed", "message": why, "conditions": [failed]})
    assert summary_lines("ns/bad", status) == ["ns/bad: Failed at step 0 (InvalidSpec)", f"  failed: {why}"]


def test_an_attempt_whose_end_step_is_unknown_says_so_not_step_0() -> None:
    """A resumed attempt whose ranks died before they resumed (the bucket gone) is recorded with
    endStep 0 below its startStep: unknown (planning.repeat). Its line said `steps 20-0`."""
    died = {"index": 1, "precision": "bf16", "startStep": 20, "endStep": 0, "reason": "InfraError", "message": "x"}
    began = {"index": 0, "precision": "bf16", "startStep": 0, "endStep": 0, "reason": "InfraError", "message": "x"}
    lines = summary_lines("job", MixedPrecisionJobStatus.model_validate({"attempts": [began, died]}))
    assert lines[1:3] == ["  attempt 0: bf16 steps 0-0 InfraError (x)", "  attempt 1: bf16 steps 20-? InfraError (x)"]


def test_a_waiting_job_says_why_it_waits_and_an_ended_one_does_not() -> None:
    """`mpjob status` of a job whose pods no node takes said only `Pending at step 0` and its
    attempt `running`: the conditions that say why it waits, naming the field, were left out."""
    said = "attempt 0: the scheduler finds no node for pod j-a0-0-x: ...; no node has resources.gpusPerWorker=16"
    unplaced = {
        "type": "PodsScheduled",
        "status": "False",
        "reason": "Unschedulable",
        "message": said,
        "lastTransitionTime": "t",
    }
    waiting = {
        "type": "Running",
        "status": "False",
        "reason": "AttemptStarted",
        "message": "waiting",
        "lastTransitionTime": "t",
    }
    attempt = {"index": 0, "precision": "bf16", "startStep": 0}
    status = {"phase": "Pending", "conditions": [unplaced, waiting], "attempts": [attempt]}
    lines = summary_lines("job", MixedPrecisionJobStatus.model_validate(status))
    assert lines[2:] == [f"  PodsScheduled: {said}"]
    backoff = {
        "type": "Running",
        "status": "False",
        "reason": "BackingOff",
        "message": "attempt 1 starts in 20s",
        "lastTransitionTime": "t",
    }
    status = {**status, "conditions": [backoff]}
    assert summary_lines("job", MixedPrecisionJobStatus.model_validate(status))[2:] == [
        "  Running: attempt 1 starts in 20s"
    ]
    ended = {**status, "phase": "Failed", "conditions": [unplaced]}
    assert summary_lines("job", MixedPrecisionJobStatus.model_validate(ended))[2:] == []

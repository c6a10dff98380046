"""A pod killed while its launcher stops its ranks (the operator's cut: SIGKILL 10 s after
SIGTERM, before `--grace-seconds` ends) leaves what the launcher knew then as its termination
message, true as it stands; the fold replaces it when the ranks end."""

from __future__ import annotations

import signal
import sys
from pathlib import Path
from typing import Any

import pytest

from mpjob.planning.endings import JobView, PodView, outcome_of
from mpjob_contract.codes import ExitCode, Reason
from mpjob_contract.report import TerminationReport
from mpjob_trainer.launch.provisional import PROVISIONAL
from tests.helpers import wait_for
from tests.unit.trainer.launcher_pods import Pod, stand_ins

pytestmark = pytest.mark.unit

#: Longer than any wait below: the launcher never ends its ranks by itself in these tests.
GRACE = ["--grace-seconds", "600"]


def ready(tmp: Path, *ranks: int) -> None:
    wait_for(lambda: all((tmp / f"ready-{r}").exists() for r in ranks), 30, message="the ranks ready")


def left(pod: Pod) -> str:
    """SIGKILL the launcher, as the kubelet does when the grace ends; the message it leaves."""
    pod.proc.kill()
    assert pod.proc.wait(10) == -signal.SIGKILL
    return (pod.folder / "pod.json").read_text()


def report_saying(pod: Pod, reason: str) -> TerminationReport | None:
    path = pod.folder / "pod.json"
    found = TerminationReport.parse_message(path.read_text()) if path.exists() else None
    return found if found is not None and found.reason == reason else None


def test_killed_before_any_rank_ended_the_pod_says_it_was_stopping_and_claims_nothing(
    tmp_path: Path, pods: Any
) -> None:
    pod = pods(tmp_path, ["--nproc-per-worker", "2", *GRACE], stand_ins(tmp_path, "stubborn", "stubborn"))
    ready(tmp_path, 0, 1)
    pod.proc.send_signal(signal.SIGTERM)
    wait_for(lambda: (tmp_path / "pod.json").exists(), 30, message="the launcher's message while it stops")
    text = left(pod)
    assert "SIGTERM received: stopping 2 local rank(s), none of which had ended" in text
    assert TerminationReport.parse_message(text) is None  # no reason, no step 0: nothing it did not know
    # The operator reads it as a deleted pod that left no report, the line as its message.
    cut = PodView("pod-0", 0, "Failed", alive=False, exit_code=137, termination_message=text, deleting=True)
    outcome = outcome_of(JobView(index=0, pods=(cut,)))
    assert outcome.report is None and outcome.platform_reason == Reason.DELETED and outcome.message == text


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG and /proc are Linux only")
def test_killed_after_a_rank_checkpointed_the_pod_reports_its_step_and_checkpoint(tmp_path: Path, pods: Any) -> None:
    pod = pods(tmp_path, ["--nproc-per-worker", "2", *GRACE], stand_ins(tmp_path, "wait", "stubborn"))
    ready(tmp_path, 0, 1)
    pod.proc.send_signal(signal.SIGTERM)
    wait_for(lambda: report_saying(pod, "Preempted"), 30, message="the report once rank 0 ended")
    left_text = left(pod)
    report = TerminationReport.parse_message(left_text)
    stubborn = Path(f"/proc/{(tmp_path / 'ready-1').read_text()}")
    wait_for(lambda: not stubborn.exists(), 10, message="rank 1 killed with the launcher")
    # Rank 1 still had grace left: a stop, not a crash, so a crashed sibling pod still explains the attempt.
    assert report is not None and report.reason == "Preempted"
    assert report.step == 7 and report.last_good_checkpoint is not None and report.last_good_checkpoint.step == 7
    assert "(SIGTERM received; " + PROVISIONAL + ": 1 of 2 rank(s) still stopping then)" in report.message
    cut = PodView("pod-0", 0, "Failed", alive=False, exit_code=137, termination_message=left_text, deleting=True)
    crashed = PodView("pod-1", 1, "Failed", alive=False, exit_code=1, termination_message="Segmentation fault")
    outcome = outcome_of(JobView(index=0, pods=(cut, crashed)))
    assert outcome.exit_code == 1 and outcome.message == "Segmentation fault"


def test_killed_while_the_sibling_of_a_failed_rank_stops_the_pod_reports_the_failure(tmp_path: Path, pods: Any) -> None:
    pod = pods(tmp_path, ["--nproc-per-worker", "2", *GRACE], stand_ins(tmp_path, "stubborn", "config-error"))
    wait_for(lambda: report_saying(pod, "ConfigError"), 30, message="the report once rank 1 failed")
    report = TerminationReport.parse_message(left(pod))
    assert report is not None and report.reason == "ConfigError"
    assert report.message.startswith("rank 1: cannot read its data shard")
    assert "(rank 1 failed; " + PROVISIONAL + ": 1 of 2 rank(s) still stopping then)" in report.message


def test_the_fold_replaces_the_provisional_report_when_the_ranks_end(tmp_path: Path, pods: Any) -> None:
    pod = pods(tmp_path, ["--nproc-per-worker", "2", *GRACE], stand_ins(tmp_path, "wait", "wait"))
    ready(tmp_path, 0, 1)
    pod.proc.send_signal(signal.SIGTERM)
    code, report = pod.wait(30)
    assert code == ExitCode.PREEMPTED and report is not None and report.reason == "Preempted"
    assert PROVISIONAL not in report.message and report.last_good_checkpoint is not None

"""mpjob-launch: the per-pod launcher's plan, its fold of endings, and real processes under it
(stand-in ranks from launcher_scripts/rank.py, and the real trainer in 2-process DDP on gloo)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from mpjob_contract.codes import ExitCode
from mpjob_contract.report import MAX_REPORT_BYTES, CheckpointRef, TerminationReport
from mpjob_trainer.launch import LaunchConfigError, RankEnding, fold_endings, parse_plan
from mpjob_trainer.launch.exits import RankExit, passthrough
from mpjob_trainer.launch.fold import rank_ending
from mpjob_trainer.launch.plan import DEFAULT_GRACE_SECONDS
from tests.helpers import Meeting, free_port, wait_for
from tests.unit.trainer.conftest import launch_env, spec
from tests.unit.trainer.launcher_pods import Pod, stand_ins

pytestmark = pytest.mark.unit

TRAINER = [sys.executable, "-m", "mpjob_trainer"]


# ---------------------------------------------------------------------------------- the fold


def ending(
    rank: int,
    code: int,
    reason: str | None = None,
    message: str = "",
    step: int = 0,
    ckpt: int | None = None,
    stopped: bool = False,
    order: int = 0,
) -> RankEnding:
    report = None
    if reason is not None:
        ref = CheckpointRef(step=ckpt, path=f"/ckpt/step-{ckpt}", sha256="ab", precision="fp16") if ckpt else None
        report = TerminationReport(reason=reason, message=message, step=step, last_good_checkpoint=ref)
    return RankEnding(local_rank=rank, rank=rank, returncode=code, report=report, stopped=stopped, order=order)


@dataclass(frozen=True)
class Fold:
    endings: list[RankEnding]
    code: int
    reason: str
    says: str = ""
    checkpoint: int | None = None
    step: int | None = None


FOLDS = {
    # Success reads as the trainer said it: no per-rank annotations to wade through.
    "all succeed": Fold(
        [ending(0, 0, "Succeeded", "trained 30 steps", step=30, ckpt=30), ending(1, 0, "Succeeded", step=30)],
        0,
        "Succeeded",
        "trained 30 steps",
        checkpoint=30,
        step=30,
    ),
    "success without reports": Fold([ending(0, 0), ending(1, 0)], 0, "Succeeded", "local rank 0 (rank 0) exited 0"),
    "preempted outranks success": Fold(
        [ending(0, 0, "Succeeded"), ending(1, 44, "Preempted", "stop")], 44, "Preempted", "rank 1: stop"
    ),
    "both preempted: rank 0's checkpoint": Fold(
        [
            ending(0, 44, "Preempted", "stopped at 12", step=12, ckpt=12, stopped=True, order=1),
            ending(1, 44, "Preempted", step=12, stopped=True, order=0),
        ],
        44,
        "Preempted",
        "rank 0: stopped at 12",
        checkpoint=12,
        step=12,
    ),
    "a crash outranks the stop it caused": Fold(
        [ending(0, 44, "Preempted", step=11, ckpt=10, stopped=True, order=1), ending(1, -9, order=0)],
        1,
        "InfraError",
        "local rank 1 (rank 1) was killed by SIGKILL without a termination report",
        checkpoint=10,
        step=11,
    ),
    "numeric fault outranks infrastructure": Fold(
        [ending(0, -15, stopped=True, order=1), ending(1, 42, "NumericFault", "nan storm", step=20, ckpt=15)],
        42,
        "NumericFault",
        "rank 1: nan storm",
        checkpoint=15,
        step=20,
    ),
    # Rank 0 writes a DDP job's checkpoints: another rank's report names the one it resumed from.
    # A re-promotion with rank 1's report chosen resumed the next attempt ten steps back.
    "a re-promotion whose rank 1 ended first: rank 0's newer checkpoint": Fold(
        [
            ending(0, 47, "Repromote", "10 clean steps", step=25, ckpt=25, stopped=True, order=1),
            ending(1, 47, "Repromote", "10 clean steps", step=25, ckpt=15, order=0),
        ],
        47,
        "Repromote",
        "10 clean steps",
        checkpoint=25,
        step=25,
    ),
    "configuration error outranks numeric fault": Fold(
        [ending(0, 42, "NumericFault", "nan"), ending(1, 43, "ConfigError", "bad shard")],
        43,
        "ConfigError",
        "rank 1: bad shard",
    ),
    "lowest rank among equals": Fold(
        [ending(0, 42, "NumericFault", "A"), ending(1, 42, "NumericFault", "B")], 42, "NumericFault", "rank 0: A"
    ),
    "the first infrastructure failure to end among equals": Fold(
        [ending(0, 1, "InfraError", "lost its peer", order=1), ending(1, -9, order=0)],
        1,
        "InfraError",
        "(rank 1) was killed by SIGKILL",
    ),
    "a rank killed from outside before the peer that lost it, whichever was reaped first": Fold(
        [ending(0, 1, "InfraError", "gloo: Connection reset by peer", order=0), ending(1, -9, order=1)],
        1,
        "InfraError",
        "(rank 1) was killed by SIGKILL",
    ),
    "a rank that ended by itself before one that was stopped": Fold(
        [ending(0, 1, "InfraError", "gloo: closed", stopped=True, order=0), ending(1, 3, order=1)],
        1,
        "InfraError",
        "(rank 1) exited 3 without a termination report",
    ),
    "an exit code without a report": Fold([ending(0, 43)], 43, "ConfigError", "exited 43 without a termination"),
    # 42 and 44-47 stand for what only the session decides, and it says so in its report first
    "a session's code without its report is the script's own exit": Fold(
        [ending(0, 42)], 1, "InfraError", "exited 42 without a termination report (42 means NumericFault only"
    ),
    "a script's own exit 44 after its session succeeded": Fold(
        [ending(0, 44, "Succeeded", "trained 30 steps")], 1, "InfraError", "exited 44 (its report said Succeeded)"
    ),
    "the session's own report of a crash passes through": Fold(
        [ending(0, 1, "InfraError", "KeyError: 'labels'")], 1, "InfraError", "KeyError: 'labels'"
    ),
    "exit 137 is infrastructure": Fold([ending(0, 137), ending(1, 0, "Succeeded")], 1, "InfraError", "exited 137"),
    "a report that contradicts its code": Fold(
        [ending(0, 1, "Succeeded", "done")], 1, "InfraError", "exited 1 (its report said Succeeded)"
    ),
    "a rank's own report of the session's crash is kept": Fold(
        [ending(0, 1, "InfraError", "oom")], 1, "InfraError", "oom"
    ),
    # an abort in the interpreter's teardown after the session failed (a native thread left running)
    "a crash its session reported, then an abort at exit": Fold(
        [ending(0, -6, "InfraError", "the script exited with code 44")],
        1,
        "InfraError",
        "the script exited with code 44",
    ),
    "a success its session reported, then an abort at exit": Fold(
        [ending(0, -6, "Succeeded", "trained 30 steps")],
        1,
        "InfraError",
        "killed by SIGABRT (its report said Succeeded)",
    ),
    "a single rank's report passes through as it is": Fold(
        [ending(0, 42, "NumericFault", "nan storm", ckpt=5)], 42, "NumericFault", "nan storm", checkpoint=5
    ),
}


@pytest.mark.parametrize("case", FOLDS.values(), ids=FOLDS.keys())
def test_the_fold_picks_one_code_and_one_report_by_precedence(case: Fold) -> None:
    pod = fold_endings(case.endings)
    assert (pod.code, pod.report.reason) == (case.code, case.reason)
    assert case.says in pod.report.message, pod.report.message
    annotated = "[" in pod.report.message
    assert annotated == (len(case.endings) > 1 and case.reason != "Succeeded"), pod.report.message
    got = pod.report.last_good_checkpoint
    assert (got.step if got else None) == case.checkpoint
    if case.step is not None:
        assert pod.report.step == case.step
    own = case.endings[0].own_report
    if len(case.endings) == 1 and own is not None:
        assert pod.report.message == own.message


def test_a_rank_with_an_invalid_report_ends_the_pod_as_an_infrastructure_failure_naming_the_field() -> None:
    bad = rank_ending(RankExit(0, 0, 44, report_text='{"reason": "Preempted", "precision": "float16", "step": 5}'))
    sibling = ending(1, 44, "Preempted", "stopped", step=7, stopped=True)
    pod = fold_endings([bad, sibling])
    assert (pod.code, pod.report.reason) == (1, "InfraError")
    assert "invalid termination report: precision" in pod.report.message
    assert pod.report.precision is None  # nothing of the invalid report is passed on
    assert TerminationReport.parse_message(pod.report.to_message()) == pod.report


@pytest.mark.parametrize("said", ["OOMKilled", "Evicted", "DeadlineExceeded", "Suspended"])
def test_a_lone_rank_whose_report_claims_the_clusters_word_ends_the_pod_as_a_crash(said: str) -> None:
    """A report of exit 1 claiming an OOM kill, an eviction or a deadline was taken as given: a
    process of the tenant's could end the job for good (OOMKilled, DeadlineExceeded) or make its
    crash look like the cluster's doing. Only the cluster shows those."""
    text = json.dumps({"reason": said, "step": 5, "message": "trust me"})
    assert passthrough([RankExit(0, 0, 1, report_text=text)]) is None  # judged, not written through
    pod = fold_endings([rank_ending(RankExit(0, 0, 1, report_text=text))])
    assert (pod.code, pod.report.reason) == (1, "InfraError")
    assert f"invalid termination report: reason: Value error, {said} is the cluster's to say" in pod.report.message


def test_the_folded_report_stays_within_the_termination_message_budget() -> None:
    many = [ending(r, 42, "NumericFault", "x" * 2000, order=r) for r in range(64)]
    assert len(fold_endings(many).report.to_message().encode()) <= MAX_REPORT_BYTES


# ---------------------------------------------------------------------------------- the plan


def attempt_json(**over: Any) -> str:
    return json.dumps({"jobName": "t", "precision": "fp32", "spec": spec(**over)})


def test_the_plan_falls_back_to_the_workers_of_an_attempt_run_smaller_than_the_spec() -> None:
    """An elastic attempt shrunk to 2 of the spec's 4 workers: its ranks meet 2 pods' worth, not 4."""
    shrunk = json.loads(attempt_json(workers=4, elastic={"minWorkers": 2}, training={"batchSize": 8}))
    shrunk.update(workers=2, microBatch=8, gradAccumulation=2)
    plan = parse_plan(["--", "train"], {"MPJOB_LAUNCH": json.dumps(shrunk), "JOB_COMPLETION_INDEX": "1"})
    assert (plan.workers, plan.worker_index, plan.world_size) == (2, 1, 2)


def test_the_plan_falls_back_to_the_attempt_and_the_job_completion_index() -> None:
    env = {
        "MPJOB_LAUNCH": attempt_json(workers=3, resources={"gpusPerWorker": 0, "processesPerWorker": 2}),
        "JOB_COMPLETION_INDEX": "2",
    }
    plan = parse_plan(["--", "train"], env)
    assert (plan.nproc, plan.workers, plan.worker_index, plan.world_size) == (2, 3, 2, 6)
    assert [plan.global_rank(i) for i in range(plan.nproc)] == [4, 5]
    assert parse_plan(["--", "t"], {"MPJOB_LAUNCH": attempt_json(resources={"gpusPerWorker": 4})}).nproc == 4
    assert parse_plan(["--", "t"], {**env, "MPJOB_PROCESSES_PER_WORKER": "3"}).nproc == 3
    assert parse_plan(["--nproc-per-worker", "1", "--", "t"], {**env, "MPJOB_PROCESSES_PER_WORKER": "3"}).nproc == 1
    bare = parse_plan(["--", "t"], {})
    assert (bare.nproc, bare.workers, bare.worker_index, bare.grace_seconds) == (1, 1, 0, 20.0)
    assert (bare.master_addr, bare.master_port) == ("127.0.0.1", "29500")


BAD_PLANS = {
    "no command": ([], {}, "after --"),
    "zero processes": (["--nproc-per-worker", "0", "--", "t"], {}, "--nproc-per-worker"),
    "not a number": (["--nproc-per-worker", "two", "--", "t"], {}, "--nproc-per-worker"),
    "zero workers": (["--workers", "0", "--", "t"], {}, "--workers"),
    "index out of range": (["--workers", "2", "--worker-index", "2", "--", "t"], {}, "--worker-index"),
    "index from the Job": (["--", "t"], {"JOB_COMPLETION_INDEX": "1"}, "--worker-index"),
    "negative grace": (["--grace-seconds", "-1", "--", "t"], {}, "--grace-seconds"),
    "unknown flag": (["--nprocs", "2", "--", "t"], {}, "--nprocs"),
    "bad env": (["--", "t"], {"MPJOB_PROCESSES_PER_WORKER": "x"}, "--nproc-per-worker: $MPJOB_PROCESSES_PER_WORKER"),
    "bad attempt": (["--", "t"], {"MPJOB_LAUNCH": "{}"}, "--nproc-per-worker: $MPJOB_LAUNCH"),
    "bad port": (["--", "t"], {"MASTER_PORT": "http"}, "$MASTER_PORT"),
}


@pytest.mark.parametrize(("argv", "env", "names"), BAD_PLANS.values(), ids=BAD_PLANS.keys())
def test_a_bad_flag_or_setting_is_refused_by_name(argv: list[str], env: dict[str, str], names: str) -> None:
    with pytest.raises(LaunchConfigError, match=re.escape(names)):
        parse_plan(argv, env)


# ------------------------------------------------------------------------- real processes


def test_the_launcher_starts_without_torch() -> None:
    probe = "import sys, mpjob_trainer.launch; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", probe], check=True, timeout=60)


def test_the_launchers_start_path_imports_no_pydantic_and_no_torch() -> None:
    """Up to the spawn of its ranks (flags read, plan made) and through a lone rank's own
    ending, the launcher runs on the standard library: pydantic only when a report is built."""
    probe = (
        "import sys\n"
        "from mpjob_trainer.launch import parse_plan\n"
        "from mpjob_trainer.launch.exits import RankExit, passthrough\n"
        "from mpjob_trainer.launch import supervise, spawn, tee, signals\n"
        "plan = parse_plan(['--nproc-per-worker', '2', '--workers', '3', '--', 't'], {'JOB_COMPLETION_INDEX': '1'})\n"
        "assert plan.world_size == 6\n"
        'text = \'{"reason": "NumericFault", "message": "nan"}\'\n'
        "assert passthrough([RankExit(0, 0, 42, report_text=text)]).text == text\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('pydantic', 'pydantic_core', 'torch'))\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", probe], check=True, timeout=60)


def test_each_rank_gets_torchruns_environment(tmp_path: Path, pods: Any) -> None:
    flags = ["--workers", "2", "--worker-index", "1", "--nproc-per-worker", "2"]
    code, report = pods(tmp_path, flags, stand_ins(tmp_path, "env", "env")).wait(30)
    assert code == 0 and report is not None and report.reason == "Succeeded"
    seen = {rank: json.loads((tmp_path / f"env-{rank}.json").read_text()) for rank in (2, 3)}
    for local, rank in enumerate((2, 3)):
        env = seen[rank]
        assert {k: env[k] for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK")} == {
            "RANK": str(rank),
            "LOCAL_RANK": str(local),
            "WORLD_SIZE": "4",
            "LOCAL_WORLD_SIZE": "2",
            "GROUP_RANK": "1",
        }
        assert (env["ROLE_RANK"], env["ROLE_WORLD_SIZE"], env["GROUP_WORLD_SIZE"]) == (str(rank), "4", "2")
        assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == ("127.0.0.1", "29500")
    # Each rank reports to a file of its own; the pod's path is the launcher's.
    logs = {seen[r]["MPJOB_TERMINATION_LOG"] for r in (2, 3)}
    assert len(logs) == 2 and str(tmp_path / "pod.json") not in logs


def test_bad_flags_exit_43_with_a_report_naming_the_flag(tmp_path: Path, pods: Any) -> None:
    pod = pods(tmp_path, ["--workers", "2", "--worker-index", "5"], ["true"])
    code, report = pod.wait(30)
    assert code == ExitCode.CONFIG_ERROR
    assert report is not None and report.reason == "ConfigError" and "--worker-index" in report.message
    assert "--worker-index" in pod.stderr


def test_a_command_that_does_not_exist_is_a_configuration_error(tmp_path: Path, pods: Any) -> None:
    code, report = pods(tmp_path, ["--nproc-per-worker", "2"], ["/no/such/train"]).wait(30)
    assert code == ExitCode.CONFIG_ERROR and report is not None and "/no/such/train" in report.message


def test_a_python_script_that_does_not_exist_is_a_configuration_error(tmp_path: Path, pods: Any) -> None:
    """Python's "can't open file" (exit 2, no report) read as an infrastructure failure, and the
    job was retried: no rank is started, and every one ends 43 naming the command and the file."""
    script = tmp_path / "train.py"
    pod = pods(tmp_path / "pod", ["--nproc-per-worker", "2"], [sys.executable, "-u", str(script), "--lr", "0.1"])
    code, report = pod.wait(30)
    assert code == ExitCode.CONFIG_ERROR, pod.stderr
    assert report is not None and report.reason == "ConfigError", report
    assert f"its script {str(script)!r} does not exist (working directory: {os.getcwd()})" in report.message
    assert f"task.command [{sys.executable!r}, '-u', {str(script)!r}" in report.message
    assert "rank 0 exited 43, rank 1 exited 43" in report.message and " started: pid " not in pod.stderr


def test_a_configuration_error_in_one_rank_stops_the_other_and_exits_43(tmp_path: Path, pods: Any) -> None:
    pod = pods(tmp_path, ["--nproc-per-worker", "2"], stand_ins(tmp_path, "wait", "config-error"))
    code, report = pod.wait(30)
    assert code == ExitCode.CONFIG_ERROR
    assert report is not None and report.reason == "ConfigError"
    assert report.message.startswith("rank 1: rank 1: cannot read its data shard")
    assert "rank 0 exited 44" in report.message  # the sibling was stopped and honoured it


def test_a_sibling_that_ignores_sigterm_is_killed_after_the_grace_period(tmp_path: Path, pods: Any) -> None:
    pod = pods(tmp_path, ["--nproc-per-worker", "2", "--grace-seconds", "1"], stand_ins(tmp_path, "stubborn", "exit:3"))
    code, report = pod.wait(30)
    assert code == ExitCode.INFRA_ERROR and report is not None and report.reason == "InfraError"
    assert "local rank 1 (rank 1) exited 3" in report.message and "rank 0 was killed by SIGKILL" in report.message


def test_sigterm_is_passed_on_once_to_every_rank(tmp_path: Path, pods: Any) -> None:
    pod = pods(tmp_path, ["--nproc-per-worker", "2"], stand_ins(tmp_path, "wait", "wait"))
    wait_for(lambda: all((tmp_path / f"ready-{r}").exists() for r in (0, 1)), 30, message="both ranks ready")
    pod.proc.send_signal(signal.SIGTERM)
    code, report = pod.wait(30)
    assert code == ExitCode.PREEMPTED and report is not None and report.reason == "Preempted"
    assert report.step == 7 and report.message.startswith("rank 0: rank 0 stopped")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux only")
def test_ranks_die_with_a_launcher_that_is_killed(tmp_path: Path, pods: Any) -> None:
    pod = pods(tmp_path, ["--nproc-per-worker", "2"], stand_ins(tmp_path, "stubborn", "stubborn"))
    wait_for(lambda: all((tmp_path / f"ready-{r}").exists() for r in (0, 1)), 30, message="both ranks ready")
    pids = [int((tmp_path / f"ready-{r}").read_text()) for r in (0, 1)]
    pod.proc.kill()
    pod.proc.wait(60)
    wait_for(lambda: not any(Path(f"/proc/{pid}").exists() for pid in pids), 60, message="ranks gone")


# ---------------------------------------------------------------- the real trainer, 2 ranks


def trainer_env(meeting: Meeting, tmp: Path, job: dict[str, Any], precision: str) -> dict[str, str]:
    return launch_env(tmp, job, precision, name="pod.json", extra=meeting(2))


@pytest.mark.process
def test_a_numeric_fault_exits_42_with_one_report(tmp_path: Path, pods: Any, meeting: Meeting) -> None:
    task = {"builtin": "mlp", "args": {"inputs": 8, "hidden": 16, "samples": 256, "overflowAtStep": 10}}
    job = spec(task=task, training={"steps": 40, "logEvery": 5}, checkpoint={"everySteps": 5})
    pod = pods(tmp_path, ["--nproc-per-worker", "2"], TRAINER, env=trainer_env(meeting, tmp_path, job, "fp16"))
    code, report = pod.wait(180)
    assert code == ExitCode.NUMERIC_FAULT, pod.stderr[-3000:]
    assert report is not None and report.reason == "NumericFault" and report.precision == "fp16"
    assert report.last_good_checkpoint is not None and report.last_good_checkpoint.step == 10
    assert report.counters.non_finite_losses >= 3


def _until_training(pod: Pod) -> None:
    wait_for(lambda: any(e["event"] == "step" for e in pod.events), 120, message="a step event")


@pytest.mark.process
def test_sigterm_to_the_launcher_checkpoints_and_exits_44(tmp_path: Path, pods: Any, meeting: Meeting) -> None:
    job = spec(training={"steps": 1_000_000, "logEvery": 5}, checkpoint={"everySteps": 1_000_000})
    pod = pods(tmp_path, ["--nproc-per-worker", "2"], TRAINER, env=trainer_env(meeting, tmp_path, job, "fp32"))
    _until_training(pod)
    pod.proc.send_signal(signal.SIGTERM)
    code, report = pod.wait(120)
    assert code == ExitCode.PREEMPTED, pod.stderr[-3000:]
    assert report is not None and report.reason == "Preempted"
    ckpt = report.last_good_checkpoint
    assert ckpt is not None and ckpt.step == report.step > 0
    assert (Path(ckpt.path) / "manifest.json").exists()


def _listening(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
        return True
    return False


@pytest.mark.process
def test_sigterm_while_a_rank_waits_for_a_peer_that_never_comes_ends_the_pod_at_once_as_preempted(
    tmp_path: Path, pods: Any
) -> None:
    """The attempt shrank or was preempted before its group formed: rank 0 of 2 waits in the
    rendezvous (blocked in C++, where no Python handler runs). It must not hold its GPU until
    the grace period's SIGKILL: it dies at once and the pod ends as a stop, not a crash. Rank 0
    hosts the store, as in a pod."""
    env = launch_env(
        tmp_path, spec(training={"steps": 50}), "fp32", name="pod.json", extra={"MASTER_PORT": str(free_port())}
    )
    flags = ["--workers", "2", "--worker-index", "0", "--nproc-per-worker", "1", "--grace-seconds", "60"]
    pod = pods(tmp_path, flags, TRAINER, env=env)
    wait_for(lambda: _listening(int(env["MASTER_PORT"])), 120, message="rank 0's rendezvous store")
    pod.proc.send_signal(signal.SIGTERM)
    code, report = pod.wait(45)  # well inside the grace period (60 s): no SIGKILL ended it
    assert code == ExitCode.PREEMPTED, pod.stderr[-3000:]
    assert report is not None and report.reason == "Preempted" and report.step == 0
    assert "was killed by SIGTERM before it trained" in report.message


@pytest.mark.process
def test_a_rank_killed_by_sigkill_stops_its_sibling_and_exits_1(tmp_path: Path, pods: Any, meeting: Meeting) -> None:
    job = spec(training={"steps": 1_000_000, "logEvery": 5}, checkpoint={"everySteps": 1_000_000})
    pod = pods(
        tmp_path,
        ["--nproc-per-worker", "2", "--grace-seconds", "5"],
        TRAINER,
        env=trainer_env(meeting, tmp_path, job, "fp32"),
    )
    _until_training(pod)
    os.kill(pod.child_pid(1), signal.SIGKILL)
    killed = time.monotonic()
    code, report = pod.wait(60)
    # Within the settle second plus the grace period, with 10 s for a starved machine: the
    # default grace would take more.
    assert time.monotonic() - killed < 1 + 5 + 10 < 1 + DEFAULT_GRACE_SECONDS, pod.stderr[-3000:]
    assert code == ExitCode.INFRA_ERROR, pod.stderr[-3000:]
    assert report is not None and report.reason == "InfraError"
    assert report.message.startswith("local rank 1 (rank 1) was killed by SIGKILL"), report.message


# ------------------------------------------------- start-up, pass-through, the stderr tail


def test_sigterm_at_start_ends_the_launcher_at_once_with_44_and_no_rank_started(tmp_path: Path, pods: Any) -> None:
    # Sent before the launcher's exec and held pending by the mask it starts with (SIGTERM
    # blocked, as a parent may leave it): it lands when the launcher unblocks it, after its
    # handlers are in place and before any rank starts, however slow either process runs.
    env = {**os.environ, "MPJOB_LAUNCH": attempt_json()}
    pod = pods(tmp_path, [], stand_ins(tmp_path, "wait"), env=env, pending=signal.SIGTERM)
    code, report = pod.wait(30)
    assert code == ExitCode.PREEMPTED, pod.stderr
    assert report is not None and report.reason == "Preempted"
    assert "SIGTERM received before local rank 0 (rank 0) started" in report.message
    # At once: with no rank started there is nothing to wait for, no grace period.
    assert "SIGTERM received before any rank started: starting none" in pod.stderr
    assert "started: pid" not in pod.stderr and not (tmp_path / "ready-0").exists(), "a rank was started"


def test_a_lone_ranks_own_report_passes_through_as_written(tmp_path: Path, pods: Any) -> None:
    written = '{"reason": "NumericFault", "step": 12, "message": "nan storm", "futureField": 1}'
    script = f"import os, sys; open(os.environ['MPJOB_TERMINATION_LOG'], 'w').write({written!r}); sys.exit(42)"
    pod = pods(tmp_path, ["--nproc-per-worker", "1"], [sys.executable, "-c", script])
    code, report = pod.wait(30)
    assert code == ExitCode.NUMERIC_FAULT
    assert (tmp_path / "pod.json").read_text() == written
    assert report is not None and (report.step, report.message) == (12, "nan storm")


def test_a_lone_ranks_report_nested_too_deep_to_decode_still_ends_the_pod_with_one_code_and_report(
    tmp_path: Path, pods: Any
) -> None:
    """A rank's report is the tenant's word: one nested deeper than the JSON parser recurses
    (within the report's byte budget) is no report, never the launcher's own crash; and its exit
    42, with no report the session wrote to say so, is no numeric fault."""
    deep = '{"reason": "NumericFault", "message": "deep", "x": ' + "[" * 1400 + "]" * 1400 + "}"
    assert len(deep.encode()) <= MAX_REPORT_BYTES
    script = f"import os, sys; open(os.environ['MPJOB_TERMINATION_LOG'], 'w').write({deep!r}); sys.exit(42)"
    pod = pods(tmp_path, ["--nproc-per-worker", "1"], [sys.executable, "-c", script])
    code, report = pod.wait(30)
    assert code == ExitCode.INFRA_ERROR, pod.stderr
    assert report is not None and report.reason == "InfraError", pod.stderr
    assert "Traceback" not in pod.stderr


CANNOT_START = {
    "code that does not parse": (["-c", "def ("], "SyntaxError: "),
    "a module that fails to import": (
        ["-c", "import mpjob_no_such_module_for_tests"],
        "ModuleNotFoundError: No module named 'mpjob_no_such_module_for_tests'",
    ),
}


@pytest.mark.parametrize(("args", "cause"), CANNOT_START.values(), ids=CANNOT_START.keys())
def test_a_rank_that_dies_without_a_report_has_its_stderr_tail_in_the_report(
    tmp_path: Path, pods: Any, args: list[str], cause: str
) -> None:
    pod = pods(tmp_path, ["--nproc-per-worker", "1"], [sys.executable, *args])
    code, report = pod.wait(30)
    assert code == ExitCode.INFRA_ERROR
    assert report is not None and report.reason == "InfraError"
    assert report.message.startswith("local rank 0 (rank 0) exited "), report.message
    assert "without a termination report; its stderr ended:\n" in report.message
    assert cause in report.message.splitlines()[-1], report.message
    assert cause in pod.stderr  # the pod log still has it, as the rank wrote it


def test_stderr_reaches_the_pod_log_unchanged(tmp_path: Path, pods: Any) -> None:
    # ~1 MiB in lines of varied length (many pipe fills); the rank keeps a copy of what it wrote.
    script = (
        "import sys; text = ''.join(f'line {i}: ' + 'x' * (i % 97) + '\\n' for i in range(20_000)); "
        f"open({str(tmp_path / 'sent')!r}, 'w').write(text); sys.stderr.write(text); sys.stderr.flush()"
    )
    code, _ = pods(tmp_path, ["--nproc-per-worker", "1"], [sys.executable, "-c", script]).wait(60)
    assert code == 0
    said = (tmp_path / "stderr").read_text()
    assert (tmp_path / "sent").read_text() in said  # byte for byte, between the launcher's own lines
    assert not [line for line in said.splitlines() if not line.startswith(("line ", "mpjob-launch: "))]


def test_the_stderr_tail_is_the_last_lines_and_stays_within_the_report_budget() -> None:
    from mpjob_trainer.launch.tee import TAIL_BYTES, StderrTail

    tail = StderrTail(keep=4096)
    for i in range(10_000):
        tail.add(f"noise {i}\n".encode())
    tail.add("Traceback (most recent call last):\n  ...\nRuntimeError: the cause \u00e9\n".encode())
    text = tail.text()
    assert text.endswith("RuntimeError: the cause \u00e9") and len(text.encode()) <= TAIL_BYTES
    assert len(text.splitlines()) <= 8
    huge = StderrTail()
    huge.add(b"y" * 100_000 + b"\nthe last line\n")
    assert huge.text().endswith("the last line") and len(huge.text().encode()) <= TAIL_BYTES
    many = [
        RankEnding(r, r, 1, None, stderr_tail=huge.text() or "", order=r) for r in range(64)
    ]  # every rank died without a report
    folded = fold_endings(many).report
    assert len(folded.to_message().encode()) <= MAX_REPORT_BYTES
    assert "the last line" in folded.message


def test_a_rank_stopped_after_it_reported_keeps_its_report() -> None:
    """A sibling pod ended first and the launcher passed SIGTERM on to a rank that had already
    written its report (its session over, SIGTERM back to the default): the report is its end."""
    folded = fold_endings([ending(0, -signal.SIGTERM, "NonFiniteInFp32", "step 3 is non-finite", stopped=True)])
    assert folded.code == ExitCode.NON_FINITE_IN_FP32 and folded.report.reason == "NonFiniteInFp32"
    assert folded.report.message == "step 3 is non-finite"
    # Killed by the SIGTERM passed on, with no report: it had not trained (SIGTERM ends a rank by
    # default before its session catches it and while it waits for its peers), a stop.
    stopped = fold_endings([ending(0, -signal.SIGTERM, None, stopped=True)])
    assert (stopped.code, stopped.report.reason) == (ExitCode.PREEMPTED, "Preempted")
    # Killed by a SIGTERM the launcher did not pass on: an infrastructure failure.
    assert fold_endings([ending(0, -signal.SIGTERM, "NonFiniteInFp32")]).report.reason == "InfraError"

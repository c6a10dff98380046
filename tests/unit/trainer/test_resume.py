"""Exact resume after SIGKILL and SIGTERM, across precisions, and over bad checkpoints."""

from __future__ import annotations

import io
import json
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from mpjob_contract.codes import ExitCode
from mpjob_contract.report import TerminationReport
from mpjob_trainer import session as mpjob
from mpjob_trainer.checkpoint import CheckpointStore, CheckpointTaken, resume
from mpjob_trainer.checkpoint import store as store_module
from mpjob_trainer.checkpoint.store import CORRUPT_KEPT
from mpjob_trainer.errors import ConfigError
from mpjob_trainer.session.state import TrainingState
from tests import warm
from tests.helpers import wait_for
from tests.unit.trainer.conftest import (
    binds_permissions,
    in_process_launch,
    launch_env,
    paced_spec,
    parse,
    run_trainer,
    spec,
    train_squares,
    unprivileged,
)
from tests.unit.trainer.interleaving import Interleaving

pytestmark = pytest.mark.unit

LONG = {"training": {"steps": 60, "logEvery": 5}, "checkpoint": {"everySteps": 10, "keep": 10}}


def _state(path: Path) -> dict:
    return torch.load(path / "state.pt", weights_only=True)


def _assert_identical(a: dict, b: dict) -> None:
    for key in a["model"]:
        assert torch.equal(a["model"][key], b["model"][key]), key
    sa, sb = a["optimizer"]["state"], b["optimizer"]["state"]
    assert sa.keys() == sb.keys()
    for pid in sa:
        for name, value in sa[pid].items():
            assert torch.equal(value, sb[pid][name]), (pid, name)
    assert a["appliedSteps"] == b["appliedSteps"]


@pytest.fixture(scope="module")
def straight_final(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], dict]:
    """The final checkpoint of an uninterrupted LONG run per precision, trained once for the
    module (the SIGKILL and SIGTERM cases compare against the same one)."""
    runs: dict[str, dict] = {}

    def final(precision: str) -> dict:
        if precision not in runs:
            folder = tmp_path_factory.mktemp(f"straight-{precision}")
            straight = run_trainer(folder, spec(precision={"mode": precision}, **LONG), precision)
            assert straight.code == 0, straight.stderr
            runs[precision] = _state(folder / "ckpt" / "step-000000060")
        return runs[precision]

    return final


@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGTERM])
@pytest.mark.process
def test_interrupted_and_resumed_run_is_bit_identical(
    tmp_path: Path, precision: str, how: int, straight_final: Callable[[str], dict]
) -> None:
    # 80 ms a step (the weights are the straight run's): the signal lands inside the run, 4 s of it
    # left after checkpoint 10, however slow this machine is to send it.
    job = paced_spec(0.08, precision={"mode": precision}, **LONG)

    env = launch_env(tmp_path / "cut", job, precision, ckpt=tmp_path / "cut" / "ckpt")
    (tmp_path / "cut").mkdir()
    proc = warm.Popen([sys.executable, "-m", "mpjob_trainer"], env=env, stdout=warm.PIPE, text=True)
    wait_for(
        lambda: (tmp_path / "cut" / "ckpt" / "step-000000010" / "manifest.json").exists(),
        120,
        interval=0.02,
        message="checkpoint 10",
    )
    proc.send_signal(how)
    out, _ = proc.communicate(timeout=60)
    if how == signal.SIGTERM:
        assert proc.returncode == ExitCode.PREEMPTED
        preempted = [e for e in parse(out) if e["event"] == "preempted"]
        assert preempted and preempted[0]["step"] < 60
        report = json.loads(Path(env["MPJOB_TERMINATION_LOG"]).read_text())
        assert report["reason"] == "Preempted" and report["lastGoodCheckpoint"]["step"] == preempted[0]["step"]
    else:
        assert proc.returncode == -signal.SIGKILL

    resumed = run_trainer(
        tmp_path / "cut", job, precision, attempt=1, ckpt=tmp_path / "cut" / "ckpt", name="report2.json"
    )
    assert resumed.code == 0, resumed.stderr
    assert resumed.of("resume") and resumed.of("resume")[0]["step"] >= 10
    _assert_identical(straight_final(precision), _state(tmp_path / "cut" / "ckpt" / "step-000000060"))


@pytest.mark.process
def test_fp16_checkpoint_resumes_in_bf16_with_the_same_master_weights(tmp_path: Path) -> None:
    first = run_trainer(tmp_path, spec(precision={"mode": "fp16"}, training={"steps": 20}), "fp16")
    assert first.code == 0
    fp16_state = _state(tmp_path / "ckpt" / "step-000000020")
    assert fp16_state["scaler"] is not None
    second = run_trainer(
        tmp_path,
        spec(training={"steps": 21}),
        "bf16",
        attempt=1,
        name="r2.json",
        resume_from=str(tmp_path / "ckpt" / "step-000000020"),
    )
    assert second.code == 0, second.stderr
    resume = second.of("resume")[0]
    assert resume["step"] == 20 and resume["fromPrecision"] == "fp16"
    bf16_state = _state(tmp_path / "ckpt" / "step-000000021")
    assert bf16_state["precision"] == "bf16" and bf16_state["scaler"] is None
    assert bf16_state["appliedSteps"] == fp16_state["appliedSteps"] + 1
    for key, value in fp16_state["model"].items():
        assert value.dtype == torch.float32 == bf16_state["model"][key].dtype  # fp32 masters
        torch.testing.assert_close(bf16_state["model"][key], value, atol=0.05, rtol=0)


# ---------------------------------------------------------------- bad checkpoints (no subprocess)


def _store(root: Path, digest: str = "d1") -> CheckpointStore:
    return CheckpointStore(root, keep=5, config_digest=digest)


def _save_two(root: Path) -> CheckpointStore:
    store = _store(root)
    for step in (10, 20):
        store.write(step, "fp16", {"step": step, "w": torch.full((64,), float(step))})
    return store


def _truncate(path: Path) -> None:
    data = (path / "state.pt").read_bytes()
    (path / "state.pt").write_bytes(data[: len(data) // 2])


def _flip(path: Path) -> None:
    data = bytearray((path / "state.pt").read_bytes())
    data[len(data) // 2] ^= 0x01
    (path / "state.pt").write_bytes(bytes(data))


def _drop_manifest(path: Path) -> None:
    (path / "manifest.json").unlink()


def _other_digest(path: Path) -> None:
    manifest = json.loads((path / "manifest.json").read_text())
    manifest["configDigest"] = "other"
    (path / "manifest.json").write_text(json.dumps(manifest))


@pytest.mark.parametrize("damage", [_truncate, _flip, _drop_manifest, _other_digest])
def test_a_bad_newest_checkpoint_falls_back_to_the_previous_good_one(tmp_path: Path, damage) -> None:
    _save_two(tmp_path)
    damage(tmp_path / "step-000000020")
    rejected: list[dict] = []
    store = CheckpointStore(tmp_path, keep=5, config_digest="d1", log=lambda e, **f: rejected.append(f))
    loaded = resume.load(store, prefer=str(tmp_path / "step-000000020"))
    assert loaded is not None
    ref, state = loaded
    assert ref.step == 10 and state["step"] == 10
    assert rejected and "step-000000020" in rejected[0]["problem"]


def test_no_good_checkpoint_means_step_zero(tmp_path: Path) -> None:
    _save_two(tmp_path)
    for step in (10, 20):
        _flip(tmp_path / f"step-{step:09d}")
    assert resume.load(_store(tmp_path)) is None


@pytest.mark.process
def test_the_trainer_says_when_it_starts_from_zero(tmp_path: Path) -> None:
    run = run_trainer(tmp_path, spec(training={"steps": 2}))
    assert run.of("freshStart") and "starting at step 0" in run.of("freshStart")[0]["reason"]


@pytest.mark.process
def test_a_checkpoint_folder_that_is_a_file_ends_the_attempt_as_a_configuration_error(tmp_path: Path) -> None:
    (tmp_path / "ckpt").write_text("a file where the job's checkpoint folder goes")
    run = run_trainer(tmp_path, spec(training={"steps": 2}))
    assert run.code == ExitCode.CONFIG_ERROR, run.stderr
    assert run.report is not None and f"checkpointDir {tmp_path / 'ckpt'}" in run.report.message
    assert "not a folder" in run.report.message and "Traceback" not in run.stderr


#: Open a store on the folder argv[1] in a process that file permissions bind; prints what it raised.
_OPEN_STORE = """
import sys
from pathlib import Path
from mpjob_trainer.checkpoint import CheckpointStore
from mpjob_trainer.errors import ConfigError
from mpjob_trainer.session.state import TrainingState
try:
    CheckpointStore(Path(sys.argv[1]), keep=2, config_digest="d1")
except ConfigError as exc:
    print(exc)
"""


@pytest.mark.process
@binds_permissions
def test_a_checkpoint_folder_it_may_not_write_is_a_configuration_error_before_any_training(tmp_path: Path) -> None:
    folder = tmp_path / "ckpt"
    folder.mkdir(mode=0o555)  # another user's, or a volume mounted read-only: no save could ever land
    done = unprivileged(_OPEN_STORE, str(folder))
    assert done.returncode == 0, done.stderr
    assert f"checkpointDir {folder}: this trainer may not write into it" in done.stdout


def test_checkpoints_are_pruned_to_keep_and_never_overwritten(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path, keep=2, config_digest="d1")
    for step in (10, 20, 30):
        store.write(step, "bf16", {"step": step, "w": torch.ones(4) * step})
    assert [s for s, _ in store.steps()] == [20, 30]
    before = (tmp_path / "step-000000030" / "state.pt").read_bytes()
    store.write(30, "bf16", {"step": 30, "w": torch.zeros(4)})  # same step again
    assert (tmp_path / "step-000000030" / "state.pt").read_bytes() == before


@pytest.mark.parametrize(
    ("value", "named"),
    [(np.int64(3), "numpy.int64"), ({"epochs": [np.float64(0.5)]}, "numpy.float64"), (range(3), "builtins.range")],
)
def test_a_state_a_restore_could_not_read_back_is_never_written_and_names_the_value(
    tmp_path: Path, value: object, named: str
) -> None:
    """torch.load(weights_only=True), the restore's reader, refuses such values: written, the
    checkpoint would be reported good and every resume would pass over it (to step 0)."""
    store = CheckpointStore(tmp_path, keep=5, config_digest="d1")
    store.write(10, "bf16", {"step": 10, "sampler": {"epoch": 1}})
    with pytest.raises(ConfigError, match=rf"step 20 holds sampler\.epoch.*{named}.*weights_only=True"):
        store.write(20, "bf16", {"step": 20, "sampler": {"epoch": value}})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-000000010"]  # nothing of step 20 left
    loaded = resume.load(store)
    assert loaded is not None and loaded[0].step == 10


def _tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_a_store_prunes_only_what_its_job_wrote(tmp_path: Path) -> None:
    other = CheckpointStore(tmp_path, keep=5, config_digest="d2", job="ns/other/u2")
    for step in (5, 15):
        other.write(step, "fp16", {"step": step, "w": torch.zeros(4)})
    (tmp_path / "step-000000001").mkdir()  # no manifest: nobody's to remove
    (tmp_path / "step-000000001" / "notes").write_text("copied in by hand")
    theirs = _tree(tmp_path)
    store = CheckpointStore(tmp_path, keep=2, config_digest="d1", job="ns/j/u1")
    for step in (10, 20, 30, 40):
        store.write(step, "bf16", {"step": step, "w": torch.ones(4) * step})
    assert [s for s, p in store.steps() if store.wrote(p)] == [30, 40]  # keep 2 of its own
    assert {k: v for k, v in _tree(tmp_path).items() if k in theirs} == theirs  # the others', byte for byte
    assert [s for s, _ in store.steps()] == [1, 5, 15, 30, 40]


@pytest.mark.parametrize("theirs", ["another job's", "unreadable", "another job's, corrupt"])
def test_a_checkpoint_it_did_not_write_at_its_step_is_never_renamed_or_replaced(tmp_path: Path, theirs: str) -> None:
    final = tmp_path / "step-000000020"
    if theirs == "unreadable":
        final.mkdir()
        (final / "manifest.json").write_text("{not json")
    else:
        CheckpointStore(tmp_path, keep=5, config_digest="d2", job="ns/other/u2").write(20, "fp16", {"step": 20})
        if theirs.endswith("corrupt"):
            _flip(final)
    before = _tree(tmp_path)
    store = CheckpointStore(tmp_path, keep=1, config_digest="d1", job="ns/j/u1")
    store.write(10, "bf16", {"step": 10, "w": torch.ones(4)})
    with pytest.raises(CheckpointTaken, match="did not write"):
        store.write(20, "bf16", {"step": 20, "w": torch.ones(4)})
    assert {k: v for k, v in _tree(tmp_path).items() if k.startswith("step-000000020")} == before
    assert not list(tmp_path.glob(".corrupt-*")) and not list(tmp_path.glob(".tmp-*"))
    assert resume.load(store)[0].step == 10  # type: ignore[index]  # its own last good stays


def test_its_own_corrupt_checkpoint_at_the_same_step_is_moved_aside_and_replaced(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path, keep=5, config_digest="d1", job="ns/j/u1")
    store.write(20, "bf16", {"step": 20, "w": torch.ones(4)})
    _flip(tmp_path / "step-000000020")
    ref = store.write(20, "bf16", {"step": 20, "w": torch.zeros(4)}).ref
    assert ref.step == 20 and store.verify(Path(ref.path))[0].sha256 == ref.sha256
    assert len(list(tmp_path.glob(".corrupt-step-000000020-*"))) == 1  # kept for inspection, its own


def test_its_own_checkpoint_damaged_again_at_the_same_step_is_moved_aside_again_and_replaced(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path, keep=5, config_digest="d1", job="ns/j/u1")
    store.write(20, "bf16", {"step": 20, "w": torch.ones(4)})
    for value in (2.0, 3.0):  # the same process (the same pid) meets a damaged step 20 twice
        _flip(tmp_path / "step-000000020")
        ref = store.write(20, "bf16", {"step": 20, "w": torch.full((4,), value)}).ref
        assert torch.equal(store.verify(Path(ref.path))[1]["w"], torch.full((4,), value))
    assert len(list(tmp_path.glob(".corrupt-step-000000020-*"))) == 2  # both kept for inspection


def _set_aside(root: Path) -> dict[Path, str]:
    """The folders set aside as damaged in `root`: the sha256 of the state their manifest lists."""
    return {
        p: json.loads((p / "manifest.json").read_text())["files"]["state.pt"]["sha256"] for p in root.glob(".corrupt-*")
    }


def test_only_the_newest_of_its_checkpoints_set_aside_as_damaged_are_kept(tmp_path: Path) -> None:
    """A volume that keeps damaging checkpoints must not fill up with them: this job keeps the
    CORRUPT_KEPT it set aside last (of the newest steps), another job's stay as they are."""
    other = CheckpointStore(tmp_path, keep=5, config_digest="d2", job="ns/other/u2")
    other.write(5, "fp16", {"step": 5})
    _flip(tmp_path / "step-000000005")
    other.write(5, "fp16", {"step": 5})
    theirs = _set_aside(tmp_path)
    store = CheckpointStore(tmp_path, keep=2, config_digest="d1", job="ns/j/u1")
    aside = []
    for step, times in [(10, 1), (20, 1), (30, 3), (40, 1)]:
        sha = store.write(step, "bf16", {"step": step, "w": torch.zeros(4)}).ref.sha256
        for value in range(times):
            _flip(tmp_path / f"step-{step:09d}")
            aside.append(sha)
            sha = store.write(step, "bf16", {"step": step, "w": torch.full((4,), value + 1.0)}).ref.sha256
    found = _set_aside(tmp_path)
    assert {p: sha for p, sha in found.items() if p in theirs} == theirs
    assert sorted(sha for p, sha in found.items() if p not in theirs) == sorted(aside[-CORRUPT_KEPT:])
    assert not list(tmp_path.glob(".tmp-*"))


def test_a_prune_killed_midway_leaves_no_step_folder_behind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = CheckpointStore(tmp_path, keep=1, config_digest="d1", job="ns/j/u1")
    store.write(10, "bf16", {"step": 10, "w": torch.ones(4)})

    def killed(path: Path, ignore_errors: bool = False) -> None:  # the process dies a file into the delete
        (Path(path) / "manifest.json").unlink()
        raise KeyboardInterrupt

    monkeypatch.setattr("shutil.rmtree", killed)
    with pytest.raises(KeyboardInterrupt):
        store.write(20, "bf16", {"step": 20, "w": torch.ones(4)})  # durable, then it prunes step 10
    monkeypatch.undo()
    restarted = CheckpointStore(tmp_path, keep=1, config_digest="d1", job="ns/j/u1")
    restarted.clean_stale()
    assert [step for step, _ in restarted.steps()] == [20]  # no manifest-less step 10 left, never pruned
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-000000020"]


def test_two_writers_of_one_step_never_write_into_each_others_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two trainers (an attempt's pod still running beside the next one's, each pid the same in
    its own pid namespace: here one process) save step 20 into one volume at once. Neither may
    delete or fill the folder the other is writing: the step holds one writer's checkpoint whole."""
    first = CheckpointStore(tmp_path, keep=3, config_digest="d1", job="ns/j/u1")
    second = CheckpointStore(tmp_path, keep=3, config_digest="d1", job="ns/j/u1")
    race = Interleaving(lambda: second.write(20, "bf16", {"step": 20, "w": torch.full((4,), 2.0)}).ref)
    # the second writes its state while the first is about to hash its files, then waits for it
    monkeypatch.setattr(store_module, "hash_tree", race.before(store_module.hash_tree))
    ref = first.write(20, "bf16", {"step": 20, "w": torch.ones(4)}).ref
    race.finish()
    verified, state = first.verify(tmp_path / "step-000000020")
    assert torch.equal(state["w"], torch.ones(4)) and verified.sha256 == ref.sha256  # the first's, whole
    assert getattr(race.outcome[0], "sha256", None) == ref.sha256, race.outcome  # kept, not overwritten
    assert not list(tmp_path.glob(".tmp-*"))


def test_a_killed_save_leaves_only_a_temp_dir_that_loading_ignores(tmp_path: Path) -> None:
    store = _save_two(tmp_path)
    tmp = tmp_path / ".tmp-000000030-999"
    tmp.mkdir()
    (tmp / "state.pt").write_bytes(b"partial")
    ref, _ = resume.load(store)
    assert ref.step == 20
    store.clean_stale()
    assert not tmp.exists()


@pytest.mark.process
def test_failed_checkpoint_writes_are_counted_and_training_goes_on(tmp_path: Path) -> None:
    """A volume that refuses writes (here a real EFBIG from a file-size limit on the trainer
    process) costs checkpoints, not the run: each failure is logged and counted, training goes
    on, the last good checkpoint stays the previous one, and saves succeed again once the
    volume accepts writes."""
    import resource

    # Paced (25 ms a step): the run must still be training when this test, reading its lines,
    # takes the limit off after the first failure, without racing through steps meanwhile.
    args = {"inputs": 64, "hidden": 256, "samples": 512, "stepDelay": {"fp32": 0.025}}
    job = spec(
        task={"builtin": "mlp", "args": args},
        training={"steps": 400, "logEvery": 50},
        checkpoint={"everySteps": 10, "keep": 2},
    )
    env = launch_env(tmp_path, job, "fp32")
    limit = 16 * 1024  # far below one checkpoint of this model, above everything else written

    def small_files() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))

    proc = warm.Popen(
        [sys.executable, "-m", "mpjob_trainer"],
        env=env,
        stdout=warm.PIPE,
        text=True,
        preexec_fn=small_files,
    )
    assert proc.stdout is not None
    seen: list[dict] = []
    for line in proc.stdout:
        if line.startswith("{"):
            seen.append(json.loads(line))
            if seen[-1]["event"] == "checkpointFailed":
                resource.prlimit(proc.pid, resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY,) * 2)
                break
    rest, _ = proc.communicate(timeout=180)
    events = seen + parse(rest)
    assert proc.returncode == ExitCode.SUCCESS

    failed = [e for e in events if e["event"] == "checkpointFailed"]
    assert failed and failed[0]["step"] == 10 and failed[0]["error"]
    assert [e["failures"] for e in failed] == list(range(1, len(failed) + 1))
    assert all(e["trainingStep"] > e["step"] for e in failed), "training went on past each failed save"
    first_failure = failed[0]["step"]
    saved = [e for e in events if e["event"] == "checkpoint"]
    assert saved and saved[0]["step"] > first_failure, "saves succeed again once the volume takes writes"
    assert saved[-1]["step"] == 400
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["lastGoodCheckpoint"]["step"] == 400
    # Nothing half-written is left to be mistaken for a checkpoint.
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["step-000000390", "step-000000400"]


def test_a_relaunched_attempt_resumes_from_its_own_newer_checkpoint_not_the_named_one(tmp_path: Path) -> None:
    """A fallback attempt told to resume from fp16's step 20 wrote bf16's 30 and 40, then its
    queue preempted it; readmitted with the same launch, it goes on from 40, not 20."""
    store = _save_two(tmp_path)
    for step in (30, 40):
        store.write(step, "bf16", {"step": step, "w": torch.full((64,), float(step))})
    named = str(tmp_path / "step-000000020")
    assert resume.load(store, named, newer_in="bf16")[0].step == 40  # type: ignore[index]
    assert resume.load(store, named, newer_in="fp32")[0].step == 20  # type: ignore[index]
    assert resume.load(store, named)[0].step == 20  # type: ignore[index]
    _flip(tmp_path / "step-000000040")
    assert resume.load(store, named, newer_in="bf16")[0].step == 30  # type: ignore[index]  # a bad one is skipped


Make = Callable[[list[torch.nn.Parameter]], torch.optim.Optimizer]


def _train_with(launch: Any, make: Make) -> tuple[int, Any]:
    """The SDK's loop in this process with the optimizer `make` builds: its exit code and report."""
    code = ExitCode.SUCCESS
    try:
        with mpjob.start(launch=launch) as run:
            torch.manual_seed(0)
            model = torch.nn.Linear(4, 1)
            optimizer = make(list(model.parameters()))
            start = run.resume(model=model, optimizer=optimizer)
            train_squares(run, model, optimizer, start, lambda i: torch.full((4, 4), float(i % 3)))
    except SystemExit as ended:
        code = ended.code  # type: ignore[assignment]
    report = TerminationReport.model_validate_json((Path(launch.checkpoint_dir).parent / "report.json").read_text())
    return code, report


@pytest.mark.parametrize(
    ("first", "then", "named"),
    [
        (lambda p: torch.optim.SGD(p, lr=0.01), lambda p: torch.optim.AdamW(p), ("AdamW", "betas")),
        # the same hyperparameters, another per-parameter state: once a KeyError at the first step, retried
        (lambda p: torch.optim.Adam(p), lambda p: torch.optim.Adamax(p), ("Adamax", "exp_inf")),
    ],
    ids=["sgd-into-adamw", "adam-into-adamax"],
)
def test_an_optimizer_state_of_another_kind_is_a_configuration_error_naming_what_does_not_fit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, first: Make, then: Make, named: tuple[str, str]
) -> None:
    job = spec(training={"steps": 10, "logEvery": 5}, checkpoint={"everySteps": 5})
    first_code, _ = _train_with(in_process_launch(tmp_path, monkeypatch, job), first)
    assert first_code == ExitCode.SUCCESS
    longer = spec(training={"steps": 20, "logEvery": 5}, checkpoint={"everySteps": 5})
    code, report = _train_with(in_process_launch(tmp_path, monkeypatch, longer), then)
    assert code == ExitCode.CONFIG_ERROR and report.reason == "ConfigError", report.message
    assert "'optimizer'" in report.message and all(word in report.message for word in named), report.message


@pytest.mark.parametrize(
    "make",
    [
        lambda p: torch.optim.AdamW(p, lr=0.01, fused=True),
        lambda p: torch.optim.AdamW(p, lr=0.01, foreach=True),
        lambda p: torch.optim.SGD(p, lr=0.01, momentum=0.9, nesterov=True),
    ],
    ids=["fused-adamw", "foreach-adamw", "sgd-momentum"],
)
def test_an_optimizer_of_the_same_kind_resumes_exactly_with_its_schedule(
    make: Callable[[list[torch.nn.Parameter]], torch.optim.Optimizer],
) -> None:
    def built() -> tuple[torch.nn.Linear, torch.optim.Optimizer, Any]:
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 2)
        optimizer = make(list(model.parameters()))
        return model, optimizer, torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)

    def train(model: torch.nn.Linear, optimizer: torch.optim.Optimizer, schedule: Any, steps: range) -> None:
        for i in steps:
            model(torch.full((3, 4), float(i))).pow(2).mean().backward()
            optimizer.step()
            optimizer.zero_grad()
            schedule.step()

    model, optimizer, schedule = built()
    train(model, optimizer, schedule, range(3))
    objects = {"model": model, "optimizer": optimizer, "schedule": schedule}
    written = io.BytesIO()
    torch.save(TrainingState(objects).capture(3, 3, "fp32", None), written)  # as a checkpoint holds it
    written.seek(0)
    saved = torch.load(written, weights_only=True)
    train(model, optimizer, schedule, range(3, 6))
    again, resumed, resumed_schedule = built()
    TrainingState({"model": again, "optimizer": resumed, "schedule": resumed_schedule}).restore(saved, "fp32", None)
    train(again, resumed, resumed_schedule, range(3, 6))
    assert torch.equal(again.weight, model.weight) and torch.equal(again.bias, model.bias)
    assert resumed.param_groups[0]["lr"] == optimizer.param_groups[0]["lr"]

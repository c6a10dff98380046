"""Sharded checkpoints (checkpoint.shards): a script on the SDK whose model is sharded with
FSDP2's fully_shard, run by the launcher in gloo process groups on CPU.

- killed at random moments and run again, it ends bit for bit where a straight run ends
  (every rank's shards, generators and small state), in fp16 and bf16;
- a checkpoint written by 4 processes resumes on 2 and on 1 with the same full weights and
  optimizer state, gathered from the ranks, and the same data position in samples;
- a truncated shard, a missing shard, a flipped byte and a manifest that does not match are
  each rejected and the previous good checkpoint is used, also when only another rank's share
  of the checks finds the damage; so is a shard whose sha256 matches and that still does not
  load (every rank rejects it together).
"""

from __future__ import annotations

import itertools
import json
import random
import shutil
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

from mpjob_contract.codes import ExitCode
from mpjob_contract.report import TerminationReport
from mpjob_trainer.checkpoint import CheckpointStore, CheckpointTaken, resume
from mpjob_trainer.checkpoint import sharded as sharded_module
from mpjob_trainer.checkpoint.bucket import BucketMisconfigured
from mpjob_trainer.checkpoint.manifest import read_manifest
from mpjob_trainer.checkpoint.s3 import BucketCheckpointStore
from mpjob_trainer.checkpoint.select import AnyStore
from mpjob_trainer.checkpoint.sharded import ShardedWriter
from mpjob_trainer.checkpoint.shards import SHARDED_OBJECTS, SHARDS, restore_shards, state_dicts
from mpjob_trainer.errors import ConfigError
from tests import warm
from tests.helpers import Meeting, rendezvous, wait_for
from tests.unit.trainer.conftest import launch_env, parse, spec
from tests.unit.trainer.interleaving import Interleaving
from tests.unit.trainer.memory_bucket import SETTINGS, MemoryBucket
from tests.unit.trainer.test_hostile_dcp_files import zero_a_tensor
from tests.unit.trainer.test_own_loop_resume import assert_identical

pytestmark = pytest.mark.unit

SCRIPT = Path(__file__).with_name("sharded_script.py")
#: Numbers the runs' termination reports.
RUNS = itertools.count()


def command(nproc: int) -> list[str]:
    launcher = [sys.executable, "-m", "mpjob_trainer.launch", "--nproc-per-worker", str(nproc), "--workers", "1"]
    return [*launcher, "--", sys.executable, str(SCRIPT)]


def job(steps: int, precision: str) -> dict[str, Any]:
    return spec(
        task={"command": ["python", SCRIPT.name], "args": {"blocks": 3, "width": 32}},
        training={"steps": steps, "logEvery": 5, "seed": 1},
        precision={"mode": precision},
        checkpoint={"everySteps": 5, "keep": 3},
    )


def start(
    meeting: Meeting, tmp: Path, ckpt: Path, job_spec: dict[str, Any], *, nproc: int, env: dict[str, str] | None = None
) -> Any:
    tmp.mkdir(parents=True, exist_ok=True)
    precision = job_spec["precision"]["mode"]
    extra = {**meeting(nproc), **(env or {})}
    full_env = launch_env(tmp, job_spec, precision, ckpt=ckpt, extra=extra, name=f"report-{next(RUNS)}.json")
    return warm.Popen(command(nproc), env=full_env, stdout=warm.PIPE, stderr=warm.STDOUT, text=True)


def finish(proc: warm.Popen) -> list[dict[str, Any]]:
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out[-4000:]
    return parse(out)


def newest(ckpt: Path) -> int:
    """The step of the newest committed checkpoint in `ckpt` (0: none)."""
    return max((int(p.parent.name.split("-")[1]) for p in ckpt.glob("step-*/manifest.json")), default=0)


def contents(folder: Path, out: Path) -> dict[str, Any]:
    """A sharded checkpoint as plain tensors (DCP's shards joined offline) and its rank files."""
    dcp_to_torch_save(folder, out)
    ranks = {p.name: torch.load(p, weights_only=True) for p in sorted(folder.glob("rank-*.pt"))}
    return {"shards": torch.load(out, weights_only=True), "ranks": ranks}


# ---------------------------------------------------------------- exact resume
@pytest.mark.parametrize("precision", ["fp16", "bf16"])
@pytest.mark.process
def test_sharded_run_killed_at_random_moments_ends_bit_identical(
    tmp_path: Path, precision: str, meeting: Meeting
) -> None:
    # 100 ms a step in the cut runs: each kill waits for a checkpoint at most 10 steps on, so a
    # prompt second kill leaves some 35 steps (3.5 s) to the end, and a starved test's late kill
    # still lands inside the run.
    steps, nproc, chance = 60, 2, random.Random()
    spec_ = job(steps, precision)
    finish(start(meeting, tmp_path / "straight", tmp_path / "straight" / "ckpt", spec_, nproc=nproc))

    ckpt = tmp_path / "cut" / "ckpt"
    for kill in range(2):
        proc = start(meeting, tmp_path / "cut", ckpt, spec_, nproc=nproc, env={"SHARDED_SCRIPT_STEP_SECONDS": "0.1"})
        wanted = newest(ckpt) + 5 * chance.randint(1, 2)
        wait_for(lambda w=wanted: newest(ckpt) >= w, 180, interval=0.01, message=f"the checkpoint of step {wanted}")
        time.sleep(chance.uniform(0.0, 0.3))  # not a wait for anything: it picks the random moment to kill at
        proc.send_signal(signal.SIGKILL)  # the launcher; its ranks die with it
        proc.communicate(timeout=60)
        assert proc.returncode == -signal.SIGKILL, f"kill {kill}"
        assert not (ckpt / f"step-{steps:09d}").exists(), "killed before the end"
    events = finish(start(meeting, tmp_path / "cut", ckpt, spec_, nproc=nproc))
    assert [e for e in events if e["event"] == "resume"], "the rerun resumed from a checkpoint"

    final = f"step-{steps:09d}"
    straight = contents(tmp_path / "straight" / "ckpt" / final, tmp_path / "straight.pt")
    resumed = contents(ckpt / final, tmp_path / "resumed.pt")
    assert sorted(straight["ranks"]) == ["rank-00000.pt", "rank-00001.pt"]
    assert straight["ranks"]["rank-00000.pt"]["samples"] == steps * nproc * 4
    assert_identical(straight, resumed)


# ---------------------------------------------------------------- resharding
@pytest.mark.process
def test_checkpoint_of_4_processes_resumes_on_2_and_on_1_with_identical_full_state(
    tmp_path: Path, meeting: Meeting
) -> None:
    steps, spec_ = 10, job(10, "bf16")
    wrote = tmp_path / "n4"
    finish(
        start(
            meeting, wrote, wrote / "ckpt", spec_, nproc=4, env={"SHARDED_SCRIPT_FULL_STATE": str(tmp_path / "n4.pt")}
        )
    )
    reference = torch.load(tmp_path / "n4.pt", weights_only=True)
    assert reference["samples"] == steps * 4 * 4
    assert read_manifest(wrote / "ckpt" / f"step-{steps:09d}").world_size == 4
    for nproc in (2, 1):
        here = tmp_path / f"n{nproc}"
        shutil.copytree(wrote / "ckpt", here / "ckpt")
        dump = tmp_path / f"n{nproc}.pt"
        events = finish(
            start(meeting, here, here / "ckpt", spec_, nproc=nproc, env={"SHARDED_SCRIPT_FULL_STATE": str(dump)})
        )
        assert [e["step"] for e in events if e["event"] == "resume"] == [steps]
        resumed = torch.load(dump, weights_only=True)
        assert resumed["optimizer"]["state"], "the optimizer state came back"
        assert_identical(reference, resumed, f"on {nproc}")


# ---------------------------------------------------------------- another job's checkpoint
@pytest.mark.process
def test_another_jobs_checkpoint_at_the_last_step_ends_a_sharded_run_as_a_config_error(
    tmp_path: Path, meeting: Meeting
) -> None:
    """Every retry would train back to the last step and meet it again: a configuration error
    naming the folder on every rank (as a whole-model run's, test_foreign_checkpoint)."""
    ckpt = tmp_path / "ckpt"
    theirs = CheckpointStore(ckpt, keep=3, config_digest="other", job="ns/other/u2").write(10, "fp32", {})
    proc = start(meeting, tmp_path, ckpt, job(10, "bf16"), nproc=2)
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == ExitCode.CONFIG_ERROR, out[-4000:]
    (written,) = tmp_path.glob("report-*.json")
    report = TerminationReport.model_validate_json(written.read_text())
    assert report.reason == "ConfigError" and f"{theirs.ref.path}, in this job's checkpoint folder" in report.message
    assert report.last_good_checkpoint is not None and report.last_good_checkpoint.step == 5
    assert read_manifest(Path(theirs.ref.path)).job == "ns/other/u2"  # left as it is


# ---------------------------------------------------------------- corruption
@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Checkpoints of steps 5, 10 and 15 written by 2 processes."""
    tmp = tmp_path_factory.mktemp("sharded")
    with rendezvous(2) as meet:
        finish(start(lambda _: meet, tmp, tmp / "ckpt", job(15, "bf16"), nproc=2))
    return tmp / "ckpt"


def truncate(folder: Path) -> None:
    shard = folder / "__1_0.distcp"
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])


def remove(folder: Path) -> None:
    (folder / "__0_0.distcp").unlink()


def flip(folder: Path, name: str = "__1_0.distcp") -> None:
    data = bytearray((folder / name).read_bytes())
    data[len(data) // 2] ^= 0x01
    (folder / name).write_bytes(bytes(data))


def mismatch(folder: Path) -> None:
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["step"] = 14  # its files say 15
    (folder / "manifest.json").write_text(json.dumps(manifest))
    folder.rename(folder.with_name(f"step-{14:09d}"))  # as the folder of step 14: only its files disagree


@pytest.mark.parametrize(
    ("damage", "problem"),
    [
        (truncate, "bytes, its manifest says"),
        (remove, "missing"),
        (flip, "sha256 mismatch"),
        (mismatch, "not the manifest's step 14"),
    ],
)
@pytest.mark.process
def test_damaged_sharded_checkpoint_is_rejected_for_the_previous_good_one(
    written: Path, tmp_path: Path, damage: Callable[[Path], None], problem: str
) -> None:
    ckpt = tmp_path / "ckpt"
    shutil.copytree(written, ckpt)
    damage(ckpt / f"step-{15:09d}")
    manifest = read_manifest(ckpt / f"step-{10:09d}")
    logged: list[dict[str, Any]] = []
    store = CheckpointStore(
        ckpt, 3, str(manifest.config_digest), lambda event, **f: logged.append({"event": event, **f}), job=manifest.job
    )
    loaded = resume.load(store)
    assert loaded is not None
    ref, state = loaded
    assert ref.step == 10 and state["step"] == 10
    assert [e["event"] for e in logged] == ["checkpointRejected"]
    assert problem in logged[0]["problem"], logged[0]["problem"]


@pytest.mark.process
def test_damage_found_by_another_rank_makes_every_rank_resume_the_previous_checkpoint(
    written: Path, tmp_path: Path, meeting: Meeting
) -> None:
    """Rank 1's share of the checks covers its own shard, __1_0.distcp: rank 0 must reject it too."""
    ckpt = tmp_path / "ckpt"
    shutil.copytree(written, ckpt)
    flip(ckpt / f"step-{15:09d}", "__1_0.distcp")
    events = finish(start(meeting, tmp_path, ckpt, job(15, "bf16"), nproc=2))
    assert [e["step"] for e in events if e["event"] == "resume"] == [10]
    rejected = [e for e in events if e["event"] == "checkpointRejected"]
    assert len(rejected) == 1 and "rank 1" in rejected[0]["problem"], rejected
    assert read_manifest(ckpt / f"step-{15:09d}").step == 15  # written again, the damaged one moved aside
    assert list(ckpt.glob(".corrupt-step-000000015-*"))


@pytest.mark.process
def test_a_shard_that_verifies_but_does_not_load_makes_every_rank_resume_the_previous_checkpoint(
    written: Path, tmp_path: Path, meeting: Meeting
) -> None:
    """Its sha256 matches (the manifest recomputed) and its index is sound, but a tensor's bytes
    do not load: the job goes on from the previous good checkpoint instead of failing."""
    ckpt = tmp_path / "ckpt"
    shutil.copytree(written, ckpt)
    zero_a_tensor(ckpt / f"step-{15:09d}")
    events = finish(start(meeting, tmp_path, ckpt, job(20, "bf16"), nproc=2))
    assert [e["step"] for e in events if e["event"] == "resume"] == [10]
    rejected = [e for e in events if e["event"] == "checkpointRejected"]
    assert len(rejected) == 1 and "cannot read its shards" in rejected[0]["problem"], rejected
    assert read_manifest(ckpt / f"step-{15:09d}").step == 15 and list(ckpt.glob(".corrupt-step-000000015-*"))


def test_a_rank_file_a_restore_could_not_read_back_is_never_committed(tmp_path: Path) -> None:
    writer = ShardedWriter(CheckpointStore(tmp_path, keep=3, config_digest="test"))
    state = {SHARDS: {"model": nn.Linear(4, 4).state_dict()}, "step": 5, "sampler": {"epoch": np.int64(1)}}
    with pytest.raises(ConfigError, match=r"step 5 holds sampler\.epoch, a numpy\.int64"):
        writer.start(5, "bf16", state).finish()
    assert not list(tmp_path.iterdir())  # no step folder, and its .tmp-* removed


def test_shards_a_restore_could_not_read_back_are_never_committed(tmp_path: Path) -> None:
    """DCP writes an optimizer's non-tensor values with an unrestricted pickle; the restore reads
    them weights-only (WeightsOnlyPlanner), so a numpy learning rate must stop the save, named: a
    ConfigError on every rank, as a single-file save's (no retry writes it)."""
    writer = ShardedWriter(CheckpointStore(tmp_path, keep=3, config_digest="test"))
    optimizer = {"state": {}, "param_groups": [{"lr": np.float64(0.1), "params": ["weight"]}]}
    state = {SHARDS: {"model": nn.Linear(4, 4).state_dict(), "optimizer": optimizer}, "step": 5}
    with pytest.raises(ConfigError, match=r"step 5 holds shards\.optimizer\.param_groups\[0\]\.lr, a numpy\.float64"):
        writer.start(5, "bf16", state).finish()
    assert not list(tmp_path.iterdir())


class RefusingBucket(MemoryBucket):
    """A bucket whose credentials may read and not write (BucketMisconfigured on every upload)."""

    def upload(self, key: str, path: Path) -> None:
        raise BucketMisconfigured(f"checkpoint bucket 'ckpt' refused to store {key}: AccessDenied")


def test_a_bucket_refusing_a_sharded_saves_files_is_a_config_error_naming_it(tmp_path: Path) -> None:
    """As a single-file save to it: BucketMisconfigured (a ConfigError, the attempt not retried)."""
    store = BucketCheckpointStore(
        f"{SETTINGS.url}/ns/job/u1", SETTINGS, keep=3, config_digest="test", job="ns/job/u1", bucket=RefusingBucket()
    )
    state = {SHARDS: {"model": nn.Linear(4, 4).state_dict()}, "step": 5}
    with pytest.raises(BucketMisconfigured, match=r"refused to store .*step-000000005.*AccessDenied"):
        ShardedWriter(store).start(5, "bf16", state).finish()
    assert store.manifest(store.url(5)) is None


def _another_jobs(store: AnyStore, step: int) -> None:
    """Another job's checkpoint of `step` where `store` keeps its own (its folder, or its bucket prefix)."""
    if isinstance(store, BucketCheckpointStore):
        theirs = BucketCheckpointStore(
            store.location, SETTINGS, keep=3, config_digest="other", job="ns/other/u2", bucket=store.bucket
        )
        theirs.write(step, "fp32", {"w": torch.zeros(1)})
    else:
        CheckpointStore(store.root, keep=3, config_digest="other", job="ns/other/u2").write(step, "fp32", {})


@pytest.mark.parametrize("where", ["volume", "bucket"])
def test_a_sharded_save_at_another_jobs_checkpoint_is_checkpoint_taken_and_writes_nothing(
    tmp_path: Path, where: str
) -> None:
    """As a whole-model save: CheckpointTaken (at the last step a configuration error,
    session.interval), not a failed write every retry would meet again."""
    store: AnyStore = (
        BucketCheckpointStore(
            f"{SETTINGS.url}/ns/job/u1", SETTINGS, keep=3, config_digest="test", job="ns/job/u1", bucket=MemoryBucket()
        )
        if where == "bucket"
        else CheckpointStore(tmp_path, keep=3, config_digest="test", job="ns/job/u1")
    )
    _another_jobs(store, 5)
    writer = ShardedWriter(store)
    state = {SHARDS: {"model": nn.Linear(4, 4).state_dict()}, "step": 5}
    with pytest.raises(CheckpointTaken) as taken:
        writer.start(5, "bf16", state).finish()
    assert str(taken.value.where).endswith(f"step-{5:09d}")
    assert store.manifest(taken.value.where).job == "ns/other/u2"  # left as it is
    assert not list(store.root.glob(".tmp-*"))


# ---------------------------------------------------------------- another model's checkpoint
@pytest.mark.process
def test_a_sharded_run_whose_script_changed_its_model_ends_as_a_config_error(tmp_path: Path, meeting: Meeting) -> None:
    """Every rank says so (the same task.args: the config digest matches); the checkpoint stays."""
    ckpt = tmp_path / "ckpt"
    finish(start(meeting, tmp_path / "before", ckpt, job(5, "bf16"), nproc=2))
    proc = start(meeting, tmp_path / "after", ckpt, job(10, "bf16"), nproc=2, env={"SHARDED_SCRIPT_BLOCKS": "4"})
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == ExitCode.CONFIG_ERROR, out[-4000:]
    (written,) = (tmp_path / "after").glob("report-*.json")
    report = TerminationReport.model_validate_json(written.read_text())
    assert report.reason == "ConfigError" and "the script no longer matches" in report.message, report.message
    assert newest(ckpt) == 5 and not list(ckpt.glob(".corrupt-*"))


@pytest.mark.parametrize(
    ("now", "names"),
    [
        (nn.Linear(4, 8), "size mismatch"),
        (nn.Sequential(nn.Linear(4, 4)), "missing key"),
        (nn.Linear(4, 4, bias=False), "unexpected key in checkpoint state_dict: model.bias"),
    ],
)
def test_a_sharded_checkpoint_of_another_model_is_a_config_error_not_a_corrupt_one(
    tmp_path: Path, now: nn.Module, names: str
) -> None:
    """Its files verify: the script no longer matches the run that wrote it (as a single-file
    checkpoint whose state does not load, docs/sdk.md), never a reason to start at step 0."""
    store = CheckpointStore(tmp_path, keep=3, config_digest="test", job="ns/job/u1")
    pair = {"module": "model"}
    state = {SHARDS: state_dicts({"model": nn.Linear(4, 4)}, pair), "step": 5, SHARDED_OBJECTS: pair}
    ShardedWriter(store).start(5, "bf16", state).finish()

    def restore(loaded: resume.Loaded) -> None:
        restore_shards(Path(loaded[1][SHARDS]), {"model": now}, loaded[1][SHARDED_OBJECTS])

    with pytest.raises(ConfigError, match=r"step-000000005.* this run's model") as error:
        resume.load(store, restore=restore)
    assert names in str(error.value).lower()


# ---------------------------------------------------------------- two writers of one step
def test_two_sharded_writers_of_one_step_never_write_into_each_others_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An attempt's ranks still writing beside the next attempt's (one volume, the same step):
    neither may write into the folder the other commits; the step holds one writer's shards."""
    pair = {"module": "model"}

    def save(value: float) -> Callable[[], Any]:
        model = nn.Linear(4, 4)
        nn.init.constant_(model.weight, value)
        writer = ShardedWriter(CheckpointStore(tmp_path, keep=3, config_digest="test", job="ns/job/u1"))
        state = {SHARDS: state_dicts({"model": model}, pair), "step": 20, SHARDED_OBJECTS: pair}
        return writer.start(20, "bf16", state).finish

    second_save = save(2.0)
    race = Interleaving(second_save)  # it writes its shards while the first is about to hash its own
    monkeypatch.setattr(sharded_module, "hash_files", race.before(sharded_module.hash_files))
    ref = save(1.0)().ref
    race.finish()
    loaded = nn.Linear(4, 4)

    def restore(found: resume.Loaded) -> None:
        restore_shards(Path(found[1][SHARDS]), {"model": loaded}, found[1][SHARDED_OBJECTS])

    store = CheckpointStore(tmp_path, keep=3, config_digest="test", job="ns/job/u1")
    found = resume.load(store, restore=restore)
    assert found is not None and found[0].sha256 == ref.sha256
    assert torch.equal(loaded.weight, torch.ones(4, 4)), "the first writer's shards, whole"
    assert getattr(race.outcome[0], "ref", None) == ref, race.outcome  # kept, not overwritten
    assert not list(tmp_path.glob(".tmp-*"))


def _outcome(finish: Callable[[], Any]) -> Any:
    try:
        return finish()
    except Exception as exc:
        return exc

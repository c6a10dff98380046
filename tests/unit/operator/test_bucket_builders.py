"""An attempt whose checkpoints go to an S3 bucket: the launch names the job's folder in the
bucket, the credentials reach the trainer only by reference to the job's Secret, and the pod
mounts no Secret and no claim for them."""

from __future__ import annotations

import pytest

from mpjob.builders.attempt import attempt_job
from mpjob.planning.planner import StartAttempt
from mpjob_contract.api import MixedPrecisionJobSpec
from mpjob_contract.environment import SCRATCH_ENV
from mpjob_contract.launch import CHECKPOINT_MOUNT, AttemptLaunch

pytestmark = pytest.mark.unit

S3 = {"bucket": "ckpt", "prefix": "team/runs", "endpoint": "http://s3.storage:7070", "credentialsSecret": "ckpt-keys"}
FOLDER = "s3://ckpt/team/runs/ml/gpt/u-1"


def build(resume_from: str | None, **s3: object) -> dict:
    spec = MixedPrecisionJobSpec.model_validate(
        {"task": {"builtin": "gpt"}, "checkpoint": {"storage": {"s3": {**S3, **s3}}}}
    )
    start = StartAttempt(index=1, precision="bf16", resume_from=resume_from, start_step=200)
    return attempt_job(job="gpt", namespace="ml", uid="u-1", spec=spec, start=start, image="mpjob-trainer:0.1.0")


def _container(job: dict) -> dict:
    return dict(job["spec"]["template"]["spec"]["containers"][0])


def _env(job: dict) -> dict:
    return {e["name"]: e for e in _container(job)["env"]}


def test_the_launch_names_the_jobs_own_folder_in_the_bucket_and_resumes_only_from_it() -> None:
    launch = AttemptLaunch.model_validate_json(_env(build(f"{FOLDER}/step-000000200"))["MPJOB_LAUNCH"]["value"])
    assert (launch.checkpoint_dir, launch.resume_from) == (FOLDER, f"{FOLDER}/step-000000200")
    elsewhere = "s3://ckpt/team/runs/ml/other/u-2/step-000000200"
    launch = AttemptLaunch.model_validate_json(_env(build(elsewhere))["MPJOB_LAUNCH"]["value"])
    assert launch.resume_from is None


def test_credentials_reach_the_trainer_by_reference_to_the_secret_only() -> None:
    job = build(None)
    env = _env(job)
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        assert env[key] == {"name": key, "valueFrom": {"secretKeyRef": {"name": "ckpt-keys", "key": key}}}
    assert "ckpt-keys" not in str(job["spec"]["template"]["spec"]["volumes"])
    assert "AWS_ACCESS_KEY_ID" not in _env(build(None, credentialsSecret=None))  # workload identity


def test_an_s3_job_keeps_a_scratch_volume_and_no_claim() -> None:
    [volume] = [v for v in build(None)["spec"]["template"]["spec"]["volumes"] if v["name"] == "checkpoints"]
    assert volume == {"name": "checkpoints", "emptyDir": {}}


@pytest.mark.parametrize("secret", ["ckpt-keys", None])
def test_the_trainer_spools_on_the_pods_scratch_volume_not_its_container_layer(secret: str | None) -> None:
    job = build(None, credentialsSecret=secret)
    assert _env(job)[SCRATCH_ENV] == {"name": SCRATCH_ENV, "value": CHECKPOINT_MOUNT}
    assert {"name": "checkpoints", "mountPath": CHECKPOINT_MOUNT} in _container(job)["volumeMounts"]


def test_a_volume_job_spools_nothing() -> None:
    spec = MixedPrecisionJobSpec.model_validate({"task": {"builtin": "gpt"}})
    start = StartAttempt(index=0, precision="bf16", resume_from=None, start_step=0)
    job = attempt_job(job="gpt", namespace="ml", uid="u-1", spec=spec, start=start, image="mpjob-trainer:0.1.0")
    assert SCRATCH_ENV not in _env(job)

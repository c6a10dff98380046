"""A framework adapter's job resumes from a bucket (the test cluster's S3 server): the framework
reads its own checkpoint from a folder, which the bucket store's verify downloaded. Before, the
download was gone once verified and the framework was pointed at the checkpoint's `s3://` place:
every attempt after the first ended with a ConfigError ("holds no framework checkpoint")."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.unit.trainer.conftest import in_process_launch, spec
from tests.unit.trainer.test_adapters_arguments import Regression
from tests.unit.trainer.test_adapters_own_checkpoints import FALLBACK, JOB, _samples

pytestmark = pytest.mark.integration


def _hf_train(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, s3: dict[str, Any], precision: str) -> Any:
    """An attempt of the job (12 steps, checkpointed every 4) with its checkpoints in the bucket
    under the HF adapter; returns the Trainer."""
    from transformers import Trainer

    from mpjob_trainer import session as mpjob
    from mpjob_trainer.adapters import hf as mpjob_hf

    saves = {"everySteps": 4, "storage": {"s3": s3}}
    job = spec(task={"command": ["python", "train.py"]}, training=JOB, precision=FALLBACK, checkpoint=saves)
    launch = in_process_launch(tmp_path, monkeypatch, job, precision)
    bucket = f"s3://{s3['bucket']}/{s3['prefix']}/ns/t/u"
    run = mpjob.start(launch=launch.model_copy(update={"checkpoint_dir": bucket}))
    try:
        args = mpjob_hf.training_arguments(run, output_dir=str(tmp_path / "out"))
        trainer = Trainer(model=Regression(), args=args, train_dataset=_samples(64, 0))
        mpjob_hf.train(run, trainer)
    finally:
        run.close()
    return trainer


def _report(tmp_path: Path) -> dict[str, Any]:
    return dict(json.loads((tmp_path / "report.json").read_text()))


def _same_weights(a: Any, b: Any) -> bool:
    held = b.model.state_dict()
    return all(torch.equal(w, held[k]) for k, w in a.model.state_dict().items())


def test_an_hf_trainer_resumes_from_its_checkpoint_in_a_bucket(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, s3: dict[str, Any], creds: None, raw: Any
) -> None:
    """A retry that finds the last step checkpointed reads it and trains nothing; with the last
    checkpoint gone (a crash before its commit), the Trainer resumes from step 8's and trains on
    to the same weights as the straight run."""
    first = _hf_train(tmp_path, monkeypatch, s3, "fp32")
    done = _hf_train(tmp_path, monkeypatch, s3, "fp32")
    report = _report(tmp_path)
    assert (report["reason"], report["startStep"], report["step"]) == ("Succeeded", 12, 12), report
    assert _same_weights(first, done)
    raw.delete_object(Bucket=s3["bucket"], Key=f"{s3['prefix']}/ns/t/u/step-000000012/manifest.json")
    again = _hf_train(tmp_path, monkeypatch, s3, "fp32")
    report = _report(tmp_path)
    assert (report["reason"], report["startStep"], report["step"]) == ("Succeeded", 8, 12), report
    assert again.state.global_step == 12 and _same_weights(first, again)

"""The template's volumes and mounts beside the operator's own (mpjob_contract.pod_rules): what the
pod API would refuse only when the Job controller creates the pods is refused by `mpjob validate`
(and, with the same CEL, by `kubectl apply`), and what it takes is taken and built into a pod
whose every mount names one of its volumes."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from mpjob.builders.attempt import attempt_job
from mpjob.planning.planner import StartAttempt
from mpjob.validation import check_text
from mpjob_contract.api import MixedPrecisionJobSpec
from mpjob_contract.pod_volumes import CHECKPOINT_MOUNT
from tests.unit.operator.cases import DATA, bad, mounting

pytestmark = pytest.mark.unit

#: Templates the pod API takes beside the operator's volumes (`gpus` per worker, the template).
ACCEPTED: list[tuple[str, int, dict[str, Any]]] = [
    (
        "checkpoints-mounted-elsewhere-read-only",
        1,
        {"volumeMounts": [{"name": "checkpoints", "mountPath": "/c", "readOnly": True}]},
    ),
    ("dshm-in-a-gpu-pod", 1, {"volumeMounts": [{"name": "dshm", "mountPath": "/shm"}]}),
    (
        "below-the-checkpoint-mount",
        0,
        {"volumes": [DATA], "volumeMounts": [{"name": "data", "mountPath": f"{CHECKPOINT_MOUNT}/sub"}]},
    ),
    (
        "beside-the-checkpoint-mount",
        0,
        {"volumes": [DATA], "volumeMounts": [{"name": "data", "mountPath": f"{CHECKPOINT_MOUNT}.d"}]},
    ),
    (
        "own-dshm-in-a-cpu-pod",
        0,
        {"volumes": [{"name": "dshm", "emptyDir": {}}], "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}]},
    ),
    ("own-dev-shm-in-a-gpu-pod", 1, {"volumes": [DATA], "volumeMounts": [{"name": "data", "mountPath": "/dev/shm"}]}),
]


def _problems(manifest: dict[str, Any]) -> list[str]:
    """What `mpjob validate` says of `manifest`, each as `field: message`."""
    return [f"{problem.field}: {problem.message}" for problem in check_text(yaml.safe_dump(manifest))[1]]


def _pod(spec: MixedPrecisionJobSpec) -> dict[str, Any]:
    start = StartAttempt(index=0, precision="bf16", resume_from=None, start_step=0)
    job = attempt_job(job="gpt", namespace="ml", uid="u-1", spec=spec, start=start, image="mpjob-trainer:0.1.0")
    return job["spec"]["template"]["spec"]  # type: ignore[no-any-return]


@pytest.mark.parametrize(("gpus", "template"), [(g, t) for _, g, t in ACCEPTED], ids=[n for n, _, _ in ACCEPTED])
def test_a_template_the_pod_api_takes_validates_and_builds_a_pod_it_takes(gpus: int, template: dict) -> None:
    manifest = bad("spec", {"task": {"builtin": "gpt"}, "resources": {"gpusPerWorker": gpus}, "template": template})
    assert _problems(manifest) == []
    pod = _pod(MixedPrecisionJobSpec.model_validate(manifest["spec"]))
    names, mounts = [v["name"] for v in pod["volumes"]], pod["containers"][0]["volumeMounts"]
    assert len(set(names)) == len(names)  # the pod API: volume names are unique
    assert {m["name"] for m in mounts} <= set(names)  # ... and every mount names a volume
    assert len({m["mountPath"] for m in mounts}) == len(mounts)  # ... at its own path


def test_the_three_mistakes_are_refused_by_validate_naming_each_field() -> None:
    volumes = [{"name": "checkpoints", "emptyDir": {}}, DATA]
    mounts = [{"name": "nothere", "mountPath": "/x"}, {"name": "data", "mountPath": CHECKPOINT_MOUNT}]
    found = _problems(bad("spec.template", {"volumes": volumes, "volumeMounts": mounts}))
    assert [p.split(":")[0] for p in found] == [
        "spec.template.volumes[0].name",
        "spec.template.volumeMounts[1].mountPath",
    ]
    assert "must not be checkpoints" in found[0] and f"must not be {CHECKPOINT_MOUNT}" in found[1]
    # The template's own mistakes put right, the mount of no volume is named too.
    found = _problems(bad("spec.template", {"volumes": [DATA], "volumeMounts": mounts[:1]}))
    assert [p.split(":")[0] for p in found] == ["spec.template.volumeMounts[0]"]
    assert "must name a volume of the pod" in found[0]


@pytest.mark.parametrize(
    ("mount", "gpus"),
    [({"name": "dshm", "mountPath": "/shm"}, 0), ({"name": "Data", "mountPath": "/x"}, 1)],
    ids=["dshm-in-a-cpu-pod", "a-name-unlike-a-volumes"],
)
def test_a_mount_of_a_volume_the_pod_lacks_is_refused(mount: dict, gpus: int) -> None:
    found = _problems(mounting({"name": "data", "mountPath": "/data"}, mount, gpus=gpus))
    assert len(found) == 1 and found[0].startswith("spec.template.volumeMounts[1]: "), found

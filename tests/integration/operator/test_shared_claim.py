"""Two jobs on one checkpoint claim, on the real control plane with the real trainer: each keeps
its checkpoints in its own folder of the volume (`<namespace>/<name>/<uid>`) and prunes only
those, so the one ahead never costs the other its checkpoints. The newer one's fp16 fault falls
back to bf16 from ITS OWN last good checkpoint, and its status records the step its trainer
really resumed from."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.helpers import wait_for
from tests.integration.operator.conftest import UNTIL_STOPPED, Jobs, Operator, gpt_spec, pod_events
from tests.integration.operator.test_attempts import OVERFLOW

pytestmark = pytest.mark.integration


def steps_in(folder: Path) -> list[int]:
    return sorted(int(p.parent.name.split("-")[1]) for p in folder.glob("step-*/manifest.json"))


def test_two_jobs_on_one_claim_keep_their_own_checkpoints_and_resume_from_them(
    operator: Operator, jobs: Jobs, namespace: str, kubeconfig: str
) -> None:
    jobs.pvc("ckpt")
    older = gpt_spec("ckpt", steps=60, every=10)
    older["precision"] = {"mode": "bf16"}
    older["checkpoint"]["keep"] = 2
    jobs.create("older", older)
    older_folder = jobs.checkpoints(kubeconfig, "ckpt", "older")
    wait_for(lambda: steps_in(older_folder) and max(steps_in(older_folder)) >= 30, 180, message="older ahead")

    newer = gpt_spec("ckpt", steps=60, every=10)  # fp16, overflows at step 25
    newer["task"]["args"] = OVERFLOW
    newer["precision"]["inPlace"] = False  # a new pod that finds its checkpoint on the shared claim
    newer["checkpoint"]["keep"] = 2
    jobs.create("newer", newer)
    done = {name: jobs.wait_phase(name, ("Succeeded", "Failed"), 300) for name in ("older", "newer")}

    status = done["older"]
    assert (status["phase"], status["lastCheckpoint"]["step"]) == ("Succeeded", 60), status
    assert status["lastCheckpoint"]["path"].endswith(f"/{namespace}/older/{older_folder.name}/step-000000060")
    assert steps_in(older_folder) == [50, 60]  # keep 2, its own
    manifest = json.loads((older_folder / "step-000000060" / "manifest.json").read_text())
    assert manifest["files"]["state.pt"]["sha256"] == status["lastCheckpoint"]["sha256"]
    assert manifest["job"] == f"{namespace}/older/{older_folder.name}"

    status = done["newer"]
    assert status["phase"] == "Succeeded", status
    first, second = status["attempts"]
    assert (first["precision"], first["reason"]) == ("fp16", "NumericFault")
    assert (second["precision"], second["reason"]) == ("bf16", "Succeeded")
    (resumed,) = [e for e in pod_events(kubeconfig, namespace, "newer-a1") if e["event"] == "resume"]
    newer_folder = jobs.checkpoints(kubeconfig, "ckpt", "newer")
    own = (namespace, "newer", newer_folder.name)
    assert Path(resumed["path"]).parts[-4:] == (*own, "step-000000020")  # its own, not the older job's
    assert Path(status["lastCheckpoint"]["path"]).parts[-4:] == (*own, "step-000000060")
    assert resumed["step"] == second["startStep"] == 20  # where its trainer really began
    assert not [e for e in pod_events(kubeconfig, namespace, "newer-a1") if e["event"] == "freshStart"]
    # keep 2 of its own, and the fp16 attempt's newest it went on from (no prune deletes another Job's newest)
    assert status["lastCheckpoint"]["step"] == 60 and steps_in(newer_folder) == [20, 50, 60]

    claim = Path(kubeconfig).parent / "volumes" / namespace / "ckpt"
    assert not list(claim.rglob(".corrupt-*"))  # nobody moved anybody's checkpoint aside
    assert not list(claim.glob("step-*"))  # and nothing lies at the volume's root


def test_a_resume_that_finds_no_checkpoint_records_the_fresh_start_not_the_plan(
    operator: Operator, jobs: Jobs, namespace: str, kubeconfig: str
) -> None:
    jobs.pvc("ckpt")
    spec = gpt_spec("ckpt", steps=UNTIL_STOPPED, every=10)
    spec["precision"] = {"mode": "bf16"}
    jobs.create("emptied", spec)
    folder = jobs.checkpoints(kubeconfig, "ckpt", "emptied")
    wait_for(lambda: jobs.status("emptied").get("lastCheckpoint"), 180, message="a checkpoint in the status")
    jobs.patch_spec("emptied", {"runPolicy": {"suspend": True}})
    jobs.wait_phase("emptied", "Suspended", 60)
    pods = jobs.core.list_namespaced_pod
    wait_for(lambda: not pods(namespace, label_selector="mpjob.dev/job=emptied").items, 60, message="pod gone")
    planned = jobs.status("emptied")["lastCheckpoint"]["step"]
    assert planned >= 10
    for checkpoint in folder.glob("step-*"):  # the user empties the job's folder meanwhile
        shutil.rmtree(checkpoint)
    jobs.patch_spec("emptied", {"runPolicy": {"suspend": False}, "training": {"steps": 15}})
    status = jobs.wait_phase("emptied", ("Succeeded", "Failed"), 240)
    assert status["phase"] == "Succeeded", status
    first, second = status["attempts"]
    assert first["reason"] == "Suspended"
    events = pod_events(kubeconfig, namespace, "emptied-a1")
    assert [e for e in events if e["event"] == "freshStart"] and not [e for e in events if e["event"] == "resume"]
    assert second["startStep"] == 0  # where its trainer began, not the planned checkpoint step
    assert status["step"] == 15
